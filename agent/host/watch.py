"""Follow one start of a unit (its invocation's journal lines and its bus state) until a verdict."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.host.decide import Gate, Observation, Verdict, decide
from agent.host.events import EventLog
from agent.protocol import Stage
from agent.sglang.logs import SummaryBuilder

STATE_POLL_S = 0.05  # one unit_state call costs ~1 ms; a crash is seen within this
PROGRESS_EVERY_S = 1.0  # progress events while weights load: enough for a live line, not a flood


class _Line(Protocol):
    message: str


class JournalPort(Protocol):
    def cursor(self) -> str | None: ...

    def follow(
        self, unit: str, after_cursor: str | None, invocation_id: str | None, deadline_s: float, poll_s: float
    ) -> Iterator[Any]: ...

    def last_invocation_lines(self, unit: str, max_lines: int) -> list[str]: ...


class StatePort(Protocol):
    def unit_state(self, unit: str) -> Any: ...


@dataclass
class WatchResult:
    verdict: Verdict
    summary: dict[str, Any]
    seconds: float
    pool_verdict_ms: float | None = None  # pool line seen -> verdict, for the benchmark
    lines: int = 0
    last_line: str = ""
    timings: dict[str, float] = field(default_factory=dict)


def watch_start(
    unit: str,
    journal: JournalPort,
    systemd: StatePort,
    gate: Gate,
    cursor: str | None,
    invocation_id: str,
    n_restarts0: int,
    log: EventLog,
    stage: Stage = Stage.WATCH,
    clock: Callable[[], float] = time.monotonic,
) -> WatchResult:
    """Decide on every new line and every state poll; return at ready or at the first failure."""
    builder = SummaryBuilder()
    t0 = clock()
    last_line_at, last_poll, last_progress = t0, 0.0, 0.0
    weights_done_at: float | None = None
    pool_at: float | None = None
    pool_passed = False
    state = systemd.unit_state(unit)
    phase, lines, last_text, pool_ms = "starting", 0, "", None
    horizon = gate.timeouts.weights_s + gate.timeouts.pool_s + gate.timeouts.ready_s + 60
    summary: dict[str, Any] = builder.summary().to_dict()
    for item in journal.follow(unit, cursor, invocation_id, time.monotonic() + horizon, 0.02):
        now = clock()
        seen_at = now
        if item is not None:
            lines += 1
            last_line_at = now
            last_text = item.message[:300]
            builder.feed(item.message)
            summary = builder.summary().to_dict()
            if builder.phase != phase:
                phase = builder.phase
                log.emit(stage, "progress", f"phase: {phase}", phase=phase, line=last_text[:200])
            elif now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                pct = builder.weights_percent
                log.emit(stage, "progress", last_text[:200], phase=phase, percent=pct, line=last_text[:200])
            if weights_done_at is None and phase not in ("starting", "loading_weights"):
                weights_done_at = now
            if pool_at is None and summary.get("kv_tokens") is not None:
                pool_at = now
        if now - last_poll >= STATE_POLL_S:
            state = systemd.unit_state(unit)
            last_poll = now
        obs = Observation(
            now=now,
            restarted_at=t0,
            last_line_at=last_line_at,
            weights_done_at=weights_done_at,
            pool_at=pool_at,
            kv_tokens=summary.get("kv_tokens"),
            failure_kind=(summary.get("failure") or {}).get("kind"),
            failure_line=(summary.get("failure") or {}).get("line"),
            ready=bool(summary.get("ready")),
            active_state=state.active_state,
            sub_state=state.sub_state,
            restarts_since=max(0, state.n_restarts - n_restarts0),
        )
        verdict = decide(obs, gate, pool_passed)
        if verdict.action == "pool_ok":
            pool_passed = True
            pool_ms = (clock() - seen_at) * 1000
            log.emit(
                Stage.GATE, "step", verdict.reason, kv_tokens=obs.kv_tokens, verdict_ms=round(pool_ms, 2)
            )
            continue
        if verdict.action in ("ready", "fail"):
            if verdict.kind == "pool_short":
                pool_ms = (clock() - seen_at) * 1000
            return WatchResult(verdict, summary, clock() - t0, pool_ms, lines, last_text)
    reason = f"gave up after {horizon:.0f} s"
    return WatchResult(Verdict("fail", reason, "timeout"), summary, clock() - t0, pool_ms, lines, last_text)
