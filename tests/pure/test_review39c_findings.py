"""Third review of the planner: start refusals (plan/startrefusals.py) checked against SGLang 0.5.23's own
start (the oracle: python -m tests.oracle size --gpu h100 -- FLAGS). Each test fails on the code as it stands
(xfail strict) and asserts what SGLang does; severity above each."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from tests.pure.test_review39b_findings import facts


def llama4(**flags: Any) -> tuple[bool, tuple[str, ...]]:
    """Llama 3.1 70B's text config under Llama 4's class name: the oracle ran this very config."""
    doc = facts("llama-3.1-70b", 141, tp_size=8, **flags)
    doc["model"]["config"]["architectures"] = ["Llama4ForCausalLM"]
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
    return plan.feasible, plan.refusals


# MEDIUM (a start SGLang makes is refused, and the rule the refusal cites is not SGLang's): Llama 4 with
# --prefill-attention-backend flashinfer --decode-attention-backend flashinfer (no base backend) is planned
# "not feasible: --prefill-attention-backend flashinfer: SGLang refuses it for Llama4ForCausalLM", because
# startrefusals._sides takes equal split flags as the base backend (overrides.py _attention_backend_default)
# before Llama 4's assert (model_hook.py:615-631). SGLang 0.5.23 starts it: the oracle sizes the pool for
# the same config and flags (only --attention-backend flashinfer itself is refused, "fa3, aiter, triton,
# ascend, trtllm_mha or intel_xpu is required for Llama4 model but got flashinfer"): the split flags set the
# base after the model's assert ran on the base its override chose. The plan then blocks a unit that runs,
# and its alternatives and verdict name a refusal that never happens.
def test_llama4_equal_split_backends_are_not_refused() -> None:
    assert llama4(attention_backend="flashinfer")[1], "control: the base backend itself is refused"
    feasible, refusals = llama4(prefill_attention_backend="flashinfer", decode_attention_backend="flashinfer")
    assert refusals == () and feasible, refusals


# MEDIUM (an alternative that holds only under a flag it does not give): Llama 3.1 70B at TP 2, 128k, not
# feasible; "instead: a smaller context: 35,000 tokens ... at --mem-fraction-static 0.920 ... (reaches
# 35,000)", flags {context-length: 35000, mem-fraction-static: 0.92}. The re-plan that found it (replan.py
# _largest_context) reaches it only by setting --max-running-requests 128 ("SGLang's own 2,048 would not keep
# the memory floor"): 0.920 is above the 0.907 the plan itself calls the highest safe fraction with SGLang's
# own cap (decode graphs to 256). _as_replanned copies the fraction into the alternative's flags but not the
# cap, and its line does not say the concurrency drops from 2,048 to 128: a unit rendered from the
# alternative's flags (SGLang resolves 2,048, mem_cache/kv_cache_configurator.py resolve_max_num_reqs) runs
# 0.920 below the floor the planner requires (Target(35000, 0.92, 2048) plans NOT feasible).
def test_a_smaller_context_alternative_carries_the_request_cap_its_replan_sets() -> None:
    doc = facts("llama-3.1-70b", 141, tp_size=2)
    doc["gpus"] = doc["gpus"][:2]
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(131072))
    (alt,) = [a for a in plan.alternatives if "context-length" in a.flags]
    context, fraction = int(str(alt.flags["context-length"])), float(str(alt.flags["mem-fraction-static"]))
    sglangs_cap = plan_from_facts(parse_facts(doc, name="x"), Target(context, fraction, 2048), replan=False)
    assert not sglangs_cap.feasible, "control: SGLang's own cap does not keep the floor at this fraction"
    again = plan_from_facts(parse_facts(doc, name="x"), Target(context), replan=False)
    assert again.requests_set and again.max_running_requests < 2048, "control: the re-plan lowers the cap"
    assert alt.flags.get("max-running-requests") == again.max_running_requests, alt.flags


def qwen3_vl(weights: float, context: int, flag: int | None, asked: int | None) -> Any:
    doc = facts(
        "qwen3-vl-8b-instruct", weights, tp_size=1, **({} if flag is None else {"max_running_requests": flag})
    )
    doc["gpus"] = doc["gpus"][:1]
    return plan_from_facts(parse_facts(doc, name="x"), Target(context, None, asked), replan=False)


# MEDIUM (over-prediction at the ceiling): a request cap asked as `plan --max-running-requests 400` or
# `plan --set max-running-requests=400` (both become Target.max_running: cli/options.py change_of) is not the
# cap the memory floor is derived with: predict.floor_of reads --max-running-requests from the input's flags
# only. Qwen3-VL on a Hopper card of 60 GiB or more captures decode graphs up to the cap when it is <= 512
# (arg_groups/model_overrides/qwen3_vl.py:34-62 expand_multimodal_decode_graph_to_running_limit), and the plan
# writes --max-running-requests 400 into the unit, so SGLang captures to 400: the planner's own floor for that
# unit is 4.5 GiB (CUDA graphs 2.37 GiB, "batch sizes up to 400") when the cap is the facts' flag, 3.7 GiB
# (graphs to 256) when it is asked. Where the floor binds (a checkpoint of 45 GB, 262,144 tokens, not
# feasible) the CLI plans 0.947 and 225,418 tokens with 3.74 GiB left, above the 0.937 / 205,174 the same
# unit plans with the flag in the facts: 20k tokens promised out of the graphs' memory.
def test_an_asked_request_cap_sets_the_floor_as_the_same_flag_does() -> None:
    assert (
        qwen3_vl(17, 32768, None, 400).reserve_floor_gib == qwen3_vl(17, 32768, 400, None).reserve_floor_gib
    )
    asked, flagged = qwen3_vl(45, 262144, None, 400), qwen3_vl(45, 262144, 400, None)
    assert asked.mem_fraction_static <= flagged.mem_fraction_static, (
        asked.mem_fraction_static,
        flagged.mem_fraction_static,
    )


# MEDIUM (the concurrency a hybrid plan states is 5/3 of what runs): SGLang 0.5.23 holds 5 state slots per
# request for Qwen3.5 and Nemotron-H under default flags, not 3: with the overlap schedule on (the default),
# `--mamba-radix-cache-strategy auto` resolves to extra_buffer (arg_groups/overrides.py:477-485), and
# _calculate_mamba_ratio adds get_mamba_tracking_slots(extra_buffer=True, overlap=True) = 2 to the base 3
# (mem_cache/kv_cache_configurator.py:3062-3088, allocation_sizing.py:11-19). The oracle at TP 8, 0.85 on
# H100 (post 59.4 GiB): Qwen3.5-27B 1,261 slots -> max_running_requests 252; Nemotron-3-Nano 3,966 -> 793.
# The planner (sglang/pools.py MambaShare.per_request = 3) says "the state cache holds 1,243 slots: SGLang
# caps --max-running-requests at 414" and plans 414 (Nemotron: 3,911 slots, 1,303), so its request count,
# full-context concurrency and any cap it writes above 252 are SGLang-capped without a word.
@pytest.mark.parametrize("model", ["qwen3.5-27b", "nemotron-3-nano-30b-a3b"])
def test_a_hybrid_state_cache_caps_requests_at_five_slots_each(model: str) -> None:
    doc = facts(model, 150.32, tp_size=8, context_length=32768, mem_fraction_static=0.85)
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768, 0.85), replan=False)
    said = [m for n in plan.notes if (m := re.search(r"holds ([\d,]+) slots: SGLang caps .* at ([\d,]+)", n))]
    assert said, plan.notes
    slots, cap = (int(said[0][i].replace(",", "")) for i in (1, 2))
    assert cap == slots // 5 and plan.max_running_requests <= slots // 5, (
        slots,
        cap,
        plan.max_running_requests,
    )
