"""The planner's pool against SGLang 0.5.23's own sizing code, at the same memory figures.

tests/data/oracle/planner-cases.json (and the oracle branch's tests/data/oracle/cases.json when present)
hold, per case, a real config (tests/data/models/<model>/config.json), the flags, the environment, a draft
config, the GPU figures (free memory before and after the weights) that SGLang's own code was run with on
the CPU, and the pool it gave. The planner is given the same figures, as a start that logged its memory
lines, and must agree within 0.5 %; where SGLang refuses to start, the planner refuses too.

Every case runs: what SGLang reads off the built model, the harness gives from SGLang's own code (a PP
stage's layers from get_pp_indices, each stage sized and the minimum taken; the checkpoint's quant config,
which decides an FP8 KV cache under --kv-cache-dtype auto).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.errors import UsageError
from agent.plan.facts import Gpu, ModelInput, PlanInput
from agent.plan.predict import pool_model
from agent.sglang.kvlayout import read_layout

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = [DATA / "oracle" / "planner-cases.json", DATA / "oracle" / "cases.json"]
TOLERANCE = 0.005


def _load() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for path in FIXTURES:
        if path.is_file():
            doc = json.loads(path.read_text())
            out += [(case, doc.get("drafts") or {}) for case in doc["cases"]]
    return out


CASES = _load()


def flags_of(flags: Any) -> dict[str, Any]:
    if isinstance(flags, dict):
        return dict(flags)
    parsed: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        name = flags[i].removeprefix("--")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            parsed[name], i = flags[i + 1], i + 2
        else:
            parsed[name], i = True, i + 1
    return parsed


def config_of(model: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "models" / model / "config.json").read_text())
    return data


def plan_input(case: dict[str, Any], drafts: dict[str, Any]) -> PlanInput:
    gpu = case["gpu"]
    draft = None
    if case.get("draft"):
        path = DATA.parent / "sim/sglang/data" / f"{case['draft']}.json"
        config = drafts.get(case["draft"]) or json.loads(path.read_text())
        draft = ModelInput(config, None)
    major, minor = gpu["capability"]
    card = Gpu(gpu["name"], gpu["total_gib"] * 1024, (int(major), int(minor)))
    figures = {"avail_mem_before_weights_gb": gpu["pre_gib"], "avail_mem_before_pool_gb": gpu["post_gib"]}
    return PlanInput(
        name=f"{case['model']}/{case['case']}",
        gpus=(card,) * gpu["count"],
        sglang_version="0.5.23",
        model=ModelInput(config_of(case["model"]), None),
        draft=draft,
        flags=flags_of(case["flags"]),
        env=case.get("env") or {},
        starts=(figures,),
    )


def set_aside(case: dict[str, Any], inp: PlanInput) -> str | None:
    """Why the harness could not build this case (none now: every case runs); kept for the report."""
    return None


def test_the_comparison_covers_every_family() -> None:
    models = {case["model"] for case, _ in CASES if case["answer"].get("ok")}
    assert len(models) >= 20
    families = {read_layout(config_of(m)).family for m in models}
    assert families >= {"mha", "mla", "dsa", "swa", "linear"}


@pytest.mark.parametrize(("case", "drafts"), CASES, ids=[f"{c['model']}-{c['case']}" for c, _ in CASES])
def test_planner_pool_equals_sglangs_own(case: dict[str, Any], drafts: dict[str, Any]) -> None:
    inp = plan_input(case, drafts)
    answer = case["answer"]
    why = set_aside(case, inp)
    if why:
        pytest.skip(why)
    context = int(inp.flags.get("context-length") or 32768)
    try:
        facts = pool_model(inp, context)
    except UsageError as exc:  # never a guess: refused by name, in one line
        assert "\n" not in exc.message
        if answer.get("ok"):
            assert exc.message.startswith("cannot plan this model: "), exc.message
            pytest.skip(exc.message)
        return  # SGLang refuses this start too
    assert answer.get("ok"), f"SGLang refuses this start ({answer.get('message')}); the planner did not"
    # Without the flag, the planner's own reading of SGLang's default fraction is under test too.
    fraction = float(inp.flags.get("mem-fraction-static") or facts.fraction)
    expected = int(answer["max_total_num_tokens"])
    got = facts.pool.pool(fraction)
    assert abs(got - expected) <= TOLERANCE * expected, (got, expected, answer)
