"""A normal stop of SGLang 0.5.23 is not a failure of that start; a crash still is.

On SIGTERM the main process logs `SIGTERM received. signum=None frame=None. Draining requests and shutting
down...` (managers/tokenizer_manager.py SignalHandler.sigterm_handler, an asyncio handler: no arguments).
With systemd's default KillMode=control-group the scheduler gets the SIGTERM too and dies of it; the main
process's SubprocessWatchdog (utils/watchdog.py) then logs `Subprocess scheduler_0 (pid=...) crashed with
exit code -15. Triggering SIGQUIT for cleanup...` and its SIGQUIT handler logs `SIGQUIT received. ...`.
The lines are the real ones (../shared/sglang/REAL-ON-CPU.md, measured on the PyPI release).
"""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from agent.cli.commands import parse_log
from agent.output import Output
from agent.sglang.logs import events as ev
from agent.sglang.logs.summary import SummaryBuilder, summarize

START = [
    "[2026-12-03 18:46:01] Init parallel begin.",
    "[2026-12-03 18:46:02] Load weight begin. avail mem=21.63 GB",
    "[2026-12-03 18:46:02] Load weight end. elapsed=0.06 s, type=LlamaForCausalLM, avail mem=21.63 GB, mem usage=0.00 GB.",
    "[2026-12-03 18:46:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 16384, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-03 18:46:03] Memory pool end. avail mem=21.59 GB",
    "[2026-12-03 18:46:03] max_total_num_tokens=16384, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=2048, context_len=4096, available_cpu_mem=21.59 GB",
    "[2026-12-03 18:46:03] INFO:     Uvicorn running on http://127.0.0.1:30123 (Press CTRL+C to quit)",
    "[2026-12-03 18:46:04] The server is fired up and ready to roll!",
]
SIGTERM = (
    "[2026-12-03 18:50:00] SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
)
DRAIN = "[2026-12-03 18:50:00] Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=['ab12']."
SCHED_DIED = "[2026-12-03 18:50:01] Subprocess scheduler_0 (pid=4242) crashed with exit code {code}. Triggering SIGQUIT for cleanup..."
SIGQUIT = (
    "[2026-12-03 18:50:01] SIGQUIT received. signum=None, frame=None. It usually means one child failed."
)


def _summary(*tail: str) -> tuple[bool, str | None, bool]:
    s = summarize([*START, *tail])
    return s.ready, (s.failure.failure_kind if s.failure else None), s.stopped


@pytest.mark.parametrize(
    "tail",
    [
        # KillMode=control-group: the scheduler dies of the same SIGTERM
        (SIGTERM, SCHED_DIED.format(code=-15), SIGQUIT),
        # the watchdog (1 s poll) may see the dead scheduler before the event loop runs the handler
        (SCHED_DIED.format(code=-15), SIGTERM, SIGQUIT),
        # Ctrl-C in a terminal reaches the group as SIGINT
        (SIGTERM, DRAIN, SCHED_DIED.format(code=-2), SIGQUIT),
        # KillMode=mixed: only the main process, which drains and exits
        (SIGTERM, DRAIN),
    ],
)
def test_a_stop_is_not_a_failure(tail: tuple[str, ...]) -> None:
    assert _summary(*tail) == (True, None, True)


@pytest.mark.parametrize(
    ("tail", "kind"),
    [
        # a scheduler killed on its own (nobody stopped the service): the service is broken
        ((SCHED_DIED.format(code=-15), SIGQUIT), ev.RANK_DIED),
        # SIGKILL of a child while the main process lives is the OOM killer, stop or not
        ((SIGTERM, SCHED_DIED.format(code=-9), SIGQUIT), ev.RANK_DIED),
        ((SCHED_DIED.format(code=-11), SIGQUIT), ev.RANK_DIED),
        # a crash while draining is a crash
        (
            (
                SIGTERM,
                "[2026-12-03 18:50:00] Scheduler hit an exception: Traceback (most recent call last):",
                "RuntimeError: boom",
                SCHED_DIED.format(code=1),
                SIGQUIT,
            ),
            ev.SCHEDULER_EXCEPTION,
        ),
    ],
)
def test_a_crash_is_still_a_failure(tail: tuple[str, ...], kind: str) -> None:
    ready, failure, _ = _summary(*tail)
    assert (ready, failure) == (True, kind)


def test_the_phase_after_a_stop_is_not_failed() -> None:
    builder = SummaryBuilder()
    for line in [*START, SIGTERM, SCHED_DIED.format(code=-15), SIGQUIT]:
        builder.feed(line)
    assert builder.phase == "ready"


def test_parse_log_reads_a_control_group_stop_as_a_stop(tmp_path: object) -> None:
    path = f"{tmp_path}/stop.log"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join([*START, SIGTERM, SCHED_DIED.format(code=-15), SIGQUIT]) + "\n")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert parse_log.run(argparse.Namespace(file=path, json=False), out) == 0
    text = out.stdout.getvalue()  # type: ignore[attr-defined]
    assert "failure:       none" in text and "stopped:       yes (SIGTERM)" in text, text


# A whole real log: the PyPI release on this kind of machine's CPU (--max-total-tokens 2048), started in its
# own process group and stopped by `kill -TERM -PGID` (what KillMode=control-group does), captured verbatim.
REAL_STOP = Path(__file__).resolve().parents[1] / "data" / "sglang-real-cpu-stop.log"


def test_a_real_control_group_stop_is_read_as_a_stop() -> None:
    lines = REAL_STOP.read_text(encoding="utf-8").splitlines()
    assert any("crashed with exit code -15" in line for line in lines)  # the lines that read like a crash
    s = summarize(lines)
    assert (s.ready, s.stopped, s.failure, s.kv_tokens, s.mem_fraction_static) == (
        True,
        True,
        None,
        2048,
        0.716,
    )
    assert s.startup_timings is not None and s.startup_timings.load_weight_s == 0.18
    # the same log without its SIGTERM line is a child that died on its own: a failure
    crashed = summarize([line for line in lines if "SIGTERM received" not in line])
    assert crashed.failure is not None and crashed.failure.failure_kind == ev.RANK_DIED
