"""The planner's pool against SGLang 0.5.23's own sizing code (the oracle's recorded answers).

tests/data/oracle/cases.json holds, per case, the config (tests/data/models/<model>/config.json), the
flags, the environment and the GPU figures (free memory before and after the weights) that SGLang's own
code sized, and the pool it gave. The planner is given the same memory figures, as a start that logged
its memory lines, and must agree within 0.5 %, or refuse the kind in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.errors import UsageError
from agent.plan.facts import Gpu, ModelInput, PlanInput
from agent.plan.from_facts import pool_model

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURE = DATA / "oracle" / "cases.json"
DRAFTS = {"seed-dflash-draft": Path(__file__).resolve().parents[1] / "sim/sglang/data/seed-dflash-draft.json"}
TOLERANCE = 0.005


def cases() -> list[dict[str, Any]]:
    if not FIXTURE.is_file():
        return []
    return [c for c in json.loads(FIXTURE.read_text())["cases"] if c["answer"].get("ok")]


def flags_of(argv: list[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        name = argv[i].removeprefix("--")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name], i = argv[i + 1], i + 2
        else:
            flags[name], i = True, i + 1
    return flags


def plan_input(case: dict[str, Any]) -> PlanInput:
    gpu = case["gpu"]
    config = json.loads((DATA / "models" / case["model"] / "config.json").read_text())
    draft = None
    if case.get("draft"):
        draft = ModelInput(json.loads(DRAFTS[case["draft"]].read_text()), None)
    card = Gpu(gpu["name"], gpu["total_gib"] * 1024, tuple(gpu["capability"]))  # type: ignore[arg-type]
    figures = {"avail_mem_before_weights_gb": gpu["pre_gib"], "avail_mem_before_pool_gb": gpu["post_gib"]}
    return PlanInput(
        name=f"{case['model']}/{case['case']}",
        gpus=(card,) * gpu["count"],
        sglang_version="0.5.23",
        model=ModelInput(config, None),
        draft=draft,
        flags=flags_of(case["flags"]),
        env=case.get("env") or {},
        starts=(figures,),
    )


@pytest.mark.skipif(not cases(), reason="no oracle fixture (tests/data/oracle/cases.json) in this checkout")
@pytest.mark.parametrize("case", cases(), ids=lambda c: f"{c['model']}-{c['case']}")
def test_planner_pool_equals_sglangs_own(case: dict[str, Any]) -> None:
    inp = plan_input(case)
    fraction = float(inp.flags["mem-fraction-static"])
    context = int(inp.flags.get("context-length") or 32768)
    try:
        model = pool_model(inp, context).pool
    except UsageError as exc:  # a kind deployctl does not follow: refused by name, never guessed
        assert exc.message.startswith("cannot plan this model: ") and "\n" not in exc.message
        pytest.skip(exc.message)
    expected = int(case["answer"]["max_total_num_tokens"])
    got = model.pool(fraction)
    assert abs(got - expected) <= TOLERANCE * expected, (got, expected, case["answer"])
