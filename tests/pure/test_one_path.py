"""One planning path: the same host planned from its inventory and from a facts file gives the same plan.

Each case is one model on one set of GPUs, written twice: as an inventory entry (the architecture figures,
or, for a model the figures cannot describe, the inventory with the config.json the host read) and as a
facts file (deployctl-facts/1) of the same config.json, weights, GPUs and flags. The plans must agree on
everything the plan decides: the fraction, the request count, the pool, the verdict and the alternatives.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from agent.errors import UsageError
from agent.inventory import FlagValue, HostConfig, Planning, Sglang
from agent.plan.choose import Plan, Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_for_host, plan_from_facts, plan_from_host_facts
from agent.sglang.kvlayout import read_layout
from tests.pure import facts_fixtures as fixtures

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
H100 = ("NVIDIA H100 80GB HBM3", 79.65)
H200 = ("NVIDIA H200", 140.4)
GIB = 2**30


def config_of(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return data


@dataclass(frozen=True)
class Case:
    config: dict[str, Any]
    card: tuple[str, float]
    count: int
    weights_bytes: int
    context: int
    flags: dict[str, FlagValue] = field(default_factory=dict)
    fraction: float | None = None
    by_figures: bool = True  # the inventory's figures describe the architecture (else: its config.json)


CASES = {
    # the example: no fraction set, SGLang's own default decides the running fraction
    "llama-3.1-8b-1xH100": Case(config_of("llama-3.1-8b"), H100, 1, 16_060_522_496, 131_072),
    "qwen3-32b-tp2": Case(config_of("qwen3-32b"), H100, 2, 65_524_246_528, 40_960, {"tp-size": 2}),
    "mixtral-8x7b-tp2": Case(config_of("mixtral-8x7b"), H100, 2, 93_405_585_408, 32_768, {"tp-size": 2}),
    "deepseek-v3-mla-tp8": Case(
        config_of("deepseek-v3"),
        H200,
        8,
        688_586_727_424,
        163_840,
        {"tp-size": 8, "max-running-requests": 32},
    ),
    # Gemma 3: sliding-window layers, but SGLang sizes every layer in full (the hybrid pool is off)
    "gemma-3-27b-swa-off": Case(fixtures.GEMMA3_27B, H100, 1, 54_867_000_000, 32_768),
    # hybrid linear attention: the inventory has no figures for it, the host reads its config.json
    "qwen3-next-hybrid-tp4": Case(
        fixtures.QWEN3_NEXT, H100, 4, 162_700_000_000, 131_072, {"tp-size": 4}, by_figures=False
    ),
    "gpt-oss-120b-swa-tp2": Case(
        fixtures.GPT_OSS_120B, H100, 2, 65_250_000_000, 131_072, {"tp-size": 2}, by_figures=False
    ),
    # out of reach: the alternatives and the binding constraint must agree too
    "llama-3.1-70b-tp2-infeasible": Case(
        config_of("llama-3.1-70b"), H100, 2, 141_107_000_000, 131_072, {"tp-size": 2}
    ),
    "llama-3.1-8b-user-fraction": Case(
        config_of("llama-3.1-8b"), H100, 1, 16_060_522_496, 65_536, fraction=0.7
    ),
}


def _tp(case: Case) -> int:
    return int(str(case.flags.get("tp-size", 1)))


def _figures(case: Case) -> dict[str, Any]:
    """The inventory's [model] figures of the case's config.json, as a person writes them."""
    layout = read_layout(case.config)
    model: dict[str, Any] = {"layers": layout.layers, "dtype_bytes": layout.dtype_bytes}
    if layout.kv_lora_rank:
        model.update(
            attention="mla", kv_lora_rank=layout.kv_lora_rank, qk_rope_head_dim=layout.qk_rope_head_dim
        )
    else:
        model.update(attention="gqa", kv_heads=layout.kv_heads, head_dim=layout.head_dim)
    return {**model, "max_context": layout.context_len}


# The inventory's figures size the cell but not the activations (no hidden or intermediate size): a floor
# is stated on both paths of those cases, so they compare what the figures decide. The host-facts cases
# derive it on both (plan/floor.py); test_a_floor_is_derived_only_where_the_shapes_are_known covers the gap.
STATED_FLOOR = {"reserve_floor_gib": 4.0}


def inventory_host(case: Case) -> HostConfig:
    model: dict[str, Any] = {"path": "/models/m", "weights_gib_per_gpu": case.weights_bytes / _tp(case) / GIB}
    if case.by_figures:
        model.update(_figures(case))
    else:
        model["config_json"] = "/models/m/config.json"
    return HostConfig.model_validate({
        "name": "h", "ssh": {"target": "h"},
        "gpus": {"count": case.count, "memory_gib": case.card[1], "name": case.card[0]},
        "model": model, "sglang": {"version": "0.5.23", "flags": dict(case.flags)},
        "planning": STATED_FLOOR if case.by_figures else {},
    })  # fmt: skip


def facts_doc(case: Case) -> dict[str, Any]:
    card = {"name": case.card[0], "memory_total_mib": case.card[1] * 1024}
    return {
        "format": "deployctl-facts/1", "gpus": [card] * case.count, "sglang": {"version": "0.5.23"},
        "model": {"config": case.config, "weights_bytes": case.weights_bytes, "path": "/models/m"},
        "flags": dict(case.flags), **({"planning": STATED_FLOOR} if case.by_figures else {}),
    }  # fmt: skip


def from_inventory(case: Case) -> Plan:
    host, asked = inventory_host(case), Target(case.context, case.fraction)
    if case.by_figures:
        return plan_for_host(host, asked, None, host.sglang.flags)
    # The host read the config.json the inventory names; nvidia-smi gave no rows: the inventory's cards.
    host_facts = {**facts_doc(case), "gpus": [], "model": {"config": case.config, "path": "/models/m"}}
    plan = plan_from_host_facts(host, {"model_facts": host_facts}, None, asked)
    assert plan is not None
    return plan


def decided(plan: Plan) -> dict[str, Any]:
    """What the plan decides (its notes name the figures' origins, which do differ)."""
    return {
        "fraction": plan.mem_fraction_static,
        "requests": plan.max_running_requests,
        "pool": plan.predicted_pool_tokens,
        "feasible": plan.feasible,
        "basis": plan.basis,
        "forced": (plan.forced_fraction, plan.forced_pool_tokens),
        "reserve": round(plan.reserve_gib_per_gpu, 6),
        "alternatives": [a.to_dict() for a in plan.alternatives],
        "refusals": plan.refusals,
        "binding": plan.binding,
        "flags": plan.flags(),
    }


@pytest.mark.parametrize("name", list(CASES))
def test_the_inventory_and_a_facts_file_of_the_same_host_plan_alike(name: str) -> None:
    case = CASES[name]
    facts_plan = plan_from_facts(parse_facts(facts_doc(case)), Target(case.context, case.fraction))
    assert decided(from_inventory(case)) == decided(facts_plan)


def test_an_unset_fraction_is_sglangs_default_on_both_paths() -> None:
    # SGLang 0.5.23 resolves an unset --mem-fraction-static itself (server_args.py, memory_hook.py): that is
    # the fraction the host runs at, and a running fraction that reaches the target is kept.
    case = CASES["llama-3.1-8b-1xH100"]
    plan = from_inventory(case)
    assert plan.feasible and plan.mem_fraction_static > 0.8
    assert any("SGLang 0.5.23 would use" in n for n in plan.notes)


def test_a_figure_the_inventory_lacks_is_named_or_measured() -> None:
    from tests.pure.test_planner import START_085, host, plan

    no_layers = host(draft={"layers": None})
    with pytest.raises(UsageError, match=r"the inventory lacks draft\.layers"):
        plan(no_layers, 200_000)
    calibrated = plan(no_layers, 200_000, START_085)  # the start's bytes per token stand in
    assert calibrated.basis == "calibrated" and calibrated.feasible
    assert any("a measured cell (the inventory lacks draft.layers)" in n for n in calibrated.notes)


def test_the_inventorys_floor_and_margin_hold_on_every_path() -> None:
    case = CASES["gpt-oss-120b-swa-tp2"]  # planned from the host's facts
    default = from_inventory(case)
    strict = inventory_host(case).model_copy(
        update={
            "planning": Planning(margin=0.2, reserve_floor_gib=20.0),
            "sglang": Sglang(version="0.5.23", flags={"tp-size": 2, "mem-fraction-static": 0.95}),
        }
    )
    host_facts = {**facts_doc(case), "gpus": [], "model": {"config": case.config, "path": "/models/m"}}
    plan = plan_from_host_facts(strict, {"model_facts": host_facts}, None, Target(case.context))
    assert plan is not None and plan.reserve_floor_gib == 20.0
    assert any("the memory floor is 20.0 GiB per GPU, as stated" in n for n in plan.notes)
    assert any(n.startswith(f"the memory floor is {default.reserve_floor_gib:.1f} GiB per GPU")
               and "as stated" not in n for n in default.notes)  # fmt: skip
    assert plan.target_pool_tokens == math.ceil(case.context * 1.2)
    assert plan.reserve_gib_per_gpu >= 20.0


def test_a_kv_element_of_three_bytes_is_refused_in_one_line() -> None:
    from tests.pure.test_planner import host, plan

    with pytest.raises(UsageError, match=r"model\.dtype_bytes 3"):
        plan(host(model={"dtype_bytes": 3}), 200_000)


def test_a_floor_is_derived_only_where_the_shapes_are_known() -> None:
    # The inventory's figures alone do not give the activations' shapes: the fixed 4 GiB, said as such. The
    # same host's config.json (its facts) derives the floor from what takes it.
    case = replace(CASES["llama-3.1-70b-tp2-infeasible"])
    bare = inventory_host(case).model_copy(update={"planning": Planning()})
    figures = plan_for_host(bare, Target(case.context), None, bare.sglang.flags)
    assert figures.reserve_floor_gib == 4.0
    assert any("4.0 GiB per GPU, fixed: without the model's shapes" in n for n in figures.notes)
    doc = {k: v for k, v in facts_doc(case).items() if k != "planning"}
    derived = plan_from_facts(parse_facts(doc), Target(case.context))
    said = [
        n for n in derived.notes if n.startswith(f"the memory floor is {derived.reserve_floor_gib:.1f} GiB")
    ]
    assert said and "derived: CUDA graphs" in said[0] and "prefill chunk" in said[0]
