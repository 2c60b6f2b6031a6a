"""What one host's part of a rollout came to, and the fleet report: data in, text out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

from agent.exitcodes import ExitCode
from agent.sglang.flags import FlagValue
from agent.sglang.logs.summary import StartFigures

FAILED = ("rolled_back", "rollback_failed", "unreachable", "error", "agent_error", "locked", "not_started")


class HostStatus(TypedDict, total=False):
    """`deployctl fleet status`'s row of one host (its --json output)."""

    host: str
    reachable: bool
    message: str  # why it is unreachable
    active: str | None
    measured_pool: int | None
    flags: dict[str, FlagValue]  # redacted
    unit_sha256: str | None
    drift: bool
    planned_fraction: float
    drift_against: int | None  # the context the drift was judged at
    nodes: int  # a multi-node service's node count (its row stands for all of them)
    warning: str  # a rank down while rank 0 runs


class FleetEvent(TypedDict, total=False):
    """One line of the rollout's events file (fleet/events.py writes them, the front end follows them)."""

    kind: str  # "phase", "result" or "status"
    host: str
    phase: str  # a phase line's
    message: str
    result: HostResultData
    status: HostStatus


class PlanFiguresData(TypedDict):
    fraction: float
    requests: int
    predicted_pool: int
    feasible: bool
    basis: str
    calibrated_from: list[str]


class RankResultData(TypedDict):
    rank: int
    target: str
    outcome: str | None
    message: str
    backup: str | None


class HostResultData(TypedDict, total=False):
    """HostResult.to_dict: its fields, with what they imply (changed, failed, revert)."""

    host: str
    outcome: str
    message: str
    target: int | None
    plan: PlanFiguresData | None
    measured_pool: int | None
    before: dict[str, Any]
    after: dict[str, Any]
    backup: str | None
    smoke_seconds: float | None
    downtime_s: float | None
    measured_start: StartFigures | None
    ranks: list[RankResultData]
    failed_rank: int | None
    changed: bool
    failed: bool
    revert: str | None


@dataclass(frozen=True)
class PlanFigures:
    """The plan as the report shows it: what was chosen, and from which measurements."""

    fraction: float
    requests: int
    predicted_pool: int
    feasible: bool
    basis: str  # "calibrated" or "architecture"
    calibrated_from: tuple[str, ...] = ()  # "own start", "canary ct200-a"...


@dataclass(frozen=True)
class RankResult:
    """One node of a multi-node service: where its own transaction (or the group's rollback) left it."""

    rank: int
    target: str  # its SSH target
    outcome: str | None  # None: no contact, its state is unknown
    message: str
    backup: str | None = None  # the unit its apply replaced, on that node


@dataclass(frozen=True)
class HostResult:
    host: str
    outcome: str  # an agent Outcome, or "unreachable", or "not_feasible"
    message: str
    target: int | None = None
    plan: PlanFigures | None = None
    measured_pool: int | None = None
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    backup: str | None = None
    smoke_seconds: float | None = None
    downtime_s: float | None = None
    measured_start: StartFigures | None = None  # the start's figures, for recalibrating later hosts
    # A multi-node service (one row, one host of the rollout): every node, and the rank that stopped it.
    ranks: tuple[RankResult, ...] = ()
    failed_rank: int | None = None

    @property
    def changed(self) -> bool:
        """The unit on the host differs from before (a rollback restored it: unchanged)."""
        return self.outcome in ("applied", "would_change")

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED or self.outcome == "not_feasible"

    @property
    def revert(self) -> str | None:
        if self.outcome != "applied":
            return None
        if self.ranks:  # a group refuses a one-node rollback: an apply of the old context restarts all
            old = self.before.get("context-length")
            return f"deployctl apply {self.host} --context {old}" if old is not None else None
        return f"deployctl rollback {self.host} --to {self.backup}" if self.backup else None

    def to_dict(self) -> HostResultData:
        data = cast(HostResultData, asdict(self))  # the fields are the keys above
        data.update(HostResultData(changed=self.changed, failed=self.failed, revert=self.revert))
        if data["plan"] is not None:
            data["plan"]["calibrated_from"] = list(data["plan"]["calibrated_from"])
        data["ranks"] = list(data["ranks"])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostResult:
        names = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in names}
        plan = values.get("plan")
        if plan is not None:
            values["plan"] = PlanFigures(
                **{**plan, "calibrated_from": tuple(plan.get("calibrated_from", ()))}
            )
        values["ranks"] = tuple(RankResult(**r) for r in values.get("ranks") or ())
        return cls(**values)


@dataclass(frozen=True)
class FleetReport:
    group: str
    hosts: tuple[str, ...]  # every host of the group, in rollout order
    results: dict[str, HostResult]
    target: int | None = None

    @property
    def untouched(self) -> list[str]:
        return [h for h in self.hosts if h not in self.results]

    @property
    def halted(self) -> bool:
        return bool(self.untouched) and any(r.failed for r in self.results.values())

    def exit_code(self) -> ExitCode:
        outcomes = {r.outcome for r in self.results.values()}
        if "rollback_failed" in outcomes:
            return ExitCode.ROLLBACK_FAILED
        if outcomes & {"rolled_back", "not_feasible", "error", "agent_error", "locked", "not_started"}:
            return ExitCode.ROLLED_BACK
        if "unreachable" in outcomes:
            return ExitCode.UNREACHABLE
        if self.untouched:  # Ansible stopped before these hosts for a reason of its own
            return ExitCode.ROLLED_BACK
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "target": self.target,
            "halted": self.halted,
            "untouched": self.untouched,
            "exit_code": int(self.exit_code()),
            "hosts": [self.results[h].to_dict() for h in self.hosts if h in self.results],
        }


def _n(value: int | None) -> str:
    return f"{value:,}" if value is not None else "-"


def _flag_change(before: Mapping[str, FlagValue], after: Mapping[str, FlagValue]) -> str:
    keys = ("context-length", "mem-fraction-static", "max-running-requests")
    parts = [f"{k} {before.get(k, '-')}->{after.get(k, '-')}" for k in keys if before.get(k) != after.get(k)]
    return ", ".join(parts) or "no flag change"


def _details(r: HostResult) -> list[str]:
    detail = [_flag_change(r.before, r.after)] if r.before or r.after else []
    if r.plan is not None:
        detail.append("planned from " + (", ".join(r.plan.calibrated_from) or "the architecture"))
    if r.ranks:  # a multi-node service: where each node is now
        detail.append(
            "nodes: " + ", ".join(f"rank {n.rank} {n.target} {n.outcome or 'unknown'}" for n in r.ranks)
        )
    if r.failed:
        detail.append(r.message)
    if r.revert:
        detail.append(f"revert: {r.revert}")
    return detail


def render_fleet(report: FleetReport) -> str:
    """Per host: outcome, flags before -> after, predicted vs measured pool, downtime, the way back."""
    lines = [f"== fleet {report.group}: {len(report.results)} of {len(report.hosts)} hosts run"]
    header = (
        f"{'host':<20} {'outcome':<15} {'fraction':>8} {'predicted':>10} {'measured':>10} {'downtime':>9}"
    )
    lines.append(header)
    for host in report.hosts:
        r = report.results.get(host)
        if r is None:
            lines.append(f"{host:<20} {'not touched':<15}")
            continue
        fraction = f"{r.plan.fraction:.3f}" if r.plan else "-"
        predicted = _n(r.plan.predicted_pool) if r.plan else "-"
        downtime = f"{r.downtime_s:.1f} s" if r.downtime_s is not None else "-"
        measured = _n(r.measured_pool)
        lines.append(f"{host:<20} {r.outcome:<15} {fraction:>8} {predicted:>10} {measured:>10} {downtime:>9}")
        lines.extend(f"  {d}" for d in _details(r))
    if report.halted:
        lines.append(f"halted: {', '.join(report.untouched)} not touched")
    elif failed := [h for h, r in report.results.items() if r.failed]:
        # In the last batch, or tolerated by --max-fail: nothing was left out, but not all went well.
        lines.append(f"every host ran; failed: {', '.join(failed)}")
    return "\n".join(lines) + "\n"


def results_from_events(events: Iterable[FleetEvent]) -> dict[str, HostResult]:
    """The last result event of each host (a re-run task replaces an earlier one)."""
    found: dict[str, HostResult] = {}
    for event in events:
        if event.get("kind") == "result" and isinstance(event.get("result"), Mapping):
            result = HostResult.from_dict(event["result"])
            found[result.host] = result
    return found


def progress_line(event: FleetEvent) -> str | None:
    """One line per host and phase for a person watching."""
    if event.get("kind") == "phase":
        return f"{event.get('host')}: {event.get('phase')}: {event.get('message')}"
    if event.get("kind") == "result":
        r = event.get("result") or {}
        return f"{r.get('host')}: done: {r.get('outcome')}: {r.get('message')}"
    return None
