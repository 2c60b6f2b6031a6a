"""Follow one start of a unit (its invocation's journal lines and its bus state) until a verdict."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from agent.host.change.decide import (
    WAIT,
    Action,
    Failure,
    Gate,
    Observation,
    Verdict,
    decide,
    exit_words,
    fail,
)
from agent.host.events import EventLog
from agent.protocol.events import Stage
from agent.sglang.logs.events import GENERIC_FAILURE_KINDS, EngineTimings, GraphEnd
from agent.sglang.logs.summary import StartFigures, SummaryBuilder
from agent.sglang.redact import redact_log_line

STATE_POLL_S = 0.05  # one unit_state call costs ~1 ms; a crash is seen within this
PROGRESS_EVERY_S = 1.0  # progress events while weights load: enough for a live line, not a flood
# A failure's first line rarely says why: SGLang logs "Scheduler hit an exception: Traceback ...", then the
# frames, and the exception that names the cause last, one journal record per line (seen on the real
# 0.5.23). The process may also be gone (state "failed") before its last lines reach the journal. So a
# failure that does not yet name its cause is decided once one is logged, or this long after it was seen;
# a service found dead with no failure line at all waits longer: on a loaded host journald hands lines
# over seconds late (seen: the argparse error of a real start, printed 4 s before the process exited, read
# after systemd had reported the exit).
SETTLE_S = 3.0
DEAD_SETTLE_S = 10.0
# A start can be replaced under the watch by a restart deployctl did not make: with [weight_cache] the
# engine has Requires=/PartOf= on the daemon, so systemd's Restart=always of a crashed daemon restarts the
# engine too (a new invocation, the same unit file). The watch follows the newest start, judged on its own;
# this many such restarts in one watch end it (something keeps restarting the service).
MAX_RESTARTS_UNDER_WATCH = 3


class JournalPort(Protocol):
    def cursor(self) -> str | None: ...

    def follow(
        self, unit: str, after_cursor: str | None, invocation_id: str | None, deadline_s: float
    ) -> Iterator[Any]: ...

    def last_invocation_lines(self, unit: str, max_lines: int) -> list[str]: ...

    def invocation_tail(self, unit: str, invocation_id: str, max_lines: int) -> list[str]: ...


class StatePort(Protocol):
    def unit_state(self, unit: str) -> Any: ...


@dataclass(frozen=True)
class WatchedStart:
    """One start of a unit, as the restart left it: where its journal lines begin and how it is judged."""

    unit: str
    journal: JournalPort
    systemd: StatePort
    gate: Gate
    cursor: str | None  # the journal's newest record before the restart
    invocation_id: str
    n_restarts0: int  # the unit's restart count before this start
    # A group's node: why the group no longer wants this start (its abort came meanwhile), else None.
    abandon: Callable[[], str | None] | None = None
    # Called once, when the start logs its pool (the transaction records the GPU processes then).
    on_pool: Callable[[], None] | None = None


@dataclass
class WatchResult:
    verdict: Verdict
    summary: StartFigures
    seconds: float
    invocation_id: str = ""  # the start judged: the newest, when the service was restarted under the watch


class _Start:
    """What the journal has told so far about one start: its summary, phase and timings."""

    def __init__(
        self, t0: float, log: EventLog, stage: Stage, on_pool: Callable[[], None] | None = None
    ) -> None:
        self.builder = SummaryBuilder()
        self.log, self.stage = log, stage
        self.summary = self.builder.summary().to_dict()
        self.graphs: dict[str | None, float] = {}
        self.phase, self.lines, self.last_text = "starting", 0, ""
        self.last_line_at, self.last_progress = t0, t0  # the first periodic line after a second
        self.weights_done_at: float | None = None
        self.pool_at: float | None = None
        self.on_pool = on_pool

    def feed(self, message: str, now: float) -> None:
        self.lines += 1
        self.last_line_at = now
        self.last_text = redact_log_line(message)[:300]  # progress events carry it: never the API key
        for event in self.builder.feed(message):
            if isinstance(event, GraphEnd) and event.usage_gb is not None:
                self.graphs[event.rank] = self.graphs.get(event.rank, 0.0) + event.usage_gb
            elif isinstance(event, EngineTimings):  # the downtime's phases, by SGLang's own clock
                timings = event.to_dict()
                self.log.emit(
                    self.stage, "progress", message[:200], phase=self.phase, startup_timings=timings
                )
        self.summary = self.builder.summary().to_dict()
        failure = self.summary.get("failure")
        if failure and failure.get("line"):  # into the outcome, the history and `facts`: redacted
            failure["line"] = redact_log_line(failure["line"])
        if self.graphs:  # what the next plan credits per request (see start_figures)
            self.summary["graph_mem_gb"] = round(max(self.graphs.values()), 3)
        self._progress(now)
        if self.weights_done_at is None and self.phase not in ("starting", "loading_weights"):
            self.weights_done_at = now
        if self.pool_at is None and self.summary.get("kv_tokens") is not None:
            self.pool_at = now
            if self.on_pool is not None:
                self.on_pool()

    def _progress(self, now: float) -> None:
        line = self.last_text[:200]
        if self.builder.phase != self.phase:
            self.phase = self.builder.phase
            self.log.emit(self.stage, "progress", f"phase: {self.phase}", phase=self.phase, line=line)
        elif now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            pct = self.builder.weights_percent
            self.log.emit(self.stage, "progress", line, phase=self.phase, percent=pct, line=line)

    def observe(self, now: float, t0: float, state: Any, n_restarts0: int) -> Observation:
        failure = self.summary.get("failure")
        return Observation(
            now=now,
            restarted_at=t0,
            last_line_at=self.last_line_at,
            weights_done_at=self.weights_done_at,
            pool_at=self.pool_at,
            kv_tokens=self.summary.get("kv_tokens"),
            failure_kind=failure["kind"] if failure else None,
            failure_line=failure["line"] if failure else None,
            ready=bool(self.summary.get("ready")),
            active_state=state.active_state,
            sub_state=state.sub_state,
            restarts_since=max(0, state.n_restarts - n_restarts0),
            exit=exit_words(getattr(state, "exec_main_code", 0), getattr(state, "exec_main_status", 0)),
            host_pool_tokens=self.summary.get("host_pool_tokens"),
        )


def watch_start(
    start: WatchedStart,
    log: EventLog,
    stage: Stage = Stage.WATCH,
    clock: Callable[[], float] = time.monotonic,
) -> WatchResult:
    """Decide on every new line and every state poll; return at ready or at the first failure. A start
    replaced under the watch by one deployctl did not make (same unit, new invocation, no restart of the
    service's own Restart=) is followed: the newest start is judged on its own."""
    t_first = clock()
    for _ in range(MAX_RESTARTS_UNDER_WATCH + 1):
        result, newer = _watch_one(start, log, stage, clock)
        if newer is None:
            return replace(result, seconds=clock() - t_first)
        log.emit(
            stage,
            "warning",
            f"{start.unit} was restarted under the watch, not by deployctl (invocation "
            f"{start.invocation_id[:12] or '?'} -> {newer.invocation_id[:12]}; with [weight_cache], a "
            "restart of its daemon restarts the engine): following the new start",
            invocation=newer.invocation_id,
        )
        start = replace(start, invocation_id=newer.invocation_id, n_restarts0=newer.n_restarts)
    why = (
        f"{start.unit} was restarted {MAX_RESTARTS_UNDER_WATCH + 1} times under the watch, not by deployctl "
        "(with [weight_cache]: its daemon keeps restarting)"
    )
    return WatchResult(fail(why, Failure.SERVICE_FAILED), {}, clock() - t_first, start.invocation_id)


def _watch_one(
    start: WatchedStart, log: EventLog, stage: Stage, clock: Callable[[], float]
) -> tuple[WatchResult, Any]:
    """One start to its verdict; or, when the service's invocation changed under it without a restart of
    its own Restart= (NRestarts did not grow), the newer start's state instead of a verdict."""
    unit, journal, systemd, gate = start.unit, start.journal, start.systemd, start.gate
    t0 = clock()
    seen = _Start(t0, log, stage, start.on_pool)
    state, last_poll, pool_passed = systemd.unit_state(unit), 0.0, False
    horizon = gate.timeouts.weights_s + gate.timeouts.pool_s + gate.timeouts.ready_s + 60
    failed_at: float | None = None

    def done(verdict: Verdict) -> tuple[WatchResult, None]:
        return WatchResult(verdict, seen.summary, clock() - t0, start.invocation_id), None

    for item in journal.follow(unit, start.cursor, start.invocation_id, time.monotonic() + horizon):
        now = clock()
        if item is not None:
            seen.feed(item.message, now)
        if now - last_poll >= STATE_POLL_S:
            state, last_poll = systemd.unit_state(unit), now
            if replaced(start, state):
                return WatchResult(WAIT, seen.summary, clock() - t0, start.invocation_id), state
            why = start.abandon() if start.abandon else None
            if why:  # its peers stop theirs: this start cannot complete, and rank 0 waits for its stop
                return done(fail(why, Failure.ABANDONED))
        obs = seen.observe(now, t0, state, start.n_restarts0)
        verdict, pool_passed = _judged(obs, gate, pool_passed, log, clock)
        if verdict.action is Action.READY:
            return done(verdict)
        elif verdict.action is Action.FAIL:
            failed_at = now if failed_at is None else failed_at
            settle = DEAD_SETTLE_S if obs.failure_kind is None else SETTLE_S
            if names_cause(verdict, obs) or now - failed_at >= settle:
                return done(verdict)
    return done(fail(f"gave up after {horizon:.0f} s", Failure.TIMEOUT))


def _judged(
    obs: Observation, gate: Gate, pool_passed: bool, log: EventLog, clock: Callable[[], float]
) -> tuple[Verdict, bool]:
    """decide() on one observation, the pool gate's pass logged once: the verdict, and whether it passed."""
    verdict = decide(obs, gate, pool_passed)
    if verdict.action is not Action.POOL_OK:
        return verdict, pool_passed
    verdict_ms = (clock() - obs.now) * 1000
    log.emit(Stage.GATE, "step", verdict.reason, kv_tokens=obs.kv_tokens, verdict_ms=round(verdict_ms, 2))
    return decide(obs, gate, True), True  # a node rank >= 1 is ready on its pool line


def replaced(start: WatchedStart, state: Any) -> bool:
    """Whether the service now runs a start other than the watched one that its own Restart= did not
    make (that one is a crash, decide()'s to judge): a restart job from elsewhere (a daemon it is PartOf)."""
    now_inv = getattr(state, "invocation_id", "") or ""
    if not now_inv or not start.invocation_id or now_inv == start.invocation_id:
        return False
    return bool(getattr(state, "n_restarts", 0) <= start.n_restarts0)


def names_cause(verdict: Verdict, obs: Observation) -> bool:
    """Whether a failed start's verdict is final: a log line named the cause, or there is none to wait for
    (a pool short of the gate, a timeout). A generic SGLang failure line waits SETTLE_S, a dead service
    with no failure line DEAD_SETTLE_S, for the line that says why."""
    if verdict.kind is Failure.SERVICE_FAILED:
        return obs.failure_kind is not None and obs.failure_kind not in GENERIC_FAILURE_KINDS
    if verdict.kind is Failure.SGLANG_FAILURE:
        return obs.failure_kind not in GENERIC_FAILURE_KINDS
    return True
