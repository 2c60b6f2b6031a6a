"""Recognise the lines of a failed SGLang start and name their cause (a failure kind).

Every pattern is anchored at the message position: the start of the text after SGLang's logger prefix
(srt/utils/common.py configure_logger: `[%(asctime)s{prefix}] %(message)s`), or the start of an unprefixed
line (a traceback or a message printed by Python itself), after the exception class names and the level
word that lead it ("torch.OutOfMemoryError: ", "Exception: ", uvicorn's "ERROR:    "). Text later in a
message — a user's prompt in `--log-requests` output, say — is never read as a failure.
"""

from __future__ import annotations

import re

from agent.sglang.logs import events as ev
from agent.sglang.logs import hicache, pd

# Weights of a failure line (see log_events.Failure): the summary keeps the first line of the highest weight.
HEADER, EXCEPTION, CAUSE = 0, 1, 2

_MIN_VIABLE = re.compile(r"minimum viable = [^=]*= ?(\d+(?:\.\d+)?)")
_RAISE_ABOVE = re.compile(r"above (\d+(?:\.\d+)?)")
# What leads the cause in a line: uvicorn's level word, then exception class names ("Exception: Capture...")
_LEAD = re.compile(r"(?:(?:ERROR|CRITICAL):\s+)?(?:(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception): )*")
# Also torch's driver-API wording under expandable segments (c10/cuda/driver_api.h:
# "CUDA driver error: out of memory") and NCCL's in a captured all-reduce ("Cuda failure 'out of memory'").
_OOM = re.compile(
    r"(?:(?:CUDA|HIP|NPU|XPU|GPU) out of memory|CUDA (?:driver )?error: out of memory"
    r"|(?:.*NCCL WARN )?Cuda failure '?out of memory)"
)
_ARGPARSE = re.compile(r"(?:[\w./-]+ ){0,2}[\w./-]+: error: ")
_FRAME = re.compile(r'\s+File "[^"]*", line \d+')
# The last line of a Python traceback: a dotted exception class name, then ": message" or nothing.
_EXC_LINE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception|OutOfResources|Exit)(?:: |:?$)"
)
# (pattern matched at the cause's position, kind, weight), tried in order after the special cases.
# The SGLang 0.5.23 file that prints each is named where the wording is its own.
_CAUSES: tuple[tuple[re.Pattern[str], str, int], ...] = tuple(
    (re.compile(p), kind, weight)
    for p, kind, weight in (
        (r"Not enough memory\b", ev.NOT_ENOUGH_MEMORY, CAUSE),  # model_executor/model_runner.py
        # 0.5.23 hybrid pools (mem_cache/kv_cache_configurator.py, model_executor/pool_configurator.py)
        (r"Not enough GPU memory for hybrid", ev.NOT_ENOUGH_MEMORY, CAUSE),
        (r"Hybrid \([^)]*\) state cache is too small to serve any requests", ev.NOT_ENOUGH_MEMORY, CAUSE),
        (
            r"SWA pool \(\d+ tokens\) cannot hold even one request: "
            r"the prefill admission floor is sliding_window_size",
            ev.NOT_ENOUGH_MEMORY,
            CAUSE,
        ),
        (r"SWA pool cap \([^)]*\) leaves no room for the full KV pool", ev.NOT_ENOUGH_MEMORY, CAUSE),
        *((refusal, ev.HOST_MEMORY_SHORT, CAUSE) for refusal in hicache.REFUSALS),  # HiCache's host pool
        *((mismatch, kind, CAUSE) for mismatch, kind in pd.MISMATCHES),  # a PD decode against its prefill
        (r"The memory capacity is unbalanced", ev.MEMORY_UNBALANCED, CAUSE),
        (
            r"Capture [\w ]*?(?:cuda|CUDA) [Gg]raph failed",
            ev.CUDA_GRAPH_FAILED,
            CAUSE,
        ),  # *_cuda_graph_runner.py
        (r"Memory pool size is too small", ev.NEGATIVE_POOL, CAUSE),
        (r"max_running_request is zero", ev.NEGATIVE_POOL, CAUSE),
        (r"\[Errno 98\]|Address already in use", ev.ADDRESS_IN_USE, CAUSE),
        (r"(?:\w+ ){0,2}[Ww]atchdog timeout", ev.WATCHDOG_TIMEOUT, CAUSE),  # utils/watchdog.py
        (r"Health check failed", ev.WATCHDOG_TIMEOUT, CAUSE),
        (r"Initialization failed", ev.INIT_FAILED, HEADER),  # entrypoints/engine.py
        (r"\w+ hit an exception", ev.SCHEDULER_EXCEPTION, HEADER),  # managers/scheduler.py
        (r"(?:[\w ]+: )?Traceback \(most recent call last\)", ev.SCHEDULER_EXCEPTION, HEADER),
        (r"Rank \d+ scheduler died during initialization", ev.RANK_DIED, HEADER),  # entrypoints/engine.py
        (r"Subprocess \S+ \(pid=\d+\) crashed with exit code", ev.RANK_DIED, HEADER),  # utils/watchdog.py
        (r"Fatal Python error", ev.RANK_DIED, HEADER),
        (r"Received sigquit", ev.SIGQUIT, HEADER),  # entrypoints/engine.py (launch phase)
        (r"SIGQUIT received", ev.SIGQUIT, HEADER),  # managers/tokenizer_manager.py (serving phase)
    )
)


# A traceback frame in SGLang's argument checks (srt/server_args.py prepare_server_args, ServerArgs's
# __post_init__, and the hooks it runs: srt/arg_groups/, e.g. pd_disaggregation_hook.py:190-196)
_ARGS_FRAME = re.compile(r'\s*File "[^"]*sglang/srt/(?:server_args\.py|arg_groups/)')


def in_arguments(line: str) -> bool:
    """Whether a traceback frame line is one of SGLang's argument checks."""
    return _ARGS_FRAME.match(line) is not None


def refused_said(line: str) -> str:
    """What SGLang said of the arguments it refused: argparse's text after `error: `, or the exception's
    message (its class name, and any logger prefix, taken off)."""
    if ": error: " in line and _ARGPARSE.match(line):
        return line.split(": error: ", 1)[1].strip()
    msg = re.sub(r"^\[[^\]]*\] ?", "", line)
    return msg[_LEAD.match(msg).end() :].strip()  # type: ignore[union-attr]  # _LEAD matches ""


def classify(msg: str) -> tuple[str, int, float | None] | None:
    """(kind, weight, stated minimum fraction) for a failure message, None for any other line."""
    cause = msg[_LEAD.match(msg).end() :]  # type: ignore[union-attr]  # _LEAD matches the empty string
    if cause.startswith("Loaded weights leave no GPU memory"):
        m = _MIN_VIABLE.search(cause) or _RAISE_ABOVE.search(cause)  # the 4-decimal figure when printed
        return ev.WEIGHTS_LEAVE_NO_MEMORY, CAUSE, float(m[1]) if m else None
    if (
        cause.startswith("User-specified context_length")
        and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in cause
    ):
        return ev.CONTEXT_TOO_LONG, CAUSE, None
    if _OOM.match(cause):
        return ev.CUDA_OOM, CAUSE, None
    for pattern, kind, weight in _CAUSES:
        if pattern.match(cause):
            return kind, weight, None
    return _classify_shape(msg)


def _classify_shape(msg: str) -> tuple[str, int, float | None] | None:
    """Failures recognised by the line's shape: argparse errors, traceback frames, exception lines."""
    if ": error: " in msg and _ARGPARSE.match(msg):
        return ev.START_REFUSED, CAUSE, None
    if msg.startswith("Segmentation fault"):
        return ev.RANK_DIED, HEADER, None
    if msg.startswith("Exception in "):
        return ev.SCHEDULER_EXCEPTION, HEADER, None
    if msg.startswith("  File ") and _FRAME.match(msg):
        return ev.SCHEDULER_EXCEPTION, HEADER, None
    if ("Error" in msg or "Exception" in msg or "OutOfResources" in msg) and _EXC_LINE.match(msg):
        return ev.SCHEDULER_EXCEPTION, EXCEPTION, None
    return None
