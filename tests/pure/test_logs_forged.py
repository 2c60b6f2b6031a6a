"""Lines a user controls (prompts in SGLang's request log) must not move the gate's or planner's figures.

SGLang 0.5.23 logs requests with `--log-requests` through srt/utils/request_logger.py: the message is
`Receive: obj=...`, `Receive OpenAI: obj=...` or `Finish: obj=..., out=...` (strings repr'd), or one JSON
object per line with `--log-requests-format json` (srt/utils/log_utils.py log_json); both go through a
logger formatted `[%(asctime)s] %(message)s`. Every pattern is anchored to SGLang's own prefix and the
message position, so text inside such a message is never read as a start-up line.
"""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

import json

import pytest

from agent.sglang.logs import events as ev
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.summary import summarize

T = "[2026-12-03 18:47:10] "
# What a user may type: each is a real SGLang line, meant to be mistaken for one.
PAYLOADS = [
    "KV Cache is allocated. #tokens: 1, KV size: 0.00 GB",
    "[2026-12-03 18:46:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-03 18:46:03 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "CUDA out of memory",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.1",
    "max_total_num_tokens=1, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=1, context_len=4096, available_gpu_mem=1.00 GB",
    "Load weight end. elapsed=0.06 s, type=LlamaForCausalLM, avail mem=1.00 GB, mem usage=99.00 GB.",
    "Memory pool end. avail mem=0.01 GB",
    "Scheduler hit an exception: Traceback (most recent call last):",
    "Subprocess scheduler_0 (pid=1) crashed with exit code 1. Triggering SIGQUIT for cleanup...",
    "SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
    "The server is fired up and ready to roll!",
    "python3 -m sglang.launch_server --model-path /m --mem-fraction-static 0.1 --context-length 9",
    "server_args=ServerArgs(mem_fraction_static=0.1, context_length=9)",
    "Automatically reduce --mem-fraction-static to 0.100 because this is a multimodal model.",
    "Address already in use",
    "Capture cuda graph failed: boom",
]


def _request_lines(payload: str) -> list[str]:
    """The forms SGLang 0.5.23's request logger writes a prompt in (text and JSON formats)."""
    text = repr(payload)
    return [
        f"{T}Receive: obj=GenerateReqInput(validation_time=0.0001, received_time=1764787630.1, text={text}, input_ids=None, sampling_params={{'max_new_tokens': 8}}, rid='ab12', stream=False)",
        f"{T}Receive OpenAI: obj={{'messages': [{{'role': 'user', 'content': {text}}}], 'model': 'tiny'}}",
        f"{T}Finish: obj=GenerateReqInput(text={text}, rid='ab12'), out={{'text': {text}, 'meta_info': {{'id': 'ab12'}}}}",
        T
        + json.dumps(
            {
                "timestamp": "2026-12-03T18:47:10",
                "event": "request.received",
                "rid": "ab12",
                "obj": {"text": payload},
            }
        ),
        # journalctl's own prefix, as `journalctl -u sglang` prints a line (parse-log reads such files)
        f"Dec 03 18:47:10 host python3[4242]: {T}Receive: obj=GenerateReqInput(text={text}, rid='ab12')",
    ]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_prompt_in_the_request_log_gives_no_event(payload: str) -> None:
    for line in _request_lines(payload):
        assert parse_line(line) == [], line


START = [
    "[2026-12-03 18:46:02] Load weight begin. avail mem=21.63 GB",
    "[2026-12-03 18:46:02] Load weight end. elapsed=0.06 s, type=LlamaForCausalLM, avail mem=21.63 GB, mem usage=0.00 GB.",
    "[2026-12-03 18:46:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 16384, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-03 18:46:03] Memory pool end. avail mem=21.59 GB",
    "[2026-12-03 18:46:03] max_total_num_tokens=16384, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=2048, context_len=4096, available_cpu_mem=21.59 GB",
    "[2026-12-03 18:46:03] INFO:     Uvicorn running on http://127.0.0.1:30123 (Press CTRL+C to quit)",
]


def test_forged_lines_between_uvicorn_and_ready_change_no_figure() -> None:
    """The gate's window: the port is open before `ready to roll`, so a request can be logged in it."""
    honest = summarize([*START, "[2026-12-03 18:46:04] The server is fired up and ready to roll!"])
    forged = [line for p in PAYLOADS for line in _request_lines(p)]
    mixed = summarize([*START, *forged, "[2026-12-03 18:46:04] The server is fired up and ready to roll!"])
    assert mixed == honest
    assert (mixed.kv_tokens, mixed.draft_kv_tokens, mixed.failure) == (16384, None, None)


def test_forged_lines_without_a_ready_line_give_no_failure_nor_readiness() -> None:
    forged = [line for p in PAYLOADS for line in _request_lines(p)]
    s = summarize([*START, *forged])
    assert (s.ready, s.failure, s.kv_tokens, s.mem_fraction_static) == (False, None, 16384, None)


@pytest.mark.parametrize(
    "line",
    [
        # Text later in a logger message, at no message position
        "[2026-12-03 18:47:10] Prefill batch. #new-seq: 1, note: KV Cache is allocated. #tokens: 1",
        "[2026-12-03 18:47:10] Error in request: Not enough memory. Please try to increase --mem-fraction-static.",
        "[2026-12-03 18:47:10] Got prompt: The server is fired up and ready to roll!",
        "[2026-12-03 18:47:10] tokenizer warning: CUDA out of memory",
    ],
)
def test_a_pattern_away_from_the_message_position_gives_no_event(line: str) -> None:
    assert parse_line(line) == []


def test_real_lines_still_read_at_their_position() -> None:
    """The same texts at SGLang's own message position are read (the anchoring keeps the real lines)."""
    kinds = [e.kind for line in START for e in parse_line(line)]
    assert kinds == [
        "weights_begin",
        "weights_end",
        "kv_pool",
        "memory_pool_end",
        "scheduler",
        "uvicorn_running",
    ]
    oom = parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert [e.failure_kind for e in oom if isinstance(e, ev.Failure)] == [ev.CUDA_OOM]
    crash = parse_line(
        "[2026-12-03 18:47:10] Subprocess scheduler_0 (pid=77) crashed with exit code 1. Triggering SIGQUIT for cleanup..."
    )
    assert [e.failure_kind for e in crash if isinstance(e, ev.Failure)] == [ev.RANK_DIED]


def test_figures_are_final_once_the_start_is_ready() -> None:
    """Defence in depth for what anchoring cannot see: a line of the serving phase that begins with a
    start-up message (a prompt with a raw newline quoted in some error) does not move the start's figures."""
    ready = "[2026-12-03 18:46:04] The server is fired up and ready to roll!"
    honest = summarize([*START, ready])
    later = [
        "KV Cache is allocated. #tokens: 1, KV size: 0.00 GB",
        "[2026-12-03 18:50:00] KV Cache is allocated. #tokens: 1, KV size: 0.00 GB",
        "[2026-12-03 18:50:00] max_total_num_tokens=1, context_len=9",
        "[2026-12-03 18:50:00] Load weight end. type=X, avail mem=0.10 GB, mem usage=1.00 GB.",
        "server_args=ServerArgs(mem_fraction_static=0.1)",
    ]
    assert summarize([*START, ready, *later]) == honest


@pytest.mark.parametrize(
    "journal_prefix",
    [
        "Dec 03 18:46:03 host python3[4242]: ",  # journalctl (short)
        "Dec 03 18:46:03.123456 host python3[4242]: ",  # -o short-precise
        "2026-12-03T18:46:03+0000 host python3[4242]: ",  # -o short-iso
        "2026-12-03T18:46:03.123456+00:00 host sglang[4242]: ",  # -o short-iso-precise
    ],
)
def test_journalctl_prefixes_of_a_pasted_log(journal_prefix: str) -> None:
    (kv,) = parse_line(journal_prefix + START[2])
    assert isinstance(kv, ev.KvPool) and kv.tokens == 16384
    forged = _request_lines(PAYLOADS[0])[0]
    assert parse_line(journal_prefix + forged) == []
