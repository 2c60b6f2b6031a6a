"""Pure: a transaction's events -> the restart's downtime and where it went.

Downtime runs from the moment the old server is told to stop (the restart job is sent) to the moment the
new server answers its smoke test (or /health, when there is no smoke test). The phases in between come
from the start's own log, as the watcher saw it: stop (the old server's exit and the new process), init
(torch, NCCL), weights, pool, cuda_graphs, ready (warm-up until /health answers) and smoke.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from agent.protocol import DOWNTIME_PHASES, Event, Stage

# The start's phases as the log summary names them, and the downtime phase each one begins.
_LOG_PHASE = {"loading_weights": "weights", "kv_pool": "pool", "cuda_graphs": "cuda_graphs", "ready": "ready"}


@dataclass(frozen=True)
class Downtime:
    seconds: float | None  # None: the new server never answered (or nothing was restarted)
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def seconds_of(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def downtime(events: Iterable[Event]) -> Downtime:
    """The first restart's downtime; phases the log did not show are left out, not guessed.

    A rejected start's downtime runs on until the old server is healthy again ("rollback" phase).
    """
    marks: dict[str, float] = {}
    answered: float | None = None
    for e in events:
        at = seconds_of(e.ts)
        if e.stage == Stage.RESTART.value and e.kind == "step" and "stop" not in marks:
            stopping = e.data.get("stopping_at")
            marks["stop"] = seconds_of(stopping) if isinstance(stopping, str) else at
            marks["init"] = at
        elif "stop" not in marks:
            continue
        elif "rollback" in marks:
            if e.stage == Stage.VERIFY_OLD.value and e.kind == "step" and "kv_tokens" in e.data:
                answered = at  # the old server is back and healthy
        elif e.stage in (Stage.ROLLBACK.value, Stage.RESTORE.value):
            marks["rollback"], answered = at, None
        elif e.stage == Stage.WATCH.value and e.kind == "progress":
            phase = _LOG_PHASE.get(str(e.data.get("phase")))
            if phase is not None:
                marks.setdefault(phase, at)
        elif e.stage == Stage.READY.value and e.kind == "step":
            marks.setdefault("smoke", at)
            answered = answered or at
        elif e.stage == Stage.SMOKE.value and e.data.get("passed") is True:
            answered = marks["answered_by_smoke"] = at
    if "stop" not in marks or answered is None:
        return Downtime(None)
    if "answered_by_smoke" not in marks and "rollback" not in marks:
        marks.pop("smoke", None)  # no smoke test ran: /health was the answer
    order = [(p, marks[p]) for p in DOWNTIME_PHASES if p in marks]
    ends = [t for _, t in order[1:]] + [answered]
    phases = {p: round(max(0.0, end - start), 3) for (p, start), end in zip(order, ends, strict=True)}
    return Downtime(round(answered - marks["stop"], 3), phases)
