"""A change as an ordered list of unit jobs, written to its recovery record before the first one runs.

A change used to be one systemd job on one unit; with the weight-cache daemon it is up to three on two
units (stop the engine, restart the daemon and wait, start the engine), and a group node stops, waits,
then starts. Each is a Job: the unit, the action, and the sha256 of the unit text it should end with
(None: it ends stopped). The list goes into the change's record (host/change/record.py Record.jobs) before its
first job, and `done` counts the jobs finished, written after each. The next job (the one that may be
in flight) carries `seen`: its unit's invocation and state just before it could begin. A recovery reads
the list for one thing (`touched`): whether the interrupted change may have reached the service. A job
begun on a unit other than the engine (the daemon), or an engine that no longer runs its recorded
start, says it did; an in-flight job whose unit is still as `seen` did not run. A touched change is
undone by the same code that made it (the restart of the restored unit plans the jobs the old texts
need, from what runs now); the list never replays or reverses jobs one by one. A recovery's own jobs
are appended after the ones earlier runs began, so a recovery killed in turn still sees them.
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
    seen: str | None = None  # its unit's snapshot() once it was next to run; None: not taken

    @staticmethod
    def parse(raw: Any) -> Job:
        """One job of a record; ValueError for anything deployctl never writes."""
        if not isinstance(raw, dict) or set(raw) - {"seen"} != {"unit", "action", "sha256"}:
            raise ValueError("a job is {unit, action, sha256, seen}")
        unit, action, sha, seen = raw["unit"], raw["action"], raw["sha256"], raw.get("seen")
        if not isinstance(unit, str) or action not in ACTIONS or not (sha is None or isinstance(sha, str)):
            raise ValueError(f"not a job: {raw!r}")
        if not (seen is None or isinstance(seen, str)):
            raise ValueError(f"not a job: {raw!r}")
        return Job(unit, action, sha, seen)


def snapshot(invocation: str, active_state: str) -> str:
    """What a job on a unit changes: a stop its state, a start or restart its invocation."""
    return f"{invocation}/{active_state}"


Look = Callable[[str], str]  # a unit's snapshot() now


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


def touched(
    record: _Record, engine: str, active_state: str, invocation: str, look: Look | None = None
) -> bool:
    """Whether the change reached the service: an engine that no longer runs, or runs another start,
    or a job begun on another unit (the daemon) says so; the in-flight job did not begin when its unit
    is still as it was seen before it (`look`: a unit's snapshot now). A record from an older agent has
    no jobs: its invocation alone says, as it did, but an inactive engine is never untouched."""
    if not record.invocation or invocation != record.invocation or active_state not in _RUNNING:
        return True
    jobs = begun(record.jobs, record.done)
    if look is not None and record.done < len(record.jobs):
        nxt = record.jobs[record.done]
        if nxt.seen is not None and look(nxt.unit) == nxt.seen:
            jobs = jobs[:-1]  # sent or not, it has not run (a stop changes the state, a start the invocation)
    return any(j.unit != engine for j in jobs)


class Unrecorded(RuntimeError):
    """A unit job about to run with no recovery record: a kill would leave nothing to recover from."""


@dataclass
class JobLog:
    """The jobs of the change on `engine`, in its recovery record: appended after the jobs earlier runs
    began (a recovery's own jobs after the interrupted change's), `done` counting from the start."""

    state: _Records
    engine: str
    look: Look | None = None  # a unit's snapshot now: the next job's `seen`
    base: int = 0  # the jobs of the record before this run's last plan

    def _seen(self, jobs: Sequence[Job], n: int) -> tuple[Job, ...]:
        """The jobs, with the n-th (the next to run) marked with its unit as it is now."""
        if self.look is None or n >= len(jobs):
            return tuple(jobs)
        return (*jobs[:n], replace(jobs[n], seen=self.look(jobs[n].unit)), *jobs[n + 1 :])

    def plan(self, jobs: Sequence[Job]) -> None:
        """Written, fsynced, before the first job runs; never without a record (Unrecorded)."""
        record = self.state.load_record(self.engine)
        if record is None:
            raise Unrecorded(f"no recovery record for {self.engine}: its unit jobs are not run unrecorded")
        kept = begun(record.jobs, record.done)
        self.base = len(kept)
        self.state.save_record(replace(record, jobs=self._seen((*kept, *jobs), self.base), done=self.base))

    def finished(self, n: int) -> None:
        """The first n jobs of the last plan are done."""
        record = self.state.load_record(self.engine)
        if record is not None and record.jobs:
            done = min(self.base + n, len(record.jobs))
            self.state.save_record(replace(record, jobs=self._seen(record.jobs, done), done=done))

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
