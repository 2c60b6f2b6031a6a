"""The SGLang start-up log parser: real pasted logs, then each line format one by one."""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sglang.logs import events as ev
from agent.sglang.logs.summary import StartSummary, SummaryBuilder, parse_line, summarize

# Real SGLang start-up logs that users pasted into public issue threads, verbatim, with the numbers read off
# each (the `derived` field) and their outcome.
CASES_PATH = Path(__file__).resolve().parents[1] / "data" / "sglang-real-logs.jsonl"


def _load_cases() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CASES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]


CASES = _load_cases()
real_logs = pytest.mark.skipif(not CASES, reason=f"real-log cases not found at {CASES_PATH}")

# Numbers the case records from the thread around the excerpt (launch command, notes), not from its
# text: the parser must report None for them rather than guess.
NOT_IN_EXCERPT = {
    ("ktransformers-1651-kimi-k2-thinking-3090-oom", "max_running_requests"),
    ("ktransformers-1651-kimi-k2-thinking-3090-oom", "mem_fraction_static"),
    ("ktransformers-1804-dsv3-tp2-kt", "max_running_requests"),
    ("ktransformers-1804-dsv3-tp2-kt", "mem_fraction_static"),
    ("sglang-1467-dsv25-capture-illegal-mem", "mem_fraction_static"),
    ("sglang-465-h100-llava-next-8b-oom-2024", "context_len"),
    ("sglang-4895-gemma3-27b-awq-4090-not-enough-mem", "mem_fraction_static"),
    ("sglang-pr4826-gemma3-4b-single-gpu-141g", "mem_fraction_static"),
    ("sglang-pr4840-gemma3-vision-test-mfs065", "mem_fraction_static"),
    ("vllm-21348-qwen3-235b-fp8-4xh100-sglang", "mem_fraction_static"),
}
# Failed starts whose excerpt stops before any error line: no failure can be read, and no readiness.
NO_ERROR_LINE = {
    "ktransformers-1751-dsv32-fp8kv",
    "ktransformers-1804-dsv3-tp2-kt",
    "sglang-6001-dsr1-mi308-v046",
}
# Where the excerpt names the cause, the kind must name it too.
EXPECTED_KIND = {
    "gpustack-3831-ascend910b2-qwen3-8b-mfs02": ev.NOT_ENOUGH_MEMORY,
    "sglang-1467-dsv25-capture-illegal-mem": ev.CUDA_GRAPH_FAILED,
    "sglang-165-mistral7b-quant-small-pool-runtime-2024": ev.SCHEDULER_EXCEPTION,
}
SUMMARY_FIELDS = set(StartSummary.__dataclass_fields__)


def _text(case: dict[str, Any]) -> str:
    segments = case.get("log_segments") or []
    return "\n".join(segments) if segments else str(case["log"])


@real_logs
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_real_log_numbers(case: dict[str, Any]) -> None:
    summary = summarize(_text(case).split("\n"))
    checked = 0
    for key, want in case["derived"].items():
        if key not in SUMMARY_FIELDS or want is None:
            continue
        got = getattr(summary, key)
        if (case["id"], key) in NOT_IN_EXCERPT:
            assert got is None, f"{key}: not in the excerpt, parser said {got}"
        else:
            assert got == want, f"{key}: want {want}, got {got}"
            checked += 1
    assert checked or case["outcome"] != "ok", "a healthy start must yield some number"


@real_logs
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_real_log_outcome(case: dict[str, Any]) -> None:
    summary = summarize(_text(case).split("\n"))
    if case["outcome"] == "ok":
        assert summary.failure is None, summary.failure
        return
    assert not summary.ready
    if case["id"] in NO_ERROR_LINE:
        assert summary.failure is None
        return
    assert summary.failure is not None
    assert summary.failure.failure_kind in ev.FAILURE_KINDS
    if case["id"] in EXPECTED_KIND:
        assert summary.failure.failure_kind == EXPECTED_KIND[case["id"]]


@real_logs
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_real_log_whole_text_equals_line_by_line(case: dict[str, Any]) -> None:
    builder = SummaryBuilder()
    builder.feed(_text(case))
    assert builder.summary() == summarize(_text(case).split("\n"))


# --- prefixes and line splitting -------------------------------------------------------------------

KV_LINE = "KV Cache is allocated. #tokens: 210000, KV size: 13.75 GB"


@pytest.mark.parametrize(
    ("prefix", "rank"),
    [
        ("", None),
        ("[2026-02-26 16:41:18] ", None),
        ("[2026-02-26 16:41:18 TP3] ", "TP3"),
        ("[2025-11-04 05:27:13 DP0 TP0 EP0] ", "DP0 TP0 EP0"),
        ("[2026-10-30 12:00:00.123 DP0 PP0 ATTN_CP0 MOE_DP0 TP7 EP7] ", "DP0 PP0 ATTN_CP0 MOE_DP0 TP7 EP7"),
        ("[2025-05-09 15:00:14 DP2 TP2 PP0] ", "DP2 TP2 PP0"),
        ("[gpu_id=1] ", "gpu_id=1"),
    ],
)
def test_prefix_gives_rank(prefix: str, rank: str | None) -> None:
    (event,) = parse_line(prefix + KV_LINE)
    assert isinstance(event, ev.KvPool)
    assert (event.rank, event.tokens, event.size_gb) == (rank, 210000, 13.75)


def test_journalctl_output_pasted_into_a_file() -> None:
    (a,) = parse_line(f"Nov 04 05:27:13 gpu1 python3[4242]: [2025-11-04 05:27:13 TP1] {KV_LINE}")
    (b,) = parse_line("Nov 04 05:27:14 gpu1 python3[4242]: torch.OutOfMemoryError: CUDA out of memory.")
    assert isinstance(a, ev.KvPool) and a.rank == "TP1"
    assert isinstance(b, ev.Failure) and b.failure_kind == ev.CUDA_OOM


def test_tqdm_redraws_split_on_carriage_return() -> None:
    bar = "Loading safetensors checkpoint shards: {p:3d}% Completed | {n}/4 [00:0{n}<00:03,  1.20it/s]"
    text = "\r".join(bar.format(p=n * 25, n=n) for n in range(5))
    events = parse_line(text)
    assert [(e.percent, e.n, e.total) for e in events if isinstance(e, ev.WeightsProgress)] == [
        (0, 0, 4),
        (25, 1, 4),
        (50, 2, 4),
        (75, 3, 4),
        (100, 4, 4),
    ]
    builder = SummaryBuilder()
    builder.feed(text)
    assert (builder.weights_percent, builder.phase) == (100, "loading_weights")


@pytest.mark.parametrize("loader", ["Multi-thread loading shards", "Loading pt checkpoint shards"])
def test_progress_variants(loader: str) -> None:
    (e,) = parse_line(f"{loader}:  50% Completed | 8/16 [00:04<00:04,  2.00it/s]")
    assert isinstance(e, ev.WeightsProgress) and (e.percent, e.n, e.total) == (50, 8, 16)


def test_a_line_glued_to_a_progress_bar_is_split_off() -> None:
    """tqdm ends a bar without a newline, so the next logger line follows it on the same line (a real
    case: sglang-pr17392); a logger line ends with its own newline, so a prefix later in it is its text."""
    bar = "Multi-thread loading shards:  94% Completed | 15/16 [00:04<00:00,  3.89it/s]"
    text = (
        f"{bar}[2026-05-07 13:39:14 DP1 TP1 EP1] Load weight end. elapsed=5.05 s, type=Qwen3MoeForCausalLM, "
        "avail mem=121.90 GB, mem usage=16.39 GB."
        f"[2026-05-07 13:39:15 DP1 TP1 EP1] {KV_LINE}"
    )
    kinds = [(e.kind, e.rank) for e in parse_line(text)]
    assert kinds == [("weights_progress", None), ("weights_end", "DP1 TP1 EP1")]
    kinds = [(e.kind, e.rank) for e in parse_line(f"{bar}[2026-05-07 13:39:15 DP1 TP1 EP1] {KV_LINE}")]
    assert kinds == [("weights_progress", None), ("kv_pool", "DP1 TP1 EP1")]


def test_brackets_inside_a_message_are_not_a_new_line() -> None:
    (e,) = parse_line("[2025-10-16 09:06:22 TP0] Load weight end. type=X [2025-10-16], avail mem=1.00 GB.")
    assert isinstance(e, ev.WeightsEnd) and e.avail_gb == 1.0


# --- line formats per version ----------------------------------------------------------------------


def test_weights_lines_0_4() -> None:
    begin, end = parse_line(
        "[2025-05-04 01:05:30 TP0] Load weight begin. avail mem=185.29 GB\n"
        "[2025-05-04 01:05:35 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=103.67 GB, mem usage=81.66 GB."
    )
    assert begin == ev.WeightsBegin("TP0", 185.29)
    assert end == ev.WeightsEnd("TP0", 103.67, 81.66, "DeepseekV3ForCausalLM", False)


def test_weights_end_0_5_2x_with_quant_fields() -> None:
    (e,) = parse_line(
        "[2026-10-30 12:01:10 TP2] Load weight end. elapsed=68.10 s, type=KimiK25ForConditionalGeneration, "
        "quant=fp8, fmt=e4m3, avail mem=19.88 GB, mem usage=73.58 GB."
    )
    assert e == ev.WeightsEnd("TP2", 19.88, 73.58, "KimiK25ForConditionalGeneration", False)


@pytest.mark.parametrize(
    "model_type", ["DFlash2DraftModel", "LlamaForCausalLMEagle3", "DeepseekV3ForCausalLMNextN", "MiMoMTP"]
)
def test_draft_model_types(model_type: str) -> None:
    (e,) = parse_line(
        f"Load weight end. elapsed=1.0 s, type={model_type}, avail mem=20.00 GB, mem usage=1.00 GB."
    )
    assert isinstance(e, ev.WeightsEnd) and e.is_draft


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("KV Cache is allocated. #tokens: 5874221, K size: 67.23 GB, V size: 67.23 GB", (5874221, 134.46, 67.23, 67.23, None, None)),
        ("KV Cache is allocated. #tokens: 161488, KV size: 10.57 GB", (161488, 10.57, None, None, None, None)),
        ("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 2454421, KV size: 160.63 GB", (2454421, 160.63, None, None, "torch.bfloat16", None)),
        ("KV Cache is allocated. dtype: fp8_e4m3, #tokens: 90000, K size: 1.50 GB, V size: 1.50 GB", (90000, 3.0, 1.5, 1.5, "fp8_e4m3", None)),
        ("Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 375360, K size: 4.82 GB, V size: 3.21 GB", (375360, 8.03, 4.82, 3.21, "torch.bfloat16", "Full")),
        ("SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB", (300288, 13.97, 8.38, 5.59, "torch.bfloat16", "SWA")),
        ("KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 900000, K size: 30.00 GB, V size: 30.00 GB", (900000, 60.0, 30.0, 30.0, "torch.bfloat16", "va_upper_bound")),
        ("Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 812345, KV size: 54.20 GB, avail mem=3.10 GB", (812345, 54.2, None, None, "torch.bfloat16", "post_capture")),
    ],
)  # fmt: skip
def test_kv_pool_formats(
    line: str, expected: tuple[int, float, float | None, float | None, str | None, str | None]
) -> None:
    """expected: tokens, size, K and V size (GB), dtype, label."""
    (e,) = parse_line("[2026-10-30 12:01:11 TP0] " + line)
    assert isinstance(e, ev.KvPool)
    assert (e.tokens, e.size_gb, e.k_gb, e.v_gb, e.dtype, e.label) == expected


def test_memory_pool_and_graph_lines() -> None:
    events = parse_line(
        "[2026-01-23 09:10:36 TP1] Memory pool end. avail mem=30.11 GB\n"
        "[2026-01-23 09:10:37 TP1] Capture cuda graph begin. This can take up to several minutes. avail mem=30.10 GB\n"
        "[2025-11-30 12:50:15 TP1] Capture cuda graph end. Time elapsed: 5.37 s. mem usage=1.44 GB. avail mem=38.05 GB.\n"
        "[2025-03-28 04:27:12 TP1] Capture cuda graph end. Time elapsed: 4.00 s. avail mem=0.10 GB. mem usage=0.20 GB.\n"
        "[2026-10-30 12:01:12 TP1] Capture target decode CUDA graph begin. backend=fa3, num_tokens_per_req=1, "
        "bs=[1, 2, 4], avail mem=5.05 GB\n"
        "[2026-10-30 12:01:20 TP1] Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=8.00 s, "
        "mem usage=0.90 GB, avail mem=4.15 GB."
    )
    assert events == [
        ev.MemoryPoolEnd("TP1", 30.11),
        ev.GraphBegin("TP1", 30.10),
        ev.GraphEnd("TP1", 38.05, 1.44),
        ev.GraphEnd("TP1", 0.10, 0.20),
        ev.GraphBegin("TP1", 5.05),
        ev.GraphEnd("TP1", 4.15, 0.90),
    ]


def test_scheduler_line_pairs_read_one_by_one() -> None:
    (full,) = parse_line(
        "[2026-02-27 17:10:29 TP0] max_total_num_tokens=580364, chunked_prefill_size=2048, "
        "max_prefill_tokens=16384, max_running_requests=1, context_len=8192, available_gpu_mem=3.63 GB"
    )
    (old,) = parse_line(
        "[2025-05-01 10:00:00 TP0] max_total_num_tokens=161488, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=163840"
    )
    (sparse,) = parse_line("[2025-05-01 10:00:00 TP0] max_total_num_tokens=90000, context_len=131072")
    assert full == ev.Scheduler("TP0", 580364, 8192, 1, 2048, 3.63)
    assert old == ev.Scheduler("TP0", 161488, 163840, 2048, 8192, None)
    assert sparse == ev.Scheduler("TP0", 90000, 131072, None, None, None)


def test_server_args_repr_and_dict() -> None:
    (repr_form,) = parse_line(
        "[2025-10-06 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=8, mem_fraction_static=0.85, "
        "max_running_requests=None, context_length=200000, watchdog_timeout=300)"
    )
    (dict_form,) = parse_line(
        "[2026-10-30 12:00:00] server_args={'model_path': '/m', 'mem_fraction_static': 0.826, "
        "'context_length': None, 'max_running_requests': 64}"
    )
    assert repr_form == ev.ServerArgs(None, 0.85, 200000, None, "server_args", (8, 8))  # tp_size=8: 8 ranks
    assert dict_form == ev.ServerArgs(None, 0.826, None, 64, "server_args")


def test_server_args_repr_is_only_settings() -> None:
    events = parse_line(
        "[2025-10-06 10:00:00] server_args=ServerArgs(model_path='/models/KV Cache is allocated', "
        "mem_fraction_static=0.8, max_total_tokens=None, watchdog_timeout=300.0, enable_metrics=False)"
    )
    assert events == [ev.ServerArgs(None, 0.8, None, None, "server_args")]


def test_uvicorn_and_ready() -> None:
    assert parse_line(
        "[2026-10-30 12:00:00] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)\n"
        "[2026-10-30 12:00:09] The server is fired up and ready to roll!"
    ) == [ev.UvicornRunning(None, "http://0.0.0.0:30000"), ev.Ready(None)]


@pytest.mark.parametrize(
    "line",
    [
        "max_total_tokens=300000 is larger than the profiled value 210000. Use the profiled value instead.",
        "Warning: User-specified context_length (262144) is greater than the derived context_length (131072). "
        "This may lead to incorrect model outputs or CUDA errors.",
        "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.",
        "The available memory for KV cache is 9.19 GB.",
        "Mamba Cache is allocated. max_mamba_cache_size: 82, conv_state size: 0.13GB, ssm_state size: 7.29GB",
        "Capturing batches (bs=1 avail_mem=38.07 GB): 100%|████████| 52/52 [00:04<00:00, 10.83it/s]",
        "Capture cuda graph bs [1, 2, 4, 8, 12, 16]",
        "Init torch distributed ends. elapsed=3.20 s, mem usage=2.01 GB",
        "Memory baseline taken. mem usage=2.10 GB",
        "KV pool holds 150000 tokens, fewer than --context-length 200000. One full-length request cannot fit.",
        'INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK',
        "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0",
        "Exception ignored in: <function _removeHandlerRef at 0x7f>",
        "/usr/lib/python3/site-packages/torch/cuda/__init__.py:61: FutureWarning: pynvml is deprecated.",
        "Load weight end. Committed real weights after CUDA graph capture in 2.10 s (overlap loading)",
        "Automatically adjust --chunked-prefill-size for small GPUs.",
        "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
        "setting --max-running-requests.",
        "$ python -m sglang.launch_server --model deepseek-ai/DeepSeek-V3.2-Exp --tp 8",
        "",
        "   ",
    ],
)
def test_near_miss_lines_give_no_event(line: str) -> None:
    assert parse_line(line) == []
    assert parse_line("[2026-10-30 12:00:00 TP0] " + line) == []


# --- failures --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", ev.NOT_ENOUGH_MEMORY),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 95.00 GiB", ev.CUDA_OOM),
        ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB.", ev.CUDA_OOM),
        ("RuntimeError: CUDA error: out of memory", ev.CUDA_OOM),
        ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.00 GiB.", ev.CUDA_OOM),
        ("[2025-11-28 11:19:49 TP0] Scheduler hit an exception: Traceback (most recent call last):", ev.SCHEDULER_EXCEPTION),
        ("Traceback (most recent call last):", ev.SCHEDULER_EXCEPTION),
        ('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2630, in run_scheduler_process', ev.SCHEDULER_EXCEPTION),
        ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 196608, Hardware limit: 65536", ev.SCHEDULER_EXCEPTION),
        ("[2026-02-26 16:41:30] Received sigquit from a child process. It usually means the child failed.", ev.SIGQUIT),
        ("[2026-02-26 16:41:30] SIGQUIT received. signum=None, frame=None. It usually means one child failed.", ev.SIGQUIT),
        ("Rank 3 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer.", ev.RANK_DIED),
        ("Subprocess scheduler_0 (pid=4242) crashed with exit code -11. Triggering SIGQUIT for cleanup...", ev.RANK_DIED),
        ("The memory capacity is unbalanced. Some GPUs may be occupied by other processes. pre_model_load_memory=60.1, local_gpu_memory=93.4, local_gpu_memory * 0.9=84.06", ev.MEMORY_UNBALANCED),
        ("ValueError: User-specified context_length (300000) is greater than the derived context_length (262144). To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1", ev.CONTEXT_TOO_LONG),
        ("Exception: Capture cuda graph failed: Triton Error [CUDA]: an illegal memory access was encountered", ev.CUDA_GRAPH_FAILED),
        ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.", ev.CUDA_GRAPH_FAILED),
        ("Exception: Capture prefill CUDA graph failed: boom", ev.CUDA_GRAPH_FAILED),
        ("AssertionError: Memory pool size is too small", ev.NEGATIVE_POOL),
        ("KV Cache is allocated. #tokens: -512, KV size: 0.00 GB", ev.NEGATIVE_POOL),
        ("ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use", ev.ADDRESS_IN_USE),
        ("OSError: [Errno 98] Address already in use", ev.ADDRESS_IN_USE),
        ("[2026-02-26 16:41:30] Initialization failed. Please see the error messages above.", ev.INIT_FAILED),
        ("Initialization failed. warmup error: Traceback (most recent call last):", ev.INIT_FAILED),
        ("launch_server.py: error: argument --tp-size: invalid int value: 'x'", ev.START_REFUSED),
        ("sglang serve: error: unrecognized arguments: --bogus", ev.START_REFUSED),
        ("Watchdog timeout (self.watchdog_timeout=300)", ev.WATCHDOG_TIMEOUT),
        ("Scheduler watchdog timeout (watchdog_timeout=300.0, soft=False)", ev.WATCHDOG_TIMEOUT),
        ("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.", ev.WATCHDOG_TIMEOUT),
        ("Fatal Python error: Segmentation fault", ev.RANK_DIED),
    ],
)  # fmt: skip
def test_failure_kinds(line: str, kind: str) -> None:
    failures = [e for e in parse_line(line) if isinstance(e, ev.Failure)]
    assert [f.failure_kind for f in failures] == [kind]
    assert failures[0].line == line


def test_weights_leave_no_memory_states_the_minimum() -> None:
    line = (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.80. "
        "Raise --mem-fraction-static above 0.913 (minimum viable = 1 - available/pre = 0.9127). "
        "If using speculative decoding, draft weights are now counted."
    )
    events = parse_line(line)
    assert ev.Failure(None, ev.WEIGHTS_LEAVE_NO_MEMORY, line, 2, 0.9127) in events
    assert summarize([line]).mem_fraction_static == 0.80


@pytest.mark.parametrize(
    ("tail", "mfs"),
    [
        ("", None),
        (" Current value: self.server_args.mem_fraction_static=0.85", 0.85),
        (" Current value: mem_fraction_static=0.7", 0.7),
    ],
)
def test_not_enough_memory_variants(tail: str, mfs: float | None) -> None:
    s = summarize(["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." + tail])
    assert s.failure is not None and s.failure.failure_kind == ev.NOT_ENOUGH_MEMORY
    assert s.mem_fraction_static == mfs


@pytest.mark.parametrize(
    ("lines", "kind", "line_index"),
    [
        # A traceback header, then the cause: the cause wins.
        (["[t TP0] Scheduler hit an exception: Traceback (most recent call last):", '  File "a.py", line 1, in f',
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."], ev.CUDA_OOM, 2),
        # The cause first, then the consequences: the cause stays.
        (["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
          "[2026-01-01 00:00:01] Received sigquit from a child process. It usually means the child failed.",
          "torch.OutOfMemoryError: CUDA out of memory."], ev.NOT_ENOUGH_MEMORY, 0),
        # A bare exception line names what happened better than the header.
        (["Traceback (most recent call last):", '  File "a.py", line 1, in f',
          "AttributeError: 'NoneType' object has no attribute 'cpu'"], ev.SCHEDULER_EXCEPTION, 2),
        # An OOM inside graph capture is re-raised as a capture failure: that names the fix.
        (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0.70 GiB.", "During handling of the above exception, another exception occurred:",
          "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 0.70 GiB.",
          "[2026-01-01 00:00:01] Received sigquit from a child process. It usually means the child failed."], ev.CUDA_GRAPH_FAILED, 2),
        # Two causes otherwise: the first stays.
        (["The memory capacity is unbalanced. Some GPUs may be occupied by other processes.",
          "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], ev.MEMORY_UNBALANCED, 0),
        # A consequence does not replace the header: the first of equal weight is kept.
        (["Traceback (most recent call last):", "Received sigquit from a child process."], ev.SCHEDULER_EXCEPTION, 0),
    ],
)  # fmt: skip
def test_root_cause_rule(lines: list[str], kind: str, line_index: int) -> None:
    s = summarize(lines)
    assert s.failure is not None
    assert (s.failure.failure_kind, s.failure.line) == (kind, lines[line_index])
    assert s.to_dict()["failure"] == {"kind": kind, "line": lines[line_index]}


# --- summaries -------------------------------------------------------------------------------------


def _p(rank: str, msg: str) -> str:
    return f"[2026-10-30 12:00:00 {rank}] {msg}"


def test_interleaved_ranks_take_the_minimum() -> None:
    lines = [
        _p("TP1", "Load weight begin. avail mem=93.40 GB"),
        _p("TP0", "Load weight begin. avail mem=93.47 GB"),
        _p("TP0", "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=19.90 GB, mem usage=73.58 GB."),
        _p("TP1", "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=19.81 GB, mem usage=73.58 GB."),
        _p("TP1", "KV Cache is allocated. #tokens: 210000, KV size: 13.75 GB"),
        _p("TP0", "KV Cache is allocated. #tokens: 210000, KV size: 13.75 GB"),
    ]  # fmt: skip
    s = summarize(lines)
    assert (s.avail_mem_before_weights_gb, s.avail_mem_after_weights_gb) == (93.40, 19.81)
    assert s.avail_mem_before_pool_gb == 19.81
    assert (s.kv_tokens, s.kv_size_gb, s.draft_kv_tokens) == (210000, 13.75, None)


def test_draft_loaded_before_the_pool_0_5_14() -> None:
    lines: list[str] = []
    for r, free in (("TP0", 20.0), ("TP1", 19.5)):
        lines += [
            _p(r, "Load weight begin. avail mem=93.00 GB"),
            _p(r, f"Load weight end. elapsed=60.0 s, type=KimiK25ForConditionalGeneration, avail mem={free:.2f} GB, mem usage=73.00 GB."),
            _p(r, f"Load weight begin. avail mem={free:.2f} GB"),
            _p(r, f"Load weight end. elapsed=2.0 s, type=LlamaForCausalLMEagle3, avail mem={free - 1.5:.2f} GB, mem usage=1.50 GB."),
        ]  # fmt: skip
    for r in ("TP0", "TP1"):
        lines += [
            _p(r, "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 200064, KV size: 13.10 GB"),
            _p(r, "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 200064, KV size: 0.90 GB"),
        ]
    lines.append(
        _p(
            "TP0",
            "max_total_num_tokens=200064, max_running_requests=48, context_len=200000, available_gpu_mem=2.10 GB",
        )
    )
    s = summarize(lines)
    assert s.avail_mem_before_weights_gb == 93.0
    assert s.avail_mem_after_weights_gb == 19.5
    assert s.avail_mem_before_pool_gb == 18.0
    assert (s.kv_tokens, s.kv_size_gb, s.draft_kv_tokens) == (200064, 13.10, 200064)
    assert (s.max_running_requests, s.context_len, s.available_gpu_mem_gb) == (48, 200000, 2.10)


def test_draft_after_target_graphs_0_5_13_same_model_type() -> None:
    builder = SummaryBuilder()
    for line in [
        _p(
            "TP0",
            "Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=40.00 GB, mem usage=60.00 GB.",
        ),
        _p("TP0", "KV Cache is allocated. #tokens: 500000, K size: 15.00 GB, V size: 15.00 GB"),
        _p("TP0", "Capture cuda graph end. Time elapsed: 5.00 s. mem usage=1.00 GB. avail mem=8.00 GB."),
        _p("TP0", "Load weight begin. avail mem=8.00 GB"),
    ]:
        builder.feed(line)
    (draft_end,) = builder.feed(_p("TP0", "Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=7.00 GB, mem usage=1.00 GB."))  # fmt: skip
    (draft_pool,) = builder.feed(
        _p("TP0", "KV Cache is allocated. #tokens: 500000, K size: 1.00 GB, V size: 1.00 GB")
    )
    assert isinstance(draft_end, ev.WeightsEnd) and draft_end.is_draft
    assert isinstance(draft_pool, ev.KvPool) and draft_pool.is_draft
    s = builder.summary()
    assert (s.avail_mem_after_weights_gb, s.avail_mem_before_pool_gb) == (40.0, 40.0)
    assert (s.kv_tokens, s.kv_size_gb, s.k_size_gb, s.draft_kv_tokens) == (500000, 30.0, 15.0, 500000)


def test_swa_sub_pools_are_not_a_draft() -> None:
    lines = [
        _p("TP0", "KV Cache is allocated. #tokens: 1496958, K size: 41.76 GB, V size: 27.84 GB"),
        _p("TP0", "KV Cache is allocated. #tokens: 1496958, K size: 4.82 GB, V size: 3.21 GB"),
        _p("TP0", "SWAKVPool mem usage: 77.63 GB, swa size: 1496958, full size: 1496958"),
    ]
    labelled = [
        _p("TP0", "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB"),
        _p("TP0", "Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 375360, K size: 1.00 GB, V size: 1.00 GB"),
    ]  # fmt: skip
    assert (summarize(lines).kv_tokens, summarize(lines).draft_kv_tokens) == (1496958, None)
    assert (summarize(labelled).kv_tokens, summarize(labelled).draft_kv_tokens) == (300288, None)


def test_post_capture_resize_is_the_target_pool() -> None:
    s = summarize([
        _p("TP0", "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 900000, K size: 30.00 GB, V size: 30.00 GB"),
        _p("TP0", "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 812345, KV size: 54.20 GB, avail mem=3.10 GB"),
    ])  # fmt: skip
    assert (s.kv_tokens, s.kv_size_gb, s.draft_kv_tokens) == (812345, 54.2, None)


def test_settings_precedence() -> None:
    s = summarize([
        "python3 -m sglang.launch_server --model-path /m --mem-fraction-static 0.7 --context-length 4096 --max-running-requests 8",
        "[2025-07-14 14:05:13] server_args=ServerArgs(model_path='/m', mem_fraction_static=0.72, context_length=None)",
        "[2025-07-14 14:05:13] Automatically reduce --mem-fraction-static to 0.540 because this is a multimodal model.",
    ])  # fmt: skip
    assert (s.mem_fraction_static, s.context_len, s.max_running_requests) == (0.54, 4096, 8)


def test_phase_progression_and_ready() -> None:
    builder = SummaryBuilder()
    seen = [builder.phase]
    for line in [
        _p("TP0", "Load weight begin. avail mem=93.00 GB"),
        _p("TP0", "Load weight end. type=X, avail mem=20.00 GB, mem usage=73.00 GB."),
        _p("TP0", "Capture cuda graph begin. This can take up to several minutes. avail mem=5.00 GB"),
        "[2026-10-30 12:00:00] The server is fired up and ready to roll!",
    ]:
        builder.feed(line)
        seen.append(builder.phase)
    assert seen == ["starting", "loading_weights", "kv_pool", "cuda_graphs", "ready"]
    assert builder.summary().ready
    builder.feed(
        "[2026-10-30 12:09:00] SIGQUIT received. signum=None, frame=None. It usually means one child failed."
    )
    assert builder.phase == "failed"


def test_to_dict_keys_are_the_contract() -> None:
    d = summarize([]).to_dict()
    assert set(d) == {
        "kv_tokens",
        "kv_size_gb",
        "draft_kv_tokens",
        "max_total_num_tokens",
        "context_len",
        "max_running_requests",
        "avail_mem_before_weights_gb",
        "avail_mem_after_weights_gb",
        "avail_mem_before_pool_gb",
        "available_gpu_mem_gb",
        "mem_fraction_static",
        "ready",
        "failure",
        "stopped",
        "startup_timings",
    }
    assert d["ready"] is False and d["failure"] is None and d["kv_tokens"] is None
    json.dumps(d)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_any_text_parses_without_error(text: str) -> None:
    for e in parse_line(text):
        assert e.kind in {
            "weights_begin", "weights_progress", "weights_end", "kv_pool", "swa_pool", "memory_pool_end",
            "graph_begin", "graph_end", "scheduler", "server_args", "uvicorn_running", "ready", "failure",
        }  # fmt: skip
