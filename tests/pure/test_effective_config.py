"""The plan sizes the effective configuration (plan/effective.py): --set over the inventory, what SGLang
resolves for a flag left unset, one object sized, printed and rendered. One example per way it broke."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.apply import asked_of, with_set_flags
from agent.cli.main import main
from agent.errors import UsageError
from agent.inventory import load_service
from agent.orchestrate.asked import Change
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.effective import MIN_CONTEXT, context_refusal, effective
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_for_host, plan_from_facts
from agent.plan.predict import pool_model
from agent.plan.requests import sglang_requests
from agent.render import render_unit, template_dir
from agent.report import render_plan
from agent.sglang.flags import parse_unit_flags

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0"}
H200 = {"name": "NVIDIA H200", "memory_total_mib": 143771, "compute_capability": "9.0"}


def facts(model: str, card: dict[str, Any], n: int, weights_gb: float, **flags: Any) -> dict[str, Any]:
    config = json.loads((MODELS / model / "config.json").read_text())
    return {
        "format": "deployctl-facts/1", "gpus": [card] * n, "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": int(weights_gb * 1e9)},
        "flags": {k.replace("_", "-"): v for k, v in flags.items()},
    }  # fmt: skip


def run(*argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(list(argv), out=out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def ct200() -> Any:
    return load_service("ct200", ROOT / "units")


# Item 2: a running fraction just above the ceiling is planned at the highest safe one, not the lowest.
@pytest.mark.parametrize(
    ("doc", "at_least"),
    [
        (facts("llama-3.1-70b", H100, 4, 141, tp_size=4, mem_fraction_static=0.9), 400_000),
        (facts("qwen3-235b-a22b", H200, 8, 470, tp_size=8), 1_000_000),  # SGLang's default fraction
    ],
    ids=["llama70b-4xh100-0.900", "qwen3-235b-8xh200-default"],
)
def test_a_fraction_above_the_ceiling_keeps_the_highest_safe_pool(doc: dict[str, Any], at_least: int) -> None:
    inp = parse_facts(doc, name="x")
    plan = plan_from_facts(inp, Target(32768))
    top = pool_model(inp, 32768).pool.max_fraction(plan.max_running_requests, 32768, plan.reserve_floor_gib)
    assert plan.feasible and plan.mem_fraction_static == top
    assert plan.predicted_pool_tokens >= at_least
    assert plan.shrinks and "SHRINKS the pool from" in render_plan("x", plan).splitlines()[0]


# Item 3: --set tp-size=4 restates the weights per GPU at TP 4: 70.48 GiB at TP 8 is 140.96 GiB.
def test_set_tp_rescales_the_inventory_weights() -> None:
    host = ct200()
    assert effective(host, (("tp-size", "4"),)).host.model.weights_gib_per_gpu == pytest.approx(2 * 70.48)
    host, _ = with_set_flags(host, Change(200_000, flags=(("tp-size", "4"),)), {})
    plan = plan_for_host(host, Target(200_000), None, host.sglang.flags)
    assert not plan.feasible and "weights do not fit" in (plan.binding or "")


# Item 4: an unset --max-running-requests is sized as SGLang resolves it (>= 2,048 rows of req_to_token).
def test_an_unset_request_cap_is_sized_as_sglang_resolves_it() -> None:
    config = json.loads((MODELS / "qwen2.5-7b" / "config.json").read_text())
    doc = facts("qwen2.5-7b", H100, 1, 15.2, context_length=1_010_000)
    doc["model"]["config"] = {**config, "max_position_embeddings": 1_010_000}
    inp = parse_facts(doc, name="x")
    plan = plan_from_facts(inp, Target(1_010_000))
    model = pool_model(inp, 1_010_000).pool
    resolved = sglang_requests(model, plan.mem_fraction_static, 1_010_000)
    assert resolved >= 2048
    if "max-running-requests" not in plan.flags():  # left to SGLang: the reserve is SGLang's table's
        assert plan.max_running_requests == resolved
    reserve = model.reserve_gib(plan.mem_fraction_static, plan.max_running_requests, 1_010_000)
    assert reserve >= plan.reserve_floor_gib and plan.reserve_gib_per_gpu == pytest.approx(reserve)


# Item 5: a context implausibly small, or a slip far below the one served now, is refused in one line
# (exit 2); a smaller shrink is planned and said.
def test_a_forgotten_k_is_refused() -> None:
    assert context_refusal(128, 32768, shrink=False) and context_refusal(128, None, shrink=True)
    assert context_refusal(4_000, 32768, shrink=False)
    assert context_refusal(4_000, 32768, shrink=True) is None
    assert context_refusal(16_000, 32768, shrink=False) is None
    assert context_refusal(MIN_CONTEXT, None, shrink=False) is None
    assert "forgotten k" in str(context_refusal(1_000, 1_048_576, shrink=False))  # 1,000 meant 1M
    assert "forgotten k" not in str(context_refusal(4_000, 32768, shrink=False))  # 4M: no slip of a k
    units = str(ROOT / "units")
    code, stdout, stderr = run("--units", units, "plan", "ct200", "--context", "128", "--offline")
    assert code == 2 and stdout == "" and "128k" in stderr.splitlines()[0]
    code, _, stderr = run("--units", units, "plan", "ct200", "--context", "4k", "--offline")
    assert code == 2 and "--shrink-context" in stderr
    code, _, _ = run("--units", units, "plan", "ct200", "--context", "4k", "--offline", "--shrink-context")
    assert code == 0
    code, stdout, _ = run("--units", units, "plan", "ct200", "--context", "16k", "--offline")
    assert code == 0 and "warning: the served context shrinks from 32,768 to 16,000 tokens" in stdout


# Item 6: plan --json prints the --set flags it sized among its flags.
def test_plan_json_prints_the_set_flags() -> None:
    code, stdout, _ = run(
        "--units", str(ROOT / "units"), "plan", "ct200", "--context", "200k", "--offline", "--json",
        "--set", "kv-cache-dtype=fp8_e4m3",
    )  # fmt: skip
    assert code == 0 and json.loads(stdout)["flags"]["kv-cache-dtype"] == "fp8_e4m3"
    plan = plan_from_facts(
        parse_facts(facts("llama-3.1-8b", H100, 1, 16), name="x"),
        asked_of(Change(32768, flags=(("kv-cache-dtype", "fp8_e4m3"),))),
    )
    assert plan.flags()["kv-cache-dtype"] == "fp8_e4m3"


# Item 10: a negative pool cap is refused; the full-context concurrency is bounded by the cap.
def test_a_negative_pool_cap_is_refused() -> None:
    with pytest.raises(UsageError, match="max-total-tokens"):
        plan_from_facts(parse_facts(facts("llama-3.1-8b", H100, 1, 16, max_total_tokens=-5), name="x"),
                        Target(32768))  # fmt: skip
    code, _, stderr = run(
        "--units", str(ROOT / "units"), "plan", "ct200", "--context", "32768", "--offline",
        "--set", "max-total-tokens=-5",
    )  # fmt: skip
    assert code == 2 and "max-total-tokens" in stderr


def test_full_context_concurrency_is_bounded_by_the_cap() -> None:
    inp = parse_facts(facts("llama-3.1-8b", H100, 1, 16, max_running_requests=4), name="x")
    plan = plan_from_facts(inp, Target(8192))
    assert plan.predicted_pool_tokens // 8192 > 4 and plan.concurrency_at_full_context == 4


def test_a_secret_set_flag_is_sized_and_rendered_but_never_printed() -> None:
    for extra in ((), ("--json",)):
        code, stdout, _ = run(
            "--units", str(ROOT / "units"), "plan", "ct200", "--context", "200k", "--offline",
            "--set", "api-key=hunter2", *extra,
        )  # fmt: skip
        shown = "--api-key '***'" in stdout or '"api-key": "***"' in stdout  # quoted: a shell globs ***
        assert code == 0 and "hunter2" not in stdout and shown
    plan = plan_from_facts(
        parse_facts(facts("llama-3.1-8b", H100, 1, 16), name="x"),
        asked_of(Change(32768, flags=(("api-key", "hunter2"),))),
    )
    assert plan.flags()["api-key"] == "hunter2"  # what apply renders


# The root: the running unit's flags the inventory does not have are what its starts ran under, not the
# unit apply renders; the plan sizes the rendered one (an fp8 KV cache set by hand on the host is dropped by
# the render, so the plan must not promise its pool).
def test_a_flag_only_the_running_unit_has_is_evidence_not_the_plan() -> None:
    host = ct200()
    same = plan_for_host(host, Target(200_000), None, host.sglang.flags)
    drifted = plan_for_host(host, Target(200_000), None, {**host.sglang.flags, "kv-cache-dtype": "fp8_e4m3"})
    assert (
        drifted.cell_bytes == same.cell_bytes and drifted.predicted_pool_tokens == same.predicted_pool_tokens
    )
    text = render_unit(host, drifted.flags(), template_dir())
    assert "kv-cache-dtype" not in dict(parse_unit_flags(text))
