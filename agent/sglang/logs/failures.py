"""Recognise the lines of a failed SGLang start and name their cause (a failure kind)."""

from __future__ import annotations

import re

from agent.sglang.logs import events as ev

# Weights of a failure line (see log_events.Failure): the summary keeps the first line of the highest weight.
HEADER, EXCEPTION, CAUSE = 0, 1, 2

_MIN_VIABLE = re.compile(r"minimum viable = [^=]*= ?(\d+(?:\.\d+)?)")
_RAISE_ABOVE = re.compile(r"above (\d+(?:\.\d+)?)")
_OOM = re.compile(r"(?:CUDA|HIP|NPU|XPU|GPU) out of memory|CUDA error: out of memory|OutOfMemoryError")
_ARGPARSE = re.compile(r"(?:[\w./-]+ ){0,2}[\w./-]+: error: ")
_FRAME = re.compile(r'\s+File "[^"]*", line \d+')
# The last line of a Python traceback: a dotted exception class name, then ": message" or nothing.
_EXC_LINE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception|OutOfResources|Exit)(?:: |:?$)"
)

# (needle, kind, weight), tried in order after the cases that need more than a substring.
_NEEDLES: tuple[tuple[str, str, int], ...] = (
    ("Not enough memory", ev.NOT_ENOUGH_MEMORY, CAUSE),
    # 0.5.23 hybrid pools (mem_cache/kv_cache_configurator.py, model_executor/pool_configurator.py)
    ("Not enough GPU memory for hybrid", ev.NOT_ENOUGH_MEMORY, CAUSE),
    ("state cache is too small to serve any requests", ev.NOT_ENOUGH_MEMORY, CAUSE),
    ("admission floor is sliding_window_size", ev.NOT_ENOUGH_MEMORY, CAUSE),  # "SWA pool ... cannot hold"
    ("leaves no room for the full KV pool", ev.NOT_ENOUGH_MEMORY, CAUSE),
    ("memory capacity is unbalanced", ev.MEMORY_UNBALANCED, CAUSE),
    ("graph failed", ev.CUDA_GRAPH_FAILED, CAUSE),
    ("Graph failed", ev.CUDA_GRAPH_FAILED, CAUSE),
    ("Memory pool size is too small", ev.NEGATIVE_POOL, CAUSE),
    ("max_running_request is zero", ev.NEGATIVE_POOL, CAUSE),
    ("ddress already in use", ev.ADDRESS_IN_USE, CAUSE),
    ("[Errno 98]", ev.ADDRESS_IN_USE, CAUSE),
    ("atchdog timeout", ev.WATCHDOG_TIMEOUT, CAUSE),
    ("Health check failed", ev.WATCHDOG_TIMEOUT, CAUSE),
    ("Initialization failed", ev.INIT_FAILED, HEADER),
    ("Scheduler hit an exception", ev.SCHEDULER_EXCEPTION, HEADER),
    ("Traceback (most recent call last)", ev.SCHEDULER_EXCEPTION, HEADER),
    ("died during initialization", ev.RANK_DIED, HEADER),
    ("crashed with exit code", ev.RANK_DIED, HEADER),
    ("Fatal Python error", ev.RANK_DIED, HEADER),
    ("Received sigquit", ev.SIGQUIT, HEADER),
    ("SIGQUIT received", ev.SIGQUIT, HEADER),
)


def classify(msg: str) -> tuple[str, int, float | None] | None:
    """(kind, weight, stated minimum fraction) for a failure message, None for any other line."""
    if "Loaded weights leave no GPU memory" in msg:
        m = _MIN_VIABLE.search(msg) or _RAISE_ABOVE.search(msg)  # the 4-decimal figure when printed
        fraction = float(m[1]) if m else None
        return ev.WEIGHTS_LEAVE_NO_MEMORY, CAUSE, fraction
    if "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in msg and "greater than" in msg:
        return ev.CONTEXT_TOO_LONG, CAUSE, None
    # "Capture cuda graph failed: CUDA out of memory" stays a graph failure: the graph flags are the fix.
    if ("out of memory" in msg or "OutOfMemory" in msg) and "raph failed" not in msg and _OOM.search(msg):
        return ev.CUDA_OOM, CAUSE, None
    for needle, kind, weight in _NEEDLES:
        if needle in msg:
            return kind, weight, None
    return _classify_shape(msg)


def _classify_shape(msg: str) -> tuple[str, int, float | None] | None:
    """Failures recognised by the line's shape: argparse errors, traceback frames, exception lines."""
    if ": error: " in msg and _ARGPARSE.match(msg):
        return ev.INIT_FAILED, CAUSE, None
    if msg.startswith("Segmentation fault"):
        return ev.RANK_DIED, HEADER, None
    if msg.startswith("Exception in "):
        return ev.SCHEDULER_EXCEPTION, HEADER, None
    if msg.startswith("  File ") and _FRAME.match(msg):
        return ev.SCHEDULER_EXCEPTION, HEADER, None
    if ("Error" in msg or "Exception" in msg or "OutOfResources" in msg) and _EXC_LINE.match(msg):
        return ev.SCHEDULER_EXCEPTION, EXCEPTION, None
    return None
