"""What every step of the host transaction works with (host/change/transaction.py drives the steps): its ports
(systemd, journal, unit files, secrets, state, log, the HTTP checks, the router, the clock), what this run
has seen so far, the change being made, and the Result a verb comes to."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.host.change.bootguard import RUN_DIR, BootGuard
from agent.host.change.decide import Gate
from agent.host.change.record import Record
from agent.host.events import EventLog
from agent.host.roles.daemon import DaemonUnit
from agent.host.roles.router import HttpRouter, RouterPort
from agent.host.secrets import SecretFiles
from agent.host.state import StateDir
from agent.host.units import UnitFiles
from agent.host.watch import drain
from agent.host.watch.gpu_procs import processes
from agent.host.watch.loadcheck import LoadResult, LoadSpec
from agent.host.watch.roleswitch import RoleSwitchPort, http_role_switch
from agent.host.watch.start import JournalPort
from agent.protocol.answers import GpuProcess
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Event, Outcome, OutcomeData
from agent.protocol.requests import Request, Smoke
from agent.sglang.flags import FlagsError, FlagValue, parse_unit_flags

if TYPE_CHECKING:
    from agent.host.prewarm import Prewarmed
    from agent.host.systemd import JobResult, UnitState
    from agent.host.watch.probe import SmokeResult


class SystemdPort(Protocol):
    """What the transaction asks of systemd (agent.host.systemd.Systemd; a fake in the pure tests)."""

    def daemon_reload(self) -> None: ...

    def unit_state(self, unit: str) -> UnitState: ...

    def restart(self, unit: str, timeout: float) -> JobResult: ...

    def stop(self, unit: str, timeout: float) -> JobResult: ...

    def start(self, unit: str, timeout: float) -> JobResult: ...

    def leftovers(self, unit: str) -> list[int]: ...

    def kill(self, unit: str, signal: int) -> None: ...


class ProbePort(Protocol):
    """The HTTP checks of a started server (agent.host.watch.probe.Probe); they raise ProbeError."""

    def wait_ready(self, timeout_s: float) -> None: ...

    def smoke(self, smoke: Smoke) -> SmokeResult: ...

    def server_info(self) -> dict[str, Any]: ...

    def load(self, smoke: Smoke, spec: LoadSpec) -> LoadResult: ...

    def requests_served(self) -> int | None: ...


ProbeFactory = Callable[[str, int, "str | None"], ProbePort]  # (host, port, api key) -> probe


def http_probe(host: str, port: int, api_key: str | None) -> ProbePort:
    from agent.host.watch.probe import Probe  # requests: only once a start is ready

    return Probe(host, port, api_key)


def utc_clock() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Result:
    outcome: Outcome
    message: str
    data: OutcomeData = field(default_factory=lambda: OutcomeData())


@dataclass
class Ports:
    """The outside world of one transaction; the verbs' request may be replaced before a verb runs."""

    req: Request
    txn: str
    systemd: SystemdPort
    journal: JournalPort
    log: EventLog
    files: UnitFiles
    secrets: SecretFiles
    state: StateDir
    daemon: DaemonUnit
    probe: ProbeFactory = http_probe  # the HTTP checks (a fake in the pure tests)
    router: Callable[[str], RouterPort] = HttpRouter  # the model gateway's API (a fake, too)
    # SGLang's POST /pd_role_switch of this unit's server, a [pd] role switch (a fake, too)
    role_switch: Callable[[str, int, str | None, str | None], RoleSwitchPort] = http_role_switch
    now: Callable[[], datetime] = utc_clock  # the clock of backup names and records
    # The GPU processes by card (nvidia-smi; None without it), the unit's own marked (a fake, too).
    gpu_procs: Callable[[str | None], Mapping[int, Sequence[GpuProcess]] | None] = processes
    run_dir: Path = RUN_DIR  # the boot guard's marker folder (host/change/bootguard.py): a tmpfs
    # waiting for another service's start on the host (host/change/pinning.py): fakes in the pure tests
    wait: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic

    @property
    def unit(self) -> str:
        return self.req.unit

    def http(self) -> ProbePort:
        """The HTTP checks of this unit's server."""
        return self.probe(self.req.http_host, self.req.port, self.secrets.api_key())

    @property
    def guard(self) -> BootGuard:
        return BootGuard(self.files.dir, self.unit, self.run_dir)

    def record(self, phase: str, backup: str | None, new: str, wrote: bool = True) -> None:
        """The recovery record of this change at `phase`, with the invocation running now; a group
        node's unit gets its boot guard with it (host/change/bootguard.py), armed after the record is saved: a
        guard with no record is one nothing would ever remove (recover() removes one it finds)."""
        started = self.now().isoformat()
        invocation = self.systemd.unit_state(self.unit).invocation_id
        self.state.save_record(
            Record(self.txn, self.unit, phase, backup, sha256(new), self.req.verb, started, wrote, invocation)
        )
        if self.req.group is not None:
            self.guard.arm()

    def clear_record(self) -> None:
        """The change is decided: its boot guard goes, then its record (a record outliving its guard is
        recovered again; a guard outliving its record would skip every boot's start). systemd reads the
        unit again without the guard: else it says NeedDaemonReload, and the next compare takes the
        unit for one not running as installed."""
        if self.guard.disarm():
            self.systemd.daemon_reload()
        self.state.clear_record(self.unit)


@dataclass
class Run:
    """What this run has seen so far, read by the steps after the one that saw it."""

    smoke_result: SmokeResult | None = None
    load_result: LoadResult | None = None
    prewarmed: Prewarmed | None = None
    drains: list[drain.Drain] = field(default_factory=list)  # the old server's, then the rejected one's
    stopping_at: str = ""
    barrier: str | None = None  # a node of a group that got no "go": why it never started
    group_start_bound_s: float | None = None  # rank 0's start bound; the pure tests' is short
    no_go: bool = False  # rank 0 aborted before any rank took "go": its old unit starts at once
    recovering: bool = False  # restoring an earlier change's backup: never this change's barrier
    hold_old: bool = False  # a group node's recovery: the old unit starts only on its group's go-back
    in_doubt: str | None = None  # a group's node that stopped and got no word: why it stays stopped
    events: list[Event] = field(default_factory=list)  # this run's events: the downtime is read off them
    unrecovered: Record | None = None  # the record whose recovery failed
    recovered: str | None = None  # what the last recover() did
    unreadable: str | None = None  # a recovery refused: the interrupted change's group record is unreadable


@dataclass(frozen=True)
class Change:
    """The unit being installed: its text, its gate and smoke test, the backup it replaced (once taken),
    and the backup it restores (a rollback's)."""

    new: str
    gate: Gate
    smoke: Smoke | None
    backup: str | None = None
    restored_from: str | None = None


NO_UNIT = ("not-found", "masked")  # systemd's load states of a name with no unit to run (an empty file)


def node_rank(unit_text: str) -> int:
    """The unit's --node-rank (0 when absent or unreadable): ranks >= 1 of a multi-node service."""
    try:
        rank = parse_unit_flags(unit_text).get("node-rank", 0) if unit_text else 0
    except FlagsError:
        return 0
    text = str(rank)
    return int(text) if text.isdigit() else 0


def flags_of(unit_text: str) -> dict[str, FlagValue]:
    """The unit's SGLang flags; none (nothing to compare) for a command deployctl cannot read."""
    try:
        return parse_unit_flags(unit_text)
    except FlagsError:
        return {}
