"""The rule (docs/planning.md, plan/verdict.py) over a generated corpus of plans: every model config in
tests/data x common cards x TP x contexts x fractions and flags x calibrated or cold, planned by the pure
functions (no CLI). Deterministic: the same corpus on every run."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.cli.commands.plan import NOT_FEASIBLE, verdict
from agent.errors import UsageError
from agent.plan.choose import Plan, Target
from agent.plan.facts import PlanInput, parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.predict import pool_model

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
# The checkpoints' tensor bytes, rounded (their Hugging Face repositories' file sizes).
WEIGHTS_GB = {
    "deepseek-v3": 690, "deepseek-v3.2": 690, "gemma-4-26b-a4b": 52, "glm-5-nvfp4": 440, "gpt-oss-20b": 13,
    "kimi-k2-instruct": 1030, "kimi-k2.5": 595, "kimi-k2.6-nvfp4": 590, "llama-3.1-70b": 141,
    "llama-3.1-8b": 16, "llama-3.2-3b": 6.4, "mixtral-8x7b": 93, "nemotron-3-nano-30b-a3b": 63,
    "qwen2.5-14b": 29.5, "qwen2.5-32b": 65.5, "qwen2.5-3b": 6.2, "qwen2.5-7b": 15.2, "qwen3-14b": 29.5,
    "qwen3-235b-a22b": 470, "qwen3-30b-a3b": 61, "qwen3-32b": 65.5, "qwen3-4b": 8, "qwen3-8b": 16.4,
    "qwen3-vl-8b-instruct": 17.5, "qwen3.5-27b": 54,
}  # fmt: skip
CARDS = (
    {"name": "NVIDIA GeForce RTX 4090", "memory_total_mib": 24564, "compute_capability": "8.9"},
    {"name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960, "compute_capability": "8.0"},
    {"name": "NVIDIA L40S", "memory_total_mib": 46068, "compute_capability": "8.9"},
    {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0"},
    {"name": "NVIDIA H200", "memory_total_mib": 143771, "compute_capability": "9.0"},
    {"name": "NVIDIA B200", "memory_total_mib": 183359, "compute_capability": "10.0"},
    {"name": "AMD Instinct MI300X", "memory_total_mib": 196592},
)
TPS = (1, 2, 4, 8)
CONTEXTS = (8192, 32768, 131072)
FRACTIONS = (None, 0.8, 0.93)
FLAGS: tuple[dict[str, Any], ...] = ({}, {"kv-cache-dtype": "fp8_e4m3"})
HOLDS = re.compile(r"holds (?:at least )?([\d,]+) tokens.*? of the ([\d,]+) needed")
GRID = [round(0.5 + 0.05 * i, 3) for i in range(10)]


@dataclass(frozen=True)
class Case:
    model: str
    card: int
    tp: int
    context: int
    fraction: float | None
    flags: int
    calibrated: bool


def corpus() -> Iterator[Case]:
    axes = (sorted(WEIGHTS_GB), range(len(CARDS)), TPS, CONTEXTS, FRACTIONS, range(len(FLAGS)), (False, True))
    for i, combo in enumerate(itertools.product(*axes)):
        if (i // 2 + i) % 2 == 0:  # half the grid: of each cold/calibrated pair, one, alternating
            yield Case(*combo)


def facts_of(case: Case) -> dict[str, Any]:
    config = json.loads((MODELS / case.model / "config.json").read_text())
    return {
        "format": "deployctl-facts/1", "gpus": [CARDS[case.card]] * case.tp, "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": int(WEIGHTS_GB[case.model] * 1e9)},
        "flags": {"tp-size": case.tp, **FLAGS[case.flags]},
    }  # fmt: skip


def with_start(inp: PlanInput, context: int) -> PlanInput | None:
    """The input with a start at 0.85 on a host 0.3 GiB below the cold estimate (2-decimal logs)."""
    cold = pool_model(inp, context).pool
    true = replace(cold, pre_gib=round(cold.pre_gib - 0.3, 2), post_gib=round(cold.post_gib - 0.3, 2))
    true = replace(true, margin_gib=0.0)
    tokens = true.pool(0.85)
    if true.post_gib <= 0 or tokens <= 0:
        return None
    start = {
        "avail_mem_before_weights_gb": true.pre_gib, "avail_mem_before_pool_gb": true.post_gib,
        "kv_tokens": tokens, "mem_fraction_static": 0.85, "max_running_requests": 64, "context_len": 8192,
        "available_gpu_mem_gb": round(true.pre_gib * 0.15 - 1.0, 2),
    }  # fmt: skip
    return replace(inp, starts=(start,))  # type: ignore[arg-type]


def three_decimals(value: object) -> bool:
    return value is None or (isinstance(value, float) and round(value, 3) == value)


def check(plan: Plan, inp: PlanInput, case: Case) -> None:
    where = f"{case}: {plan.binding}"
    assert (verdict(plan) == 0) == plan.feasible and verdict(plan) in (0, NOT_FEASIBLE), where
    assert three_decimals(plan.mem_fraction_static) and three_decimals(plan.forced_fraction), where
    assert three_decimals(plan.flags()["mem-fraction-static"]), where
    # the floor the plan prints (one decimal) is the one it compares, and the notes say where it came from
    assert round(plan.reserve_floor_gib, 1) == plan.reserve_floor_gib > 0, where
    assert any(n.startswith(f"the memory floor is {plan.reserve_floor_gib:.1f} GiB") for n in plan.notes), (
        where
    )
    if plan.feasible:
        assert plan.predicted_pool_low_tokens >= plan.target_pool_tokens, where
        assert plan.reserve_gib_per_gpu >= plan.reserve_floor_gib and not plan.refusals, where
    elif not plan.refusals:
        short = plan.predicted_pool_low_tokens < plan.target_pool_tokens
        assert plan.binding and (short or plan.reserve_gib_per_gpu < plan.reserve_floor_gib), where
        for held, needed in HOLDS.findall(plan.binding):  # the numbers named are the ones that bind
            assert int(held.replace(",", "")) < int(needed.replace(",", "")), where
    for alt in plan.alternatives:
        assert three_decimals(alt.mem_fraction_static), where
        replanned = again(inp, case, alt.flags, alt.mem_fraction_static)
        if alt.reaches_target or "context-length" in alt.flags:
            assert replanned is None or replanned.feasible, f"{where}: {alt.change} claims the target"


def again(inp: PlanInput, case: Case, flags: dict[str, Any], fraction: float | None) -> Plan | None:
    """The plan with an alternative's flags; None for more GPUs (another host: more cards to plan on)."""
    if "tp-size" in flags:
        return None
    new = {k: v for k, v in flags.items() if k != "mem-fraction-static" and k != "max-running-requests"}
    context = int(flags.get("context-length", case.context))
    requests = flags.get("max-running-requests")
    asked = Target(context, fraction, None if requests is None else int(requests))
    return plan_from_facts(replace(inp, flags={**inp.flags, **new}), asked)


def test_the_rule_holds_over_the_corpus() -> None:
    planned = refused = calibrated = 0
    for case in corpus():
        inp = parse_facts(facts_of(case), name=case.model)
        try:
            if case.calibrated:
                found = with_start(inp, case.context)
                if found is None:
                    continue
                inp, calibrated = found, calibrated + 1
            plan = plan_from_facts(inp, Target(case.context, case.fraction))
        except UsageError:  # a one-line refusal (a kind not followed, weights that cannot fit...)
            refused += 1
            continue
        check(plan, inp, case)
        model = pool_model(inp, case.context).pool
        for low, high in itertools.pairwise(GRID):
            assert model.pool(low) <= model.pool(high) and model.pool_low(low) <= model.pool_low(high), case
        planned += 1
    print(f"corpus: {planned} plans ({calibrated} calibrated), {refused} refused in one line")
    assert planned >= 10_000
