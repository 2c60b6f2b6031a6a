"""A change as an ordered list of unit jobs, written to its recovery record before the first one runs.

A change used to be one systemd job on one unit; with the weight-cache daemon it is up to three on two
units (stop the engine, restart the daemon and wait, start the engine), and a group node stops, waits,
then starts. Each is a Job: the unit, the action, and the sha256 of the unit text it should end with
(None: it ends stopped). The list goes into the change's record (host/change/record.py Record.jobs) before its
first job, and `done` counts the jobs finished, written after each. A recovery reads it (`touched`):
a change whose jobs reached a unit other than the engine, or whose engine no longer runs, is never
"untouched"; it is undone by the same code that made it (the restart of the restored unit plans the
jobs the old texts need, from what runs now). NixOS's switch-to-configuration keeps its pending lists
under /run the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.host.systemd import JobResult

ACTIONS = ("stop", "start", "restart")
_RUNNING = ("active", "reloading", "activating")


@dataclass(frozen=True)
class Job:
    unit: str
    action: str  # stop | start | restart
    sha256: str | None  # the unit text it should end with; None: stopped

    @staticmethod
    def parse(raw: Any) -> Job:
        """One job of a record; ValueError for anything deployctl never writes."""
        if not isinstance(raw, dict) or set(raw) != {"unit", "action", "sha256"}:
            raise ValueError("a job is {unit, action, sha256}")
        unit, action, sha = raw["unit"], raw["action"], raw["sha256"]
        if not isinstance(unit, str) or action not in ACTIONS or not (sha is None or isinstance(sha, str)):
            raise ValueError(f"not a job: {raw!r}")
        return Job(unit, action, sha)


class _Record(Protocol):
    """What a recovery record (host/change/record.py Record) says of the jobs; `replace` works on it."""

    @property
    def invocation(self) -> str: ...

    @property
    def jobs(self) -> tuple[Job, ...]: ...

    @property
    def done(self) -> int: ...


class _Records(Protocol):
    """The state folder's records (host/state.py StateDir)."""

    def load_record(self, unit: str) -> Any: ...

    def save_record(self, record: Any) -> None: ...


def begun(jobs: Sequence[Job], done: int) -> tuple[Job, ...]:
    """The jobs that may have run: those recorded done, and the next one (it may be in flight)."""
    return tuple(jobs[: done + 1])


def touched(record: _Record, engine: str, active_state: str, invocation: str) -> bool:
    """Whether the change reached the service: an engine that no longer runs, or runs another start,
    or a job begun on another unit (the daemon) says so. A record from an older agent has no jobs: its
    invocation alone says, as it did, but an inactive engine is never untouched."""
    if not record.invocation or invocation != record.invocation or active_state not in _RUNNING:
        return True
    return any(j.unit != engine for j in begun(record.jobs, record.done))


@dataclass
class JobLog:
    """The jobs of the change on `engine`, in its recovery record (a run with no record logs nothing)."""

    state: _Records
    engine: str

    def plan(self, jobs: Sequence[Job]) -> None:
        """Written, fsynced, before the first job runs."""
        record = self.state.load_record(self.engine)
        if record is not None:
            self.state.save_record(replace(record, jobs=tuple(jobs), done=0))

    def finished(self, n: int) -> None:
        """The first n jobs are done."""
        record = self.state.load_record(self.engine)
        if record is not None and record.jobs:
            self.state.save_record(replace(record, done=n))

    def run(self, jobs: Sequence[Job], calls: Sequence[Callable[[], JobResult]]) -> list[JobResult]:
        """Plan, then each job with its completion recorded after it; stops at the first failed job."""
        self.plan(jobs)
        results: list[JobResult] = []
        for n, call in enumerate(calls, 1):
            results.append(call())
            self.finished(n)
            if not results[-1].ok:
                break
        return results
