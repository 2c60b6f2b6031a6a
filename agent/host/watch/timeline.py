"""Pure: a transaction's events -> the restart's downtime and where it went.

Downtime runs from the moment the old server is told to stop (the restart job is sent) to the moment the
new server answers its smoke test (or /health, when there is no smoke test). The phases in between come
from the start's own log, as the watcher saw it: drain (SGLang's own SIGTERM drain: the old server still
answered /v1/loads), stop (the old server's exit and the new process), init
(torch, NCCL), weights, pool, cuda_graphs, ready (warm-up until /health answers) and smoke.

When SGLang logs its own `Engine startup timings (s)` (0.5.2x; the watcher passes them on), weights, pool
and cuda_graphs are its figures (seconds measured inside the engine, not the gaps between journal lines),
init is the rest of the time until that line (imports, process spawn, tokenizer), and ready runs from
that line to the answer: on a host with no CUDA graphs no phase is named for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from agent.protocol.events import DOWNTIME_PHASES, DowntimeData, Event, Stage

# The start's phases as the log summary names them, and the downtime phase each one begins.
_LOG_PHASE = {"loading_weights": "weights", "kv_pool": "pool", "cuda_graphs": "cuda_graphs", "ready": "ready"}


@dataclass(frozen=True)
class Downtime:
    seconds: float | None  # None: the new server never answered (or nothing was restarted)
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> DowntimeData:
        return DowntimeData(seconds=self.seconds, phases=dict(self.phases))


def seconds_of(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def downtime(events: Iterable[Event]) -> Downtime:
    """The first restart's downtime; phases the log did not show are left out, not guessed.

    A rejected start's downtime runs on until the old server is healthy again ("rollback" phase).
    """
    marks = _Marks()
    for e in events:
        marks.see(e)
    return marks.downtime()


class _Marks:
    """When each phase began, and when the server answered, as the events tell it."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.answered: float | None = None
        self.smoked = False
        self.engine: tuple[float, dict[str, float]] | None = None  # when SGLang's timings came, and them
        self.own_drain = 0.0  # SGLang's own SIGTERM drain, from the drain event

    def see(self, e: Event) -> None:
        at = seconds_of(e.ts)
        if e.stage == Stage.DRAIN.value and e.kind == "step" and "stop" not in self.at:
            # the old server answered this long after its SIGTERM: its own drain, then its shutdown
            # (only when deployctl's wait left requests to it: after an idle wait, that is only the stop)
            waited, total = e.data.get("waited_s"), e.data.get("seconds")
            left = e.data.get("end") == "timeout"
            if left and isinstance(waited, (int, float)) and isinstance(total, (int, float)):
                self.own_drain = max(0.0, float(total) - float(waited))
        elif e.stage == Stage.RESTART.value and e.kind == "step" and "stop" not in self.at:
            stopping = e.data.get("stopping_at")
            start = seconds_of(stopping) if isinstance(stopping, str) else at
            if self.own_drain:
                self.at["drain"] = start
            self.at["stop"] = min(start + self.own_drain, at)
            self.at["init"] = at
        elif "stop" not in self.at:
            return
        elif "rollback" in self.at:
            if e.stage == Stage.VERIFY_OLD.value and e.kind == "step" and "kv_tokens" in e.data:
                self.answered = at  # the old server is back and healthy
        elif e.stage in (Stage.ROLLBACK.value, Stage.RESTORE.value):
            self.at["rollback"], self.answered = at, None
        else:
            self._new_start(e, at)

    def _new_start(self, e: Event, at: float) -> None:
        timings = e.data.get("startup_timings")
        if e.stage == Stage.WATCH.value and isinstance(timings, dict) and self.engine is None:
            self.engine = (at, {str(k): float(v) for k, v in timings.items()})
        elif e.stage == Stage.WATCH.value and e.kind == "progress":
            phase = _LOG_PHASE.get(str(e.data.get("phase")))
            if phase is not None:
                self.at.setdefault(phase, at)
        elif e.stage == Stage.READY.value and e.kind == "step":
            self.at.setdefault("smoke", at)
            self.answered = self.answered or at
        elif e.stage == Stage.SMOKE.value and e.data.get("passed") is True:
            self.answered, self.smoked = at, True

    def downtime(self) -> Downtime:
        if "stop" not in self.at or self.answered is None:
            return Downtime(None)
        if not self.smoked and "rollback" not in self.at:
            self.at.pop("smoke", None)  # no smoke test ran: /health was the answer
        if self.engine is not None and "rollback" not in self.at:
            self._engine_phases(*self.engine)
        order = [(p, self.at[p]) for p in DOWNTIME_PHASES if p in self.at]
        ends = [t for _, t in order[1:]] + [self.answered]
        phases = {p: round(max(0.0, end - start), 3) for (p, start), end in zip(order, ends, strict=True)}
        return Downtime(round(self.answered - order[0][1], 3), phases)

    def _engine_phases(self, up_at: float, timings: dict[str, float]) -> None:
        """Lay SGLang's own phase seconds back from the moment its timings line came; ready from there."""
        for phase in ("weights", "pool", "cuda_graphs", "ready"):
            self.at.pop(phase, None)
        start = up_at
        for phase, key in (
            ("cuda_graphs", "cuda_graph"),
            ("pool", "kv_cache_allocation"),
            ("weights", "load_weight"),
        ):
            seconds = timings.get(key, 0.0)
            if seconds > 0:
                start = max(self.at["init"], start - seconds)
                self.at[phase] = start
        self.at["ready"] = up_at
