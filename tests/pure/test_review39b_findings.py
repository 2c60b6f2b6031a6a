"""Second review of "plan exactly what will run, from the start that actually ran": SGLang 0.5.23 defaults
the planner resolves differently, and a start's runtime memory applied to a configuration it did not run.
Each test fails on the code as it stands (xfail strict) and asserts what SGLang does; severity above each."""

# ruff: noqa: E501 - verbatim SGLang lines are longer than code lines

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.predict import pool_model
from agent.sglang.logs.starts import evidence, split
from tests.pure.test_log_starts import GOOD, OOM_AT_095, journal, run, write
from tests.pure.test_review39_findings import ran_at_093

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
# The oracle's 8 x H100 (tests/oracle/cases.py H100: 79.1 GiB): the figures below are SGLang 0.5.23's own
# answers for this card (python -m tests.oracle size --gpu h100 -- FLAGS).
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 79.1 * 1024, "compute_capability": "9.0"}


def facts(model: str, weights_gb: float, env: dict[str, str] | None = None, **flags: Any) -> dict[str, Any]:
    config = json.loads((MODELS / model / "config.json").read_text())
    return {
        "format": "deployctl-facts/1", "gpus": [H100] * 8, "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": int(weights_gb * 1e9)},
        "flags": {k.replace("_", "-"): v for k, v in flags.items()}, "env": env or {},
    }  # fmt: skip


def default_fraction(doc: dict[str, Any]) -> float:
    return pool_model(parse_facts(doc, name="x"), 32768).fraction


# --- A start's runtime memory applied to a configuration it did not run -----------------------------------


def without_graphs() -> list[str]:
    """The shipped ct200 start as it runs with --disable-cuda-graph: no capture lines, and the 1.40 GB the
    graphs took is still free when the server is up (available_gpu_mem 13.90, the memory after the pool)."""
    out = []
    for line in GOOD:
        if "CUDA graph" in line:
            continue
        line = line.replace(
            "'chunked_prefill_size': 8192,", "'chunked_prefill_size': 8192, 'disable_cuda_graph': True,"
        )
        out.append(line.replace("available_gpu_mem=12.50", "available_gpu_mem=13.90"))
    return out


# HIGH (OOM at graph capture, the restart deployctl exists to prevent): `plan ct200 --from-log` of a start
# that ran with --disable-cuda-graph (a debugging start, a unit edited on the host) calibrates the runtime
# need (plan/model.py runtime_need: pre x (1 - f) - available_gpu_mem) from a start that captured no graphs,
# and applies it to the inventory's unit, which captures them (SGLang 0.5.23 captures decode graphs unless
# disabled: model_executor/model_runner_components/cuda_graph_setup.py:703-732 capture_decode_graph returns
# no capture only under Backend.DISABLED; the real start's graphs took 1.40 GB).
# evidence.as_started compares the cell flags only, so the plan promises 11.74 GiB free (ceiling 0.956)
# where the same start with its graphs leaves 10.34 GiB (ceiling 0.941), and says the figure is "minus what
# the runtime took at the earlier start (CUDA graphs, activations)".
def test_a_start_without_cuda_graphs_does_not_lend_a_plan_with_graphs_their_memory(tmp_path: Path) -> None:
    def planned(lines: list[str], name: str) -> dict[str, Any]:
        log = write(tmp_path, "\n".join(lines) + "\n", name=name)
        code, stdout, stderr = run(
            tmp_path, "plan", "ct200", "--offline", "--context", "128k", "--json", "--from-log", log
        )
        assert code in (0, 5), stderr
        return dict(json.loads(stdout))

    with_graphs, graphless = planned(GOOD, "good.log"), planned(without_graphs(), "nograph.log")
    assert graphless["reserve_gib_per_gpu"] <= with_graphs["reserve_gib_per_gpu"] + 0.05, (
        graphless["reserve_gib_per_gpu"],
        with_graphs["reserve_gib_per_gpu"],
    )


# --- DeepEP's all-to-all buffers ------------------------------------------------------------------------------


# HIGH (OOM under load at the planned ceiling): --moe-a2a-backend deepep allocates DeepEP's all-to-all
# buffers after the pool (captured in the decode graph); SGLang 0.5.23 reserves 2 GiB for them on top of its
# own floor (arg_groups/memory_hook.py:317 and :402-414 reserve_for_deepep_a2a_mb: "real extra
# allocations"). The cold plan sizes the flag as if it cost nothing: the same 10.92 GiB "memory left per
# GPU" with and without it (Qwen3-30B-A3B, 8 x H100, TP 8, fraction 0.85), as --enable-symm-mem was.
# The plan then lowers its own fraction to keep its floor free, so the memory left is compared at one fraction.
def test_deepep_all_to_all_buffers_come_out_of_the_memory_left() -> None:
    def left(**extra: Any) -> tuple[float, float]:
        doc = facts("qwen3-30b-a3b", 61, tp_size=8, mem_fraction_static=0.85, **extra)
        plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
        return plan.reserve_gib_per_gpu + plan.pre_gib * plan.mem_fraction_static, plan.pre_gib

    (plain, pre), (deepep, _) = left(), left(moe_a2a_backend="deepep")
    at_085 = (plain - pre * 0.85, deepep - pre * 0.85)  # the memory left at 0.85, with and without DeepEP
    assert at_085[1] <= at_085[0] - 2.0 + 0.01, at_085


# MEDIUM (the running fraction misread, and with it the unset request cap and the shrink headline): an unset
# --mem-fraction-static with --moe-a2a-backend deepep resolves to 0.775 on this card in SGLang 0.5.23 (the
# 2 GiB of memory_hook.py:317 reserve_for_deepep_a2a_mb added after the 10 GiB floor); the planner says
# "SGLang 0.5.23 would use about 0.811" and sizes the running pool, and the cap SGLang derives from it, at
# 0.811 (memory_defaults.default_fraction knows no DeepEP term).
def test_deepep_default_fraction_is_sglangs() -> None:
    assert default_fraction(facts("qwen3-30b-a3b", 61, tp_size=8, moe_a2a_backend="deepep")) == 0.775


# --- Other defaults of memory_hook.handle_gpu_memory_settings -----------------------------------------------


# MEDIUM: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 in the unit's environment (set by SGLang itself for some
# architectures, arg_groups/muse_spark_hook.py:23) makes an unset fraction skip the graph and activation
# reserve: reserved = 1536 + tp x pp / 8 GiB, no 10 GiB floor (memory_hook.py:286-293; predicate
# arg_groups/overrides.py:1791-1860, true for a plain GQA model with graphs on). Llama-3.1-8B on one H100:
# SGLang resolves 0.979; the planner says 0.828, and the env var appears nowhere in agent/plan.
def test_post_capture_kv_sizing_default_fraction_is_sglangs() -> None:
    env = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
    assert default_fraction(facts("llama-3.1-8b", 16, env=env, tp_size=1)) == 0.979


# LOW (under-prediction: a smaller running pool than SGLang's, no restart cost): the multimodal scaling of a
# defaulted fraction applies only to a VLM that runs its vision tower: not with --language-only (nor
# --language-model-only) and not on a PD decode role (memory_hook.py:283-288 is_vlm). Qwen3-VL-8B on one
# H100: SGLang resolves 0.834 and 0.874; the planner scales both by the ViT factor (0.828 and 0.808).
@pytest.mark.parametrize(
    ("flags", "sglang"),
    [({"language_only": True}, 0.834), ({"disaggregation_mode": "decode"}, 0.874)],
    ids=["language-only", "pd-decode"],
)
def test_the_vlm_factor_is_skipped_where_sglang_skips_it(flags: dict[str, Any], sglang: float) -> None:
    fraction = default_fraction(facts("qwen3-vl-8b-instruct", 17.5, tp_size=1, **flags))
    assert round(fraction, 3) == sglang, fraction


# --- Flags SGLang takes that the planner cannot be given ------------------------------------------------------


# LOW (a valid unit refused): --cuda-graph-bs-decode takes a list (server_args-0.5.23.json: nargs "+", int;
# memory_hook.py:200-203 then makes max(list) the decode max bs, which the default fraction reserves 2 MiB
# per), and plan/predict.py _listed_max reads such a list; yet no input can carry one: `--set
# cuda-graph-bs-decode=1 2 4 8 1024` (and a facts file's or inventory's "1 2 4 8 1024") is refused "is not an
# integer", and the inventory's and facts' flag types hold no list.
def test_a_list_valued_cuda_graph_bs_decode_is_planned(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "32k", "--json",
        "--set", "cuda-graph-bs-decode=1 2 4 8 1024",
    )  # fmt: skip
    assert code in (0, 5), stderr
    assert json.loads(stdout)["flags"]["cuda-graph-bs-decode"] in (
        "1 2 4 8 1024",
        ["1", "2", "4", "8", "1024"],
    )


# --- Evidence: a failure that says nothing about memory ------------------------------------------------------

# A restart that died initialising NCCL, before its weights: it logged no memory figure at all.
EARLY_FAILURE = [
    "[2026-12-01 11:00:00.112] server_args={'model_path': '/models/Kimi-K2.6', 'tp_size': 8, 'mem_fraction_static': 0.85, 'max_running_requests': 64, 'context_length': 32768, 'kv_cache_dtype': 'auto', 'page_size': 1, 'speculative_algorithm': 'DFLASH'}",
    "[2026-12-01 11:00:01.004 TP0] Init parallel begin.",
    "[2026-12-01 11:00:01.104 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3",
    "[2026-12-01 11:00:01.201] Received sigquit from a child process. It usually means the child failed.",
]


# LOW (a usable log refused): `journalctl -u sglang.service -b` after a good start and a restart that died
# in NCCL init, before its weights: the failed start is "the last complete one", so `plan --from-log` exits 2
# "no usable start in it: start 2 of 2 logged neither its KV pool nor its free memory", while start 1 of the
# same unit and flags logged all of them. A failure before the weights is evidence of nothing about memory
# (plan/failed.py says so itself); the last start that measured it is the evidence, named as such.
def test_a_failure_before_the_weights_does_not_hide_the_good_start_before_it(tmp_path: Path) -> None:
    log = write(tmp_path, journal(GOOD, EARLY_FAILURE))
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "128k", "--json", "--from-log", log
    )
    assert code in (0, 5), stderr
    assert json.loads(stdout)["basis"] == "calibrated"


# --- What SGLang refuses or resolves from the checkpoint -------------------------------------------------------


# MEDIUM (a feasible plan SGLang will not start: a wasted restart): a DeepSeek-DSA model (GLM-5, DeepSeek-V3.2)
# takes a bf16 or fp8_e4m3 KV cache only (arg_groups/overrides.py:540-544: assert kv_cache_dtype in
# ["bfloat16", "fp8_e4m3"], "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"); the
# oracle refuses the start. The planner sizes --kv-cache-dtype fp8_e5m2 as any fp8 cache and says feasible.
def test_a_dsa_model_with_an_fp8_e5m2_cache_is_not_feasible() -> None:
    doc = facts("glm-5-nvfp4", 440, tp_size=8, kv_cache_dtype="fp8_e5m2")
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
    assert not plan.feasible or plan.refusals, plan.predicted_pool_tokens


# LOW (under-prediction by half: the pool shrunk or "not feasible" for nothing): a checkpoint saved in float32
# (config.json "torch_dtype"/"dtype": "float32") runs at --dtype auto in float16, and its KV cache with it
# (configs/model_config.py:2301-2318 _get_and_verify_dtype: "we use float16 for float32 models"; Gemma in
# bfloat16): 2 bytes per element. The planner sizes a 4-byte cell: Llama-3.1-8B's pool at 203,500 tokens
# where the same config in bfloat16, the same bytes as SGLang's float16, gives 407,001.
def test_a_float32_checkpoint_is_sized_at_the_half_precision_sglang_runs() -> None:
    config = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())

    def pool(dtype: str) -> int:
        doc = facts("llama-3.1-8b", 16, tp_size=1)
        doc["model"]["config"] = {**config, "torch_dtype": dtype}
        return plan_from_facts(parse_facts(doc, name="x"), Target(32768)).predicted_pool_tokens

    assert pool("float32") == pool("bfloat16")


# --- Flag combinations SGLang refuses at start, planned feasible --------------------------------------------


# MEDIUM (a wasted restart): `--set attention-backend=flashinfer` (an ordinary thing to try) on a model whose
# SGLang 0.5.23 hook asserts its backends: GPT-OSS (arg_groups/model_hook.py:523-543 "GptOssForCausalLM
# requires one of [triton, trtllm_mha, fa3, fa4, ...]") and Gemma 4 (model_hook.py:646-661 "Gemma4 only
# supports trtllm_mha, triton, fa4, ..."). The oracle refuses both starts; the planner sizes them feasible.
@pytest.mark.parametrize(("model", "weights"), [("gpt-oss-20b", 14), ("gemma-4-26b-a4b", 52)])
def test_an_attention_backend_the_model_refuses_is_not_feasible(model: str, weights: float) -> None:
    doc = facts(model, weights, tp_size=8, attention_backend="flashinfer")
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
    assert not plan.feasible or plan.refusals, plan.predicted_pool_tokens


# MEDIUM (a wasted restart): NGRAM speculative decoding resolves --speculative-eagle-topk to 10 and refuses a
# page size above 1 on any backend but flashinfer (arg_groups/speculative_hook.py:1355-1366 "speculative_
# eagle_topk(10) > 1 with page_size(64) > 1 is unstable ..."): `--page-size 64` on Llama-3.1-70B (fa3 on
# H100), and a DSA model, whose page size SGLang forces to 64 (GLM-5; on B200, where trtllm forces 64, the
# oracle refuses NGRAM for DeepSeek-V3, Kimi, GPT-OSS, Gemma 4 and Nemotron alike). The oracle refuses both; the
# planner sizes them feasible (1,187,776 and 79,936 tokens).
@pytest.mark.parametrize(
    ("model", "weights", "flags"),
    [("llama-3.1-70b", 141, {"page_size": 64}), ("glm-5-nvfp4", 440, {})],
    ids=["page-size-64", "dsa-forced-page-64"],
)
def test_ngram_with_a_paged_cache_off_flashinfer_is_not_feasible(
    model: str, weights: float, flags: dict[str, Any]
) -> None:
    doc = facts(model, weights, tp_size=8, speculative_algorithm="NGRAM", **flags)
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
    assert not plan.feasible or plan.refusals, plan.predicted_pool_tokens


# --- Evidence: the last start in time ----------------------------------------------------------------------


# LOW-MEDIUM (calibrated on a stale start, named as "the last complete one"): rotated logs pasted as
# `cat sglang.log sglang.log.1` (or `zcat -f sglang.log*`, which sorts the current file first) hold the newest
# start first. starts.evidence takes the last start in file order, so the plan reads the day-old start at
# 0.93 (a configuration since replaced) and parse-log marks it "the last complete one", though every SGLang
# line carries its date ([2026-12-02 ...] against [2026-12-01 ...]). The latest start by its own timestamps
# is the evidence (or the log is refused as ambiguous and a start must be named).
def test_the_evidence_is_the_latest_start_by_its_timestamps() -> None:
    newest = [line.replace("2026-12-01", "2026-12-02") for line in GOOD]
    start = evidence(split([*newest, *ran_at_093()]))
    assert start is not None
    assert start.summary.mem_fraction_static == 0.85, start.summary.mem_fraction_static


def ran_at_0851_without_server_args() -> list[str]:
    """The shipped ct200 start run at 0.851 (a hand-edited unit) and cut by `journalctl --since` / `-n` after
    its server_args line: 0.001 x 92.80 GiB more pool (1,304 tokens of 76,416 B), that much less after it."""
    swap = {
        "#tokens: 101134": "#tokens: 102438",
        "max_total_num_tokens=101134": "max_total_num_tokens=102438",
        "KV size: 6.62 GB": "KV size: 6.71 GB",
        "Memory pool end. avail mem=13.90": "Memory pool end. avail mem=13.81",
        "avail mem=12.50": "avail mem=12.41",
        "available_gpu_mem=12.50": "available_gpu_mem=12.41",
    }
    out = []
    for line in GOOD:
        if "server_args" in line:
            continue
        for old, new in swap.items():
            line = line.replace(old, new)
        out.append(line)
    return out


# MEDIUM (over-prediction, silent): a start whose log lost its server_args line (`journalctl --since`, `-n
# 500`, a paste from "Load weight begin") does not say its fraction; plan/model.py start_of takes the plan's
# own (the inventory's 0.85), and calibrate.calibrated then "moves post by what the logged token count says"
# under that assumption, so the pool the start logged at its real fraction is predicted at 0.85: 102,438
# tokens where SGLang allocates 101,134 (the shipped start at 0.85 itself). Within CELL_AGREEMENT the error
# stays, and grows with the pool: 0.01 of fraction on an 80 GB card is ~0.8 GiB of pool. Nothing says the
# fraction was assumed. The memory lines (pre and post are measured whatever the fraction) are the evidence
# here, not the token count against a guessed fraction.
def test_a_start_whose_log_lost_its_fraction_is_not_fitted_at_the_plans(tmp_path: Path) -> None:
    log = write(tmp_path, "\n".join(ran_at_0851_without_server_args()) + "\n")
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "32k", "--json",
        "--mem-fraction-static", "0.85", "--from-log", log,
    )  # fmt: skip
    assert code in (0, 5), stderr
    assert json.loads(stdout)["predicted_pool_tokens"] <= 101_134 + 150  # 2-decimal logs: ~70 tokens each


# MEDIUM (a target that fits reported NOT FEASIBLE, exit 8; evidence mixed from two configurations):
# `journalctl -u sglang.service -b` on a host that first tried another layout or another model (TP 4, or
# Qwen3-235B before Kimi) which ran out of memory at 0.86. starts.plan_figures attaches every other failed
# start as "other_failures" and plan/failed.py bounds the fraction by each, without the identity check
# (plan/startcheck.py: architecture, model path, TP x PP) the evidence start itself passes: the plan for
# Kimi at TP 8 stays below 0.86 (0.816, 56,799 tokens, not feasible at 128k) where the same log without
# that foreign failure plans 0.873 and 131,125 tokens, feasible. A failure bounds only its own configuration.
@pytest.mark.parametrize(
    ("old", "new"),
    [("'tp_size': 8", "'tp_size': 4"), ("/models/Kimi-K2.6", "/models/Qwen3-235B-A22B")],
    ids=["other-tp", "other-model"],
)
def test_a_failed_start_of_another_configuration_does_not_bound_the_plan(
    tmp_path: Path, old: str, new: str
) -> None:
    failed = [line.replace("0.95", "0.86").replace(old, new) for line in OOM_AT_095]
    log = write(tmp_path, journal(failed, GOOD))
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "128k", "--json", "--from-log", log
    )
    assert code == 0, stderr
    assert json.loads(stdout)["mem_fraction_static"] == 0.873


# LOW (under-prediction of a defaulted fraction): with --pp-size above 1, SGLang 0.5.23 turns the breakable
# prefill CUDA graph off by default (arg_groups/cuda_graph_hook.py:150-161 "Disabling breakable prefill CUDA
# graph by default for pipeline parallelism"), so reserve_for_graph_mb (memory_hook.py:375-383) reserves no
# prefill-graph memory: 8 MiB per captured size (GQA) or 1.5 GiB (MLA). The planner still reserves it: TP 4 x
# PP 2 on H100 resolves 0.817 in SGLang for both; the planner says 0.811 (Llama-3.1-70B) and 0.798 (DeepSeek-V3).
@pytest.mark.parametrize(("model", "weights"), [("llama-3.1-70b", 141), ("deepseek-v3", 600)])
def test_pipeline_parallel_default_fraction_reserves_no_prefill_graph(model: str, weights: float) -> None:
    assert default_fraction(facts(model, weights, tp_size=4, pp_size=2)) == 0.817


# MEDIUM (over-prediction of a defaulted fraction, and of the graphs' memory): on a Hopper card of 60 GiB or
# more, a Qwen3-VL whose --max-running-requests is set above the card class's decode max bs (256 below TP 4)
# and at most 512 has its decode CUDA graphs captured up to that cap (arg_groups/model_overrides/qwen3_vl.py:
# 34-62 expand_multimodal_decode_graph_to_running_limit, called from memory_hook.py:195-197), so SGLang
# reserves 2 MiB per batch size more: 0.766 at a cap of 512 and 0.768 at 400 on H100 (the oracle); the planner
# keeps the class's 256 (memory_defaults.default_fraction) and says 0.771 for both, above SGLang's. The floor
# (predict.floor_of) sizes graphs to 256 the same way, where SGLang captures to the cap.
@pytest.mark.parametrize(("cap", "sglang"), [(512, 0.766), (400, 0.768)])
def test_qwen3_vl_on_hopper_captures_decode_graphs_to_its_cap(cap: int, sglang: float) -> None:
    fraction = default_fraction(facts("qwen3-vl-8b-instruct", 17.5, tp_size=1, max_running_requests=cap))
    assert round(fraction, 3) == sglang, fraction
