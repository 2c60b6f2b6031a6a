"""The deploy transaction on the host: back up, write, restart, watch, gate, commit -- or roll back.

The old unit is never lost: a recovery record is written before the first change and cleared only
after the new unit was verified or the old one restored; `recover` finishes whatever a killed run left.

Transaction is the driver; each step lives in a module of its own, with its ports (host/change/ports.py):
compare (compare.py), backup/write/reload (write.py), drained restart and watch (restart.py), verify
(verify.py), commit (commit.py), roll back and restore (restore.py), recovery (recover.py); a group's node
(host/roles/groupstep.py) and the router (host/roles/routerstep.py) wrap the plain change.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from agent.host.change import compare, pinning, recover, write
from agent.host.change.commit import commit
from agent.host.change.decide import Gate
from agent.host.change.next_step import Observed, Step, next_step, verified, watched
from agent.host.change.ports import (
    Change,
    Ports,
    ProbeFactory,
    ProbePort,
    Result,
    Run,
    SystemdPort,
    http_probe,
)
from agent.host.change.restart import after_check, restart_and_watch
from agent.host.change.restore import group_node, roll_back, stop_rank
from agent.host.change.verify import verify
from agent.host.events import EventLog
from agent.host.roles import groupstep, pdswitch, routerstep
from agent.host.roles.daemon import DaemonUnit
from agent.host.roles.pdrouter import is_router
from agent.host.roles.router import RouterPort
from agent.host.secrets import SecretFiles
from agent.host.state import StateDir
from agent.host.units import UnitFiles
from agent.host.watch.start import JournalPort
from agent.protocol.events import Event, Outcome, Stage
from agent.protocol.requests import MAX_RESTARTS_UNDER_CHECK, Request

__all__ = ["ProbeFactory", "ProbePort", "Result", "SystemdPort", "Transaction"]


class Transaction:
    """One verb on one unit, with the lock already held by the caller."""

    def __init__(
        self,
        req: Request,
        txn: str,
        systemd: SystemdPort,
        journal: JournalPort,
        log: EventLog,
    ) -> None:
        self.txn = txn
        self.systemd = systemd
        self.journal = journal
        self.log = log
        self.files = UnitFiles(req.unit_dir)
        self.secrets = SecretFiles(req.secrets_dir, req.unit)
        self.state = StateDir(req.state_dir)
        self.unit = req.unit
        self.daemon = DaemonUnit(self.files, self.state, req.unit, systemd, log, req.timeouts.weights_s)
        self.ports = Ports(
            req, txn, systemd, journal, log, self.files, self.secrets, self.state, self.daemon, http_probe
        )
        self.run = Run()
        log.listeners.append(self.run.events.append)

    # what a caller (or a pure test) may set before a verb: the steps read it through their ports
    @property
    def req(self) -> Request:
        return self.ports.req

    @req.setter
    def req(self, req: Request) -> None:
        self.ports.req = req

    @property
    def probe(self) -> ProbeFactory:
        """The HTTP checks (a fake in the pure tests)."""
        return self.ports.probe

    @probe.setter
    def probe(self, probe: ProbeFactory) -> None:
        self.ports.probe = probe

    @property
    def router(self) -> Callable[[str], RouterPort]:
        """The model gateway's API (a fake in the pure tests)."""
        return self.ports.router

    @router.setter
    def router(self, router: Callable[[str], RouterPort]) -> None:
        self.ports.router = router

    @property
    def now(self) -> Callable[[], datetime]:
        """The clock of backup names and records."""
        return self.ports.now

    @now.setter
    def now(self, now: Callable[[], datetime]) -> None:
        self.ports.now = now

    @property
    def group_start_bound_s(self) -> float | None:
        """Rank 0's start bound; the pure tests' is short."""
        return self.run.group_start_bound_s

    @group_start_bound_s.setter
    def group_start_bound_s(self, bound: float | None) -> None:
        self.run.group_start_bound_s = bound

    @property
    def events(self) -> list[Event]:
        """This run's events: the downtime is read off them."""
        return self.run.events

    # -- the verbs ------------------------------------------------------------------------------
    def apply(self) -> Result:
        assert self.req.unit_text is not None and self.req.target_context is not None
        blocked = self._recover_first() or write.overridden(self.ports)
        if blocked is not None:
            return blocked
        compared = self.compare()
        if isinstance(compared, Result):
            return compared
        refused = None if is_router(self.ports) else compare.check_with_sglang(self.ports, self.req.unit_text)
        if refused is not None:
            return refused
        daemon = self.daemon.refusal(self.req.unit_text, self.req.daemon_text, self.req.group is not None)
        if daemon is not None:  # a dead daemon, or one holding another fingerprint: before any restart
            self.log.emit(Stage.COMPARE, "warning", daemon)
            return Result(Outcome.ERROR, daemon + "; nothing changed")
        gate = Gate(self.req.target_context, self.req.planned_pool, self.req.margin, self.req.timeouts,
                    calibrated=self.req.pool_calibrated,
                    planned_host_pool=self.req.planned_host_pool)  # fmt: skip
        change = Change(self.req.unit_text, gate, self.req.smoke)
        return self._one_at_a_time(change, compared)

    def compare(self, wait: bool = True) -> Result | dict[str, str | None]:
        """The installed unit against the request, changing nothing (host/change/compare.py)."""
        return compare.compare(self.ports, wait)

    def rollback(self) -> Result:
        """Manual rollback: install a backup through the same change-and-verify path, so it can be undone."""
        # An explicit --to is a person's own way out of a failed recovery; the default never is.
        blocked = self._recover_first(explicit=self.req.backup is not None)
        if blocked is not None:
            return blocked
        installed = self.files.read(self.unit)
        # The default: the newest backup that differs from the installed unit (after an automatic
        # rollback the newest backup is a copy of the installed unit: restoring it would change nothing).
        backups = [b.name for b in self.files.backups(self.unit) if self.files.read(b.name) != installed]
        name = self.req.backup or (backups[0] if backups else None)
        if name is None or not self.files.path(name).is_file():
            return Result(Outcome.ERROR, f"no backup {name or 'that differs from the installed unit'}")
        text = self.files.read(name) or ""
        change = Change(text, Gate(None, None, 0.0, self.req.timeouts), None, restored_from=name)
        result = self._one_at_a_time(change, self.secrets.of_backup(name))
        result.data["restored_from"] = name
        return result

    def recover_only(self) -> Result:
        """The `recover` verb: what finishing an earlier run's change came to, as an outcome."""
        blocked = self._recover_first()
        if blocked is not None:
            return blocked
        if self.run.recovered is None:
            return Result(Outcome.UP_TO_DATE, "nothing to recover")
        if self.run.recovered == "kept":
            return Result(Outcome.APPLIED, "the interrupted change had been verified: kept")
        if self.run.recovered == "in-doubt":
            return Result(Outcome.ROLLBACK_FAILED, self.run.in_doubt or "in doubt")
        return Result(Outcome.ROLLED_BACK, "an interrupted change was rolled back; the old unit is healthy")

    def recover(self) -> str | None:
        """Finish what an earlier run left: keep a verified unit, otherwise restore the backup
        (host/change/recover.py)."""
        return recover.recover(self.ports, self.run)

    def _recover_first(self, explicit: bool = False) -> Result | None:
        """Finish an earlier run's change; a failed or impossible recovery stops everything here."""
        self.log.emit(Stage.RECOVER, "step", "checking for an unfinished earlier run")
        with pinning.recovering(self.ports) as waited:  # its restart waits for another's start too
            if waited is not None:
                return waited
            found = self.run.recovered = self.recover()
        if found not in ("corrupt", "group-unreadable", "failed"):
            routerstep.rejoin_left_out(self.ports)
        return recover.blocked(self.ports, self.run, found, explicit)

    # -- the change ------------------------------------------------------------------------------
    def _one_at_a_time(self, change: Change, secrets: dict[str, str | None]) -> Result:
        """The change, out of its router, and (when its units pin host memory) alone among the host's
        services from its first write to its end (host/change/pinning.py)."""
        with pinning.one_start_at_a_time(self.ports, self.files.read(self.unit), change.new) as waited:
            if waited is not None:
                return waited
            return write.shadowed(self.ports) or routerstep.out_of_router(
                self.ports, lambda: self._change(change, secrets)
            )

    def _change(self, change: Change, secrets: dict[str, str | None]) -> Result:
        """Back up, write (secrets, then the unit), reload, restart, watch, gate: commit or roll back."""
        written = write.write(self.ports, self.run, change, secrets)
        if isinstance(written, Result):
            return written
        return self._start_and_decide(written)

    def _start_and_decide(self, change: Change) -> Result:
        """A group's node: the group step wraps the plain steps (host/roles/groupstep.py, the group machine
        deciding); one host: the plain steps, host/change/next_step.py deciding."""
        if self.req.group is not None and self.req.pd_switch_role is not None:  # no restart: a role switch
            return pdswitch.switch_and_decide(self.ports, self.run, change)
        if self.req.group is not None and self.req.pd_router_keeps:  # ... and its router's unit written
            return pdswitch.router_written(self.ports, self.run, change)
        if self.req.group is not None:
            return groupstep.start_and_decide(self.ports, self.run, change)
        return self._steps(change)

    def _backup_text(self, change: Change) -> str | None:
        return self.files.read(change.backup) if change.backup else None

    def _steps(self, change: Change) -> Result:
        """Restart, watch, gate, verify: commit the new unit, or roll back to the backup; what comes next is
        decided by next_step (host/change/next_step.py) from what the steps observed."""
        seen, reason, started, cursor, rechecks = Observed(), "", None, None, 0
        while True:
            step = next_step(seen)
            if step is Step.RESTART:
                started = restart_and_watch(self.ports, self.run, change.gate, Stage.WATCH)
                seen, reason = watched(started.verdict.action), started.verdict.reason
                continue
            assert started is not None
            if step is Step.VERIFY:
                cursor = self.ports.journal.cursor()  # a start that replaces this one logs after it
                failed = verify(self.ports, self.run, started, change)
                seen, reason = verified(seen, failed), reason if failed is None else failed
            elif step is Step.COMMIT:
                after = after_check(self.ports, started, change.gate, cursor)
                if after is None:
                    return commit(self.ports, self.run, started, change)
                rechecks += 1
                if isinstance(after, str) or rechecks > MAX_RESTARTS_UNDER_CHECK:
                    failed = (
                        after
                        if isinstance(after, str)
                        else "the engine keeps being restarted under the checks"
                    )
                    seen, reason = verified(seen, failed), failed
                else:  # its new start, watched: verified again, then here again
                    started, seen, reason = after, watched(after.verdict.action), after.verdict.reason
            elif self.req.verb == "rollback" and group_node(change.new, self._backup_text(change)):
                return stop_rank(self.ports, self.run, change, reason, started)  # never the new unit alone
            else:
                return roll_back(self.ports, self.run, change, reason, started)
