"""Lines of a multi-node SGLang 0.5.23 start (--nnodes): torch's rendezvous errors, gloo's closed peer and the
SIGTERM of a node rank >= 1 are read as what they are.

The torch messages are the format strings in libtorch_cpu.so of torch 2.13 (the wheel SGLang 0.5.23 installs):
"Connection closed by peer " from third_party/gloo/gloo/transport/tcp/pair.cc, "Timed out after {} seconds
waiting for clients. {}/{} clients joined." (TCPStore's server) and "The client socket has timed out after {}
while trying to connect to ({}, {})." (its client). The SIGTERM line is srt/entrypoints/engine.py's.
"""

from __future__ import annotations

import pytest

from agent.sglang.logs import events as ev
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.summary import summarize

P = "[2026-12-04 21:37:33 TP4] "
GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[10.0.0.1]:5000"
)


@pytest.mark.parametrize(
    "line",
    [
        GLOO,
        "torch.distributed.DistStoreError: Timed out after 300 seconds waiting for clients. "
        "8/16 clients joined.",
        "torch.distributed.DistNetworkError: The client socket has timed out after 300000ms while trying to "
        "connect to (10.0.0.1, 5000).",
    ],
)
def test_torch_distributed_errors_are_failures(line: str) -> None:
    failures = [e for e in parse_line(line) if isinstance(e, ev.Failure)]
    assert [(f.failure_kind, f.line) for f in failures] == [(ev.SCHEDULER_EXCEPTION, line)]


def test_node_1_losing_node_0_is_a_failed_start_named_by_gloos_line() -> None:
    lines = [
        P + "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 218484, KV size: 14.30 GB",
        P + "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 1391, in '
        "recv_requests",
        "    recv_reqs = broadcast_pyobj(",
        GLOO,
        "[2026-12-04 21:37:33] Received sigquit from a child process. It usually means the child failed.",
    ]
    summary = summarize(lines)
    assert summary.kv_tokens == 218484 and not summary.ready
    assert summary.failure is not None and summary.failure.line == GLOO


def test_sigterm_on_a_node_rank_above_0_is_a_stop() -> None:
    line = (
        "[2026-12-04 21:37:33] SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq "
        "broadcast to stop the schedulers."
    )
    assert parse_line(line) == [ev.Stopping(rank=None, signal="SIGTERM")]
