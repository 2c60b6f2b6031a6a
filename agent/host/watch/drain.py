"""Pure: drain a server before its restart -- what it has in flight, how long to wait, what was cut.

SGLang 0.5.23 answers `GET /v1/loads` with one entry per DP rank carrying `num_running_reqs` and
`num_waiting_reqs` (srt/entrypoints/v1_loads.py, srt/managers/load_snapshot.py LoadSnapshot), without
`--enable-metrics`; `/metrics` carries the same two as `sglang:num_running_reqs` and
`sglang:num_queue_reqs` when the server was started with `--enable-metrics`. On SIGTERM to its main
process the server drains by itself, with no time limit (srt/managers/tokenizer_manager.py
sigterm_watchdog): it keeps serving, answers 503 on /health, checks every 5 s and exits when nothing is
left. deployctl waits first (the server still answers /health 200 meanwhile), bounded by
`[drain] timeout_s`, then restarts; whatever is still in flight then gets SGLang's own drain, bounded by
the unit's TimeoutStopSec. A request still in flight when the old server stops answering was cut.

The HTTP side is a callable: these functions only decide, so fakes test them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from agent.protocol.events import DrainData
from agent.sglang.logs.events import Draining
from agent.sglang.logs.lines import parse_line

POLL_S = 1.0


@dataclass(frozen=True)
class Load:
    """Requests the server has, summed over its DP ranks."""

    running: int
    waiting: int

    @property
    def total(self) -> int:
        return self.running + self.waiting


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value >= 0 else None


def parse_loads(body: object) -> Load | None:
    """`/v1/loads` JSON -> the load over all ranks; None for a body SGLang would not send."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    running = waiting = 0
    for rank in loads:
        if not isinstance(rank, dict):
            return None
        r, w = _count(rank.get("num_running_reqs")), _count(rank.get("num_waiting_reqs"))
        if r is None or w is None:
            return None
        running, waiting = running + r, waiting + w
    return Load(running, waiting)


_SAMPLE = re.compile(r"^(sglang:num_running_reqs|sglang:num_queue_reqs)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def parse_metrics(text: str) -> Load | None:
    """Prometheus text of `/metrics` -> the load (summed over label sets); None without both gauges."""
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        try:
            number = float(value)
        except ValueError:
            return None
        if not math.isfinite(number) or number < 0:
            return None
        sums[name] = sums.get(name, 0.0) + number
    if len(sums) != 2:
        return None
    return Load(int(sums["sglang:num_running_reqs"]), int(sums["sglang:num_queue_reqs"]))


class End(str, Enum):
    """How deployctl's wait ended."""

    IDLE = "idle"  # nothing running or waiting
    TIMEOUT = "timeout"  # [drain] timeout_s passed with requests still in flight
    NO_ANSWER = "no_answer"  # the server does not answer (not running, failed): nothing to wait for
    NO_LOAD = "no_load"  # it answers but reports no load (/v1/loads and /metrics missing)
    OFF = "off"  # [drain] enabled = false


@dataclass(frozen=True)
class Waited:
    end: End
    in_flight: int  # at the start of the wait
    left: int  # at its end
    seconds: float


class NoLoad(Exception):
    """The server answered, but neither /v1/loads nor /metrics carries its load."""


Reader = Callable[[], "Load | None"]  # None: no answer; raises NoLoad


def wait_idle(
    read: Reader, timeout_s: float, clock: Callable[[], float], sleep: Callable[[float], None],
    poll_s: float = POLL_S,
) -> Waited:  # fmt: skip
    """Poll until nothing is running or waiting, the server stops answering, or timeout_s passes."""
    start = clock()
    try:
        first = read()
    except NoLoad:
        return Waited(End.NO_LOAD, 0, 0, 0.0)
    if first is None:
        return Waited(End.NO_ANSWER, 0, 0, 0.0)
    last = first
    while last.total > 0:
        elapsed = clock() - start
        if elapsed >= timeout_s:
            return Waited(End.TIMEOUT, first.total, last.total, round(elapsed, 3))
        sleep(min(poll_s, timeout_s - elapsed))
        try:
            seen = read()
        except NoLoad:
            seen = None
        if seen is None:  # it went away by itself (a crash): what it had is lost
            return Waited(End.NO_ANSWER, first.total, last.total, round(clock() - start, 3))
        last = seen
    return Waited(End.IDLE, first.total, 0, round(clock() - start, 3))


@dataclass
class StopWatch:
    """What the old server reported while the restart job stopped it; read also after a watch that has
    not ended yet (its last poll can hang on a port the new server is taking over)."""

    last: int | None = None  # the last count before it stopped answering; None: it never answered
    answered_s: float = 0.0  # how long after the watch began it still answered
    peak: int = 0  # the most it had at once meanwhile (requests that arrived during the stop count too)

    def run(
        self, read: Reader, stopped: Callable[[], bool], clock: Callable[[], float],
        sleep: Callable[[float], None], poll_s: float = 0.5,
    ) -> tuple[int | None, float]:  # fmt: skip
        """Poll until the server stops answering or `stopped()`; (last, answered_s).

        SGLang keeps answering during its own SIGTERM drain, so the last count seen is what it still had
        when it went away: the requests in flight when a signal to the whole control group (or systemd's
        SIGKILL at TimeoutStopSec) ended it, or a count its drain finished in the last poll's gap -- which
        SGLang's own last drain line tells apart (see `logged_left`).
        """
        start = clock()
        while not stopped():
            try:
                seen = read()
            except NoLoad:
                seen = None
            if seen is None:
                break
            self.last, self.answered_s = seen.total, round(clock() - start, 3)
            self.peak = max(self.peak, seen.total)
            sleep(poll_s)
        return self.last, self.answered_s


def watch_stop(
    read: Reader, stopped: Callable[[], bool], clock: Callable[[], float], sleep: Callable[[float], None],
    poll_s: float = 0.5,
) -> tuple[int | None, float]:  # fmt: skip
    """StopWatch().run(...): the last load before the old server stopped answering, and for how long."""
    return StopWatch().run(read, stopped, clock, sleep, poll_s)


def logged_left(lines: Iterable[str]) -> int | None:
    """What SGLang's own SIGTERM drain had left in its last `Gracefully exiting... Remaining number of
    requests N` line of the old server's log; None when it logged none (no drain, or not SGLang)."""
    left = None
    for line in lines:
        for event in parse_line(line):
            if isinstance(event, Draining):
                left = event.remaining
    return left


@dataclass(frozen=True)
class Drain:
    """A restart's drain, as the report, the JSON and the metrics carry it."""

    end: str
    in_flight: int  # running + waiting when the drain began
    finished: int
    cut: int
    seconds: float  # from the drain's start until the old server stopped answering
    waited_s: float  # deployctl's own wait, before the restart
    timeout_s: float

    def to_dict(self) -> DrainData:
        return DrainData(
            end=self.end,
            in_flight=self.in_flight,
            finished=self.finished,
            cut=self.cut,
            seconds=self.seconds,
            waited_s=self.waited_s,
            timeout_s=self.timeout_s,
        )

    def describe(self) -> str:
        if self.end in (End.NO_ANSWER.value, End.OFF.value, End.NO_LOAD.value) and not self.in_flight:
            return {
                End.NO_ANSWER.value: "not needed: the server did not answer, so nothing was in flight",
                End.NO_LOAD.value: "not possible: the server reports no load (no /v1/loads, no /metrics)",
                End.OFF.value: "off ([drain] enabled = false)",
            }[self.end]
        timed_out = (
            f", the wait timed out after {self.timeout_s:g} s" if self.end == End.TIMEOUT.value else ""
        )
        return (
            f"{self.in_flight} in flight, {self.finished} finished, {self.cut} cut, {self.seconds:.1f} s "
            f"(deployctl waited {self.waited_s:.1f} s{timed_out})"
        )


def result(waited: Waited, stop: StopWatch | None, timeout_s: float, logged: int | None = None) -> Drain:
    """What became of the requests in flight: `stop` is what the StopWatch saw while the old server
    stopped (None: not watched), `logged` what SGLang's own drain logged last (`logged_left`)."""
    if waited.end in (End.NO_ANSWER, End.NO_LOAD, End.OFF):
        cut = waited.left if waited.end is End.NO_ANSWER else 0
        return Drain(waited.end.value, waited.in_flight, waited.in_flight - cut, cut,
                     waited.seconds, waited.seconds, timeout_s)  # fmt: skip
    stop = stop or StopWatch()
    if logged == 0:
        # SGLang logs "Remaining ... 0" only once its drain is done, right before it exits: whatever the
        # last poll saw finished in the gap (a poll every 0.5 s, a drain check every 5 s).
        cut = 0
    elif stop.last is not None:
        cut = stop.last
    else:
        cut = waited.left if logged is None else logged
    # Requests that arrived during the drain or the stop (nothing stops them without a router) count too:
    # SGLang keeps taking them while it drains, and finishes or loses them with the rest.
    in_flight = max(waited.in_flight, cut, stop.peak)
    seconds = round(waited.seconds + stop.answered_s, 3)
    return Drain(waited.end.value, in_flight, in_flight - cut, cut, seconds, waited.seconds, timeout_s)
