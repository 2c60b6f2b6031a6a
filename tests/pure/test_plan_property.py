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

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from agent.apply import allow_context, asked_of, with_set_flags
from agent.cli.commands.plan import NOT_FEASIBLE, verdict
from agent.errors import RenderError, UsageError
from agent.inventory import HostConfig, load_service
from agent.orchestrate.asked import Change
from agent.plan.choose import Plan, Target
from agent.plan.facts import PlanInput, parse_facts
from agent.plan.from_facts import plan_for_host, plan_from_facts
from agent.plan.from_inventory import plan_input_from_inventory
from agent.plan.model import SPEC_DEFAULT_REQUESTS
from agent.plan.predict import pool_model
from agent.render import render_unit, template_dir
from agent.report import render_plan
from agent.sglang.flags import parse_unit_flags

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


# The effective configuration (plan/effective.py), over generated inputs: a running unit's fraction anywhere
# in [0.3, 0.99], --set of each flag the planner reads, the request cap left to SGLang or not.
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROP_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "qwen3-30b-a3b", "deepseek-v3", "qwen2.5-7b")
PROP_CARDS = (1, 2, 3, 4)  # A100-40, L40S, H100, H200 (CARDS above)
# The inventory's own keys the unit writes besides the flags it sizes: the model, its name, where it listens.
IDENTITY = {"model-path", "served-model-name", "host", "port", "speculative-draft-model-path"}


@st.composite
def set_flags(draw: st.DrawFn, gpus: int) -> dict[str, Any]:
    """--set of the flags the planner reads, each present or left alone (left to SGLang)."""
    tp = draw(st.sampled_from([t for t in TPS if t <= gpus]))
    chosen: dict[str, Any] = {
        "tp-size": tp,
        "pp-size": draw(st.sampled_from([p for p in (1, 2) if tp * p <= gpus])),
        "page-size": draw(st.sampled_from((1, 16, 64))),
        "kv-cache-dtype": draw(st.sampled_from(("auto", "fp8_e4m3", "bf16"))),
        "chunked-prefill-size": draw(st.sampled_from((2048, 4096, 8192, 16384))),
        "max-running-requests": draw(st.integers(1, 1024)),
        "max-total-tokens": draw(st.integers(4096, 2_000_000)),
        "speculative-algorithm": "NGRAM",  # a draft without a draft model: the planner reads it
    }
    keep = draw(st.lists(st.sampled_from(sorted(chosen)), unique=True))
    return {k: chosen[k] for k in keep}


@st.composite
def running_units(draw: st.DrawFn) -> tuple[PlanInput, int, dict[str, Any]]:
    """A facts input of a running unit at a fraction in [0.3, 0.99], a target, and --set flags."""
    model = draw(st.sampled_from(PROP_MODELS))
    card, gpus = draw(st.sampled_from(PROP_CARDS)), draw(st.sampled_from((1, 2, 4, 8)))
    fraction = round(draw(st.one_of(st.floats(0.3, 0.99), st.floats(0.85, 0.99))), 3)  # the ceiling's side
    case = Case(model, card, gpus, 8192, None, 0, False)
    doc = facts_of(case)
    doc["flags"] = {"mem-fraction-static": fraction}
    context = draw(st.sampled_from((4096, 8192, 32768, 131072)))
    return parse_facts(doc, name=model), context, draw(set_flags(gpus))


def planned(inp: PlanInput, context: int, given: dict[str, Any], fraction: float | None = None) -> Plan:
    """The plan as `deployctl plan --facts --set` makes it; a one-line refusal is no example."""
    change = Change(context, fraction, flags=tuple((k, str(v)) for k, v in given.items()))
    asked = asked_of(change)
    try:
        return plan_from_facts(replace(inp, flags={**inp.flags, **given}), asked)
    except UsageError:
        assume(False)
        raise


@given(running_units())
@PROPERTY
def test_a_plan_never_shrinks_a_pool_that_holds_the_target_silently(
    unit: tuple[PlanInput, int, dict[str, Any]],
) -> None:
    inp, context, given_flags = unit
    given_flags.pop("max-total-tokens", None)  # a pinned pool is the same at every fraction: nothing shrinks
    plan = planned(inp, context, given_flags)
    sized = replace(inp, flags={**inp.flags, **given_flags})
    model = pool_model(sized, context).pool
    running = float(inp.flags["mem-fraction-static"])
    held = model.pool_low(running) >= plan.target_pool_tokens
    if held and plan.predicted_pool_tokens < model.pool(running):
        event("the plan shrinks a pool that held the target")
        assert plan.shrinks and "SHRINKS" in render_plan("h", plan).splitlines()[0], (given_flags, running)
    # the --set flags sized are the flags printed (plan --json) and handed to the render
    printed = plan.to_dict()["flags"]
    assert isinstance(printed, dict)
    for name, value in given_flags.items():
        if name not in ("mem-fraction-static", "max-running-requests"):
            assert str(printed[name]) == str(value), name
    assert plan.concurrency_at_full_context <= plan.max_running_requests


@given(running_units(), st.floats(0.3, 0.98), st.floats(0.001, 0.05))
@PROPERTY
def test_raising_the_fraction_never_lowers_the_pool(
    unit: tuple[PlanInput, int, dict[str, Any]], low: float, step: float
) -> None:
    inp, context, given_flags = unit
    given_flags.pop("max-running-requests", None)  # the fraction asked is the one varied
    a, b = round(low, 3), round(min(0.99, low + step), 3)
    lower, higher = planned(inp, context, given_flags, a), planned(inp, context, given_flags, b)
    assert lower.predicted_pool_tokens <= higher.predicted_pool_tokens, (a, b, given_flags)


def _inventory(gqa: bool, fraction: float, requests: bool) -> HostConfig:
    """The shipped ct200 inventory (MLA with a DFLASH draft), or a plain GQA host on the same cards, running
    at `fraction`, its request cap set or left to SGLang."""
    host = load_service("ct200", Path(__file__).resolve().parents[2] / "units")
    flags = {**host.sglang.flags, "mem-fraction-static": fraction}
    if not requests:
        del flags["max-running-requests"]
    update: dict[str, Any] = {"sglang": host.sglang.model_copy(update={"flags": flags})}
    if gqa:
        model = host.model.model_copy(
            update={
                "attention": "gqa",
                "layers": 80,
                "kv_heads": 8,
                "head_dim": 128,
                "weights_gib_per_gpu": 17.6,
            }
        )
        update.update(model=model, draft=None)
    return host.model_copy(update=update)


@given(
    st.booleans(), st.floats(0.3, 0.99), st.booleans(), st.sampled_from((32768, 65536, 131072, 200_000)),
    set_flags(8),
)  # fmt: skip
@PROPERTY
def test_the_configuration_sized_is_the_one_rendered(
    gqa: bool, fraction: float, requests: bool, context: int, given_flags: dict[str, Any]
) -> None:
    host = _inventory(gqa, round(fraction, 3), requests)
    given_flags.pop("speculative-algorithm", None)  # ct200's draft is DFLASH; the GQA host has none
    change = Change(context, flags=tuple((k, str(v)) for k, v in given_flags.items()))
    try:
        effective_host, _ = with_set_flags(host, change, {})
        plan = plan_for_host(effective_host, asked_of(change), None, effective_host.sglang.flags)
        text = render_unit(allow_context(host, change), plan.flags(), template_dir())
    except (UsageError, RenderError):
        assume(False)
        return
    sized = dict(plan_input_from_inventory(effective_host, effective_host.sglang.flags).flags)
    rendered = dict(parse_unit_flags(text))
    assert set(rendered) - set(sized) - set(plan.flags()) <= IDENTITY  # nothing rendered that was not sized
    for name, value in sized.items():  # nothing sized that is not rendered, as sized or as the plan chose
        want = plan.flags().get(name, value)
        if name == "max-running-requests" and not requests and name not in plan.flags():
            continue  # left to SGLang, as sized: plan/requests.py
        got = rendered.get(name)
        assert got is not None and str(got) == str(want if not isinstance(want, float) else got), name
    if not requests and "max-running-requests" not in plan.flags():
        # SGLang's own: 48 with a draft model (ct200's DFLASH), else at least 2,048 (plan/requests.py)
        own = (
            plan.max_running_requests == SPEC_DEFAULT_REQUESTS
            if not gqa
            else plan.max_running_requests >= 2048
        )
        assert "max-running-requests" not in rendered and own
