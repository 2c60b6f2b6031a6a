"""What the host sends back while a verb runs: Events (JSON lines), the last one an outcome, and what
each kind of event carries (its stage, the outcome and the change's figures).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, TypedDict, cast

from agent.exitcodes import ExitCode
from agent.protocol.common import VERSION, ProtocolError

if TYPE_CHECKING:
    from agent.sglang.logs.summary import StartFigures


class Stage(str, Enum):
    """The steps of a transaction: the same words on screen, on the wire and in the report."""

    LOCK = "lock"
    RECOVER = "recover"
    COMPARE = "compare"
    BACKUP = "backup"
    WRITE = "write"
    RELOAD = "reload"
    PREWARM = "prewarm"
    ROUTER = "router"
    DRAIN = "drain"
    RESTART = "restart"
    WATCH = "watch"
    GATE = "gate"
    READY = "ready"
    SMOKE = "smoke"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    RESTORE = "restore"
    VERIFY_OLD = "verify_old"
    SWITCH = "switch"  # a [pd] unit's role switched in place (POST /pd_role_switch), no restart
    GROUP = "group"  # one node of a multi-node service: its stop, its vote, the group's decision
    DONE = "done"


# A restart's downtime, phase by phase in the order they happen (host/watch/timeline.py measures them).
DOWNTIME_PHASES = ("drain", "stop", "init", "weights", "pool", "cuda_graphs", "ready", "smoke", "rollback")


class Outcome(str, Enum):
    """How a transaction ended; its exit code and the report's headline come from OUTCOMES."""

    APPLIED = "applied"
    UP_TO_DATE = "up_to_date"
    ROLLED_BACK = "rolled_back"  # rejected; the old unit restored and verified healthy
    ROLLBACK_FAILED = "rollback_failed"  # a person must act; both units kept
    LOCKED = "locked"
    ERROR = "error"  # refused before any change (bad request, write failure with the old unit intact)
    AGENT_ERROR = "agent_error"  # the agent crashed; its recovery record makes the next run restore

    @property
    def exit_code(self) -> ExitCode:
        return OUTCOMES[self][0]

    @property
    def headline(self) -> str:
        return OUTCOMES[self][1]

    @classmethod
    def read(cls, value: object) -> Outcome | None:
        """An outcome as the wire carries it; None for anything else (an older or broken agent)."""
        try:
            return cls(value)
        except ValueError:
            return None


# The one table: an outcome -> the exit code scripts rely on, and the report's headline.
OUTCOMES: dict[Outcome, tuple[ExitCode, str]] = {
    Outcome.APPLIED: (ExitCode.OK, "APPLIED"),
    Outcome.UP_TO_DATE: (ExitCode.OK, "UP TO DATE: nothing to do, no restart"),
    Outcome.ROLLED_BACK: (
        ExitCode.ROLLED_BACK,
        "ROLLED BACK: the change was rejected; the old service is healthy again",
    ),
    Outcome.ROLLBACK_FAILED: (ExitCode.ROLLBACK_FAILED, "ROLLBACK FAILED: a person must act"),
    Outcome.LOCKED: (ExitCode.LOCKED, "LOCKED: another deploy is running"),
    Outcome.ERROR: (ExitCode.REFUSED, "REFUSED: nothing was changed"),
    Outcome.AGENT_ERROR: (ExitCode.INTERNAL, "AGENT ERROR: the host restores the old unit on its next run"),
}


def exit_code(outcome: object) -> ExitCode:
    """The exit code of an outcome read off the wire; an unknown one is an internal error."""
    known = Outcome.read(outcome)
    return known.exit_code if known else ExitCode.INTERNAL


class DrainData(TypedDict):
    """A restart's drain (host/watch/drain.py Drain)."""

    end: str
    in_flight: int  # running + waiting when the drain began
    finished: int
    cut: int
    seconds: float
    waited_s: float
    timeout_s: float


class PrewarmData(TypedDict):
    """The page-cache pre-warm before the restart (host/prewarm.py Prewarmed)."""

    files: int
    total_bytes: int
    read_bytes: int
    seconds: float
    skip: str | None


class DowntimeData(TypedDict):
    """A restart's downtime by phase (host/watch/timeline.py Downtime)."""

    seconds: float | None
    phases: dict[str, float]


class SmokeData(TypedDict):
    """The smoke test's answer (host/watch/probe.py SmokeResult)."""

    prompt_tokens: int
    seconds: float
    answer: str
    passed: bool
    detail: str


class LoadData(TypedDict):
    """The load check ([smoke] load): how its requests ended, and the long prompt's two figures."""

    requests: int
    failed: int
    detail: str | None
    prefill_tokens_per_s: float | None
    decode_ms_per_token: float | None
    long_prompt_tokens: int | None
    seconds: float


class RouterData(TypedDict):
    """The router in front: how long the worker was out, and whether it is back (None: never listed)."""

    url: str
    worker: str
    out_s: float
    back: bool | None


class OutcomeData(TypedDict, total=False):
    """An outcome event's data: the outcome and the change's figures (each verb sends its part)."""

    outcome: str  # an Outcome's value, or one the laptop gives (not_started, unreachable...)
    peak_rss_kib: int  # the runner's

    summary: StartFigures
    backup: str | None
    start_seconds: float
    downtime: DowntimeData
    prewarm: PrewarmData
    drain: DrainData
    smoke: SmokeData
    load: LoadData
    router: RouterData
    reason: str
    failure_kind: str | None
    rejected: str
    restore_failure: str
    restored_from: str  # a rollback's backup


class EventJson(TypedDict):
    """An Event as its JSON line reads (Event.to_json)."""

    txn: str
    seq: int
    ts: str
    stage: str
    kind: str
    message: str
    data: dict[str, Any]  # what each kind of event carries (OutcomeData for an outcome)
    version: int


@dataclass(frozen=True)
class Event:
    """One step of a transaction, as a JSON line; kind "outcome" is the last one."""

    txn: str
    seq: int
    ts: str  # UTC, ISO 8601 with milliseconds
    stage: str
    kind: str  # "step" | "progress" | "log" | "warning" | "outcome"
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def outcome_data(self) -> OutcomeData:
        """An outcome event's data, as the agent writes it."""
        return cast(OutcomeData, self.data)

    @classmethod
    def from_json(cls, line: str) -> Event:
        raw = json.loads(line)
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise ProtocolError("not an event of this protocol version")
        return cls(**raw)

    @property
    def is_outcome(self) -> bool:
        return self.kind == "outcome"
