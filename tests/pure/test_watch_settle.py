"""A failed start is reported with the line that names its cause, as the real SGLang 0.5.23 logs it: the
"Scheduler hit an exception: Traceback" header first, the frames, the exception last, one record per line,
and the service may be dead before the last of them reaches the journal."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from agent.host.change.decide import Failure, Gate
from agent.host.events import EventLog
from agent.host.watch.start import DEAD_SETTLE_S, SETTLE_S, WatchedStart, watch_start
from agent.protocol.requests import Timeouts

# Verbatim from a real start refused by SGLang 0.5.23 on CPU (tests/realhost.py), paths shortened.
HEADER = "[2026-12-03 20:30:34] Scheduler hit an exception: Traceback (most recent call last):"
FRAME = '  File "/venv/sglang/srt/mem_cache/kv_cache_configurator.py", line 3050, in _profile_available_bytes'
CAUSE = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.001. "
    "Raise --mem-fraction-static above 0.004 (minimum viable = 1 - available/pre = 0.0038)."
)
SIGQUIT = "[2026-12-03 20:30:34] Received sigquit from a child process. It usually means the child failed."
ARGPARSE = "sglang serve: error: unrecognized arguments: --no-such-flag"


@dataclass
class Line:
    message: str


@dataclass
class State:
    active_state: str
    sub_state: str
    n_restarts: int = 0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Journal:
    """Hands the lines over one per poll, each 50 ms later; then nothing (None) forever."""

    def __init__(self, clock: Clock, lines: list[str]) -> None:
        self.clock, self.lines = clock, lines

    def cursor(self) -> str | None:
        return None

    def follow(self, unit: str, after: str | None, inv: str | None, deadline: float) -> Iterator[Line | None]:
        for line in self.lines:
            self.clock.t += 0.05
            yield Line(line)
        while self.clock.t < 100:
            self.clock.t += 0.05
            yield None

    def last_invocation_lines(self, unit: str, max_lines: int) -> list[str]:
        return self.lines


class Systemd:
    """Active while lines come; `dead_after` lines in, the process is gone (state failed)."""

    def __init__(self, journal: Journal, clock: Clock, dead_at: float) -> None:
        self.clock, self.dead_at = clock, dead_at

    def unit_state(self, unit: str) -> State:
        return State("failed", "failed") if self.clock.t >= self.dead_at else State("activating", "start")


def watch(lines: list[str], dead_at: float = 1e9) -> tuple[str, Failure | None, float]:
    clock = Clock()
    journal = Journal(clock, lines)
    gate = Gate(4096, None, 0.02, Timeouts(60, 60, 60, 60))
    start = WatchedStart("sglang.service", journal, Systemd(journal, clock, dead_at), gate, None, "inv", 0)
    result = watch_start(start, EventLog("t", None), clock=clock)
    return result.verdict.reason, result.verdict.kind, clock.t


def test_the_exception_line_of_a_traceback_is_quoted_not_its_header() -> None:
    reason, kind, _ = watch([HEADER, FRAME, "    raise ValueError(", CAUSE, SIGQUIT])
    assert kind is Failure.SGLANG_FAILURE
    assert "Loaded weights leave no GPU memory" in reason and "Traceback" not in reason


def test_a_cause_line_ends_the_wait_at_once() -> None:
    _, _, t = watch([HEADER, FRAME, CAUSE])
    assert t < 0.2  # decided at the cause line (the third, 150 ms in), not SETTLE_S later


def test_a_generic_failure_alone_is_decided_after_the_settle_time() -> None:
    reason, kind, t = watch([HEADER])
    assert kind is Failure.SGLANG_FAILURE and "Scheduler hit an exception" in reason
    assert SETTLE_S <= t < SETTLE_S + 0.2


def test_an_argparse_error_logged_after_the_process_died_is_still_quoted() -> None:
    # the usage text, then the error line; systemd reports the exit before the journal hands the line over
    reason, kind, _ = watch(["usage: sglang serve [-h] --model-path MODEL_PATH", ARGPARSE], dead_at=0.01)
    assert kind is Failure.SGLANG_FAILURE and ARGPARSE in reason


def test_a_dead_service_waits_longer_for_a_line_journald_hands_over_late() -> None:
    late = ["usage: sglang serve [-h]"] + [""] * 100 + [ARGPARSE]  # the error line 5 s after the exit
    reason, kind, _ = watch(late, dead_at=0.01)
    assert kind is Failure.SGLANG_FAILURE and ARGPARSE in reason


def test_a_silent_death_is_decided_after_the_longer_wait() -> None:
    reason, kind, t = watch([], dead_at=0.01)
    assert kind is Failure.SERVICE_FAILED and "failed/failed" in reason
    assert DEAD_SETTLE_S <= t < DEAD_SETTLE_S + 0.2
