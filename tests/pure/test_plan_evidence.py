"""Only a start of this model, layout and cards calibrates a plan; flags changed since scale its cell."""

from __future__ import annotations

import json
from pathlib import Path

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from tests.pure import facts_fixtures as cfg
from tests.pure.test_facts_plan import ct200, facts, run
from tests.pure.test_plan_cmd import START_LOG

H100 = ("NVIDIA H100 80GB HBM3", 81559, "9.0")


def test_a_facts_last_start_of_another_model_is_set_aside_with_a_headline_warning() -> None:
    # A Llama facts file whose last start is ct200's Kimi K2.6 start: not "feasible (calibrated)" with Kimi's
    # pool and 92.8 GiB free on an 80 GB card.
    doc = facts(cfg.LLAMA31_8B, H100, 1, weights=int(16e9), last_start=START_LOG)
    plan = plan_from_facts(parse_facts(doc), Target(32_768))
    assert plan.basis == "architecture"
    assert any("set aside" in w and "KimiK25ForConditionalGeneration" in w for w in plan.warnings)


def test_a_start_on_bigger_cards_is_set_aside() -> None:
    doc = ct200()
    doc["gpus"] = [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}] * 8
    plan = plan_from_facts(parse_facts(doc), Target(32_768))
    assert plan.basis == "architecture" and any("92.8 GiB" in w for w in plan.warnings)


def test_fp8_kv_after_a_bf16_start_scales_the_measured_cell(tmp_path: Path) -> None:
    # Was: "the architecture's is 100.1 % off: check the facts" and NOT FEASIBLE (exit 8) at 219,753 tokens.
    path = tmp_path / "ct200.json"
    path.write_text(json.dumps(ct200()))
    argv = ("plan", "--facts", str(path), "--context", "250k", "--set", "kv-cache-dtype=fp8_e4m3", "--json")
    code, out, err = run(*argv)
    plan = json.loads(out)
    assert code == 0, err
    assert plan["feasible"] and plan["basis"] == "calibrated"
    assert not any("off: check" in n for n in plan["notes"])
    # fp8 halves the bf16 cell exactly for MLA (and the DFLASH draft's K and V): twice the bf16 pool's rest.
    bf16 = plan_from_facts(parse_facts(ct200()), Target(100_000, fraction=plan["mem_fraction_static"]))
    assert abs(plan["predicted_pool_tokens"] / bf16.predicted_pool_tokens - 2) < 0.01


def test_a_start_cut_before_the_draft_loaded_is_partial_and_says_so() -> None:
    # Was: "feasible (calibrated)" at 0.916 for "204,091 tokens", taking memory after the target's weights as
    # after all weights (the draft's 1.2 GiB left out), where the full start predicts 187,195 there.
    cut = "\n".join(START_LOG.splitlines()[:3]) + "\n"
    plan = plan_from_facts(parse_facts(ct200(last_start=cut)), Target(200_000))
    full = plan_from_facts(parse_facts(ct200()), Target(200_000, fraction=plan.mem_fraction_static))
    assert "partial start" in plan.basis
    assert plan.predicted_pool_tokens <= full.predicted_pool_tokens * 1.005


def test_a_start_whose_cell_is_not_the_architectures_is_set_aside() -> None:
    # ct200's start with its pool doubled: no Kimi K2.6 under these flags gives half the bytes per token.
    doubled = START_LOG.replace("#tokens: 101134", "#tokens: 202268").replace(
        "max_total_num_tokens=101134", "max_total_num_tokens=202268"
    )
    plan = plan_from_facts(parse_facts(ct200(last_start=doubled)), Target(200_000))
    assert plan.basis == "architecture"
    assert any("set aside" in w and "x the architecture's bytes per token" in w for w in plan.warnings)


def test_decode_speed_is_stated_or_said_to_be_unmeasured() -> None:
    cold = plan_from_facts(parse_facts(ct200()), Target(200_000))
    assert any(n.startswith("decode speed: not measured: set [smoke] load") for n in cold.notes)
    measured = ct200(load={"decode_ms_per_token": 41.5, "long_prompt_tokens": 190_000})
    plan = plan_from_facts(parse_facts(measured), Target(200_000))
    assert any(n.startswith("decode speed: 41.5 ms/token at 190,000 tokens") for n in plan.notes)


def test_over_ssh_fp8_kv_after_the_hosts_bf16_start_plans_feasible() -> None:
    # `plan ct200 --context 250k --set kv-cache-dtype=fp8_e4m3`: the host's facts, its last start calibrating.
    from agent.apply import with_set_flags
    from agent.inventory import HostConfig
    from agent.orchestrate.asked import Change
    from agent.plan.from_facts import plan_from_host_facts
    from agent.sglang.logs.summary import start_figures

    # The inventory names the unit's flags (the render writes them: the plan sizes what it renders).
    flags = {"tp-size": 8, "context-length": 32768, "speculative-algorithm": "DFLASH"}
    host = HostConfig.model_validate(
        {"name": "ct200", "ssh": {"target": "ct200"}, "gpus": {"count": 8, "memory_gib": 95.58},
         "model": {"path": "/models/k"}, "sglang": {"version": "0.5.23", "flags": flags}}
    )  # fmt: skip
    change = Change(250_000, flags=(("kv-cache-dtype", "fp8_e4m3"),))
    host, facts = with_set_flags(host, change, {"model_facts": ct200(last_start=None)})  # type: ignore[typeddict-item]
    history = [start_figures(START_LOG.splitlines())]
    plan = plan_from_host_facts(host, facts, history, Target(250_000))
    assert plan is not None and plan.feasible and plan.basis == "calibrated"
    assert not any("off: check" in n for n in plan.notes)


def test_a_facts_file_sets_its_own_margin_and_floor() -> None:
    # Llama 3.1 8B at 32k on one RTX 4090: NOT FEASIBLE under a 4 GiB floor the person states; a 2 GiB one
    # (what they measured their graphs at) is planned with, near what such hosts run.
    card = ("NVIDIA GeForce RTX 4090", 24564, "8.9")
    doc = facts(cfg.LLAMA31_8B, card, 1, weights=16_060_522_496)
    assert not plan_from_facts(
        parse_facts({**doc, "planning": {"reserve_floor_gib": 4.0}}), Target(32_768)
    ).feasible
    plan = plan_from_facts(parse_facts({**doc, "planning": {"reserve_floor_gib": 2.0}}), Target(32_768))
    assert plan.feasible and plan.reserve_floor_gib == 2.0 and 0.84 <= plan.mem_fraction_static <= 0.90
