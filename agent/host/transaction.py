"""The deploy transaction on the host: back up, write, restart, watch, gate, commit -- or roll back.

The old unit is never lost: a recovery record is written before the first change and cleared only
after the new unit was verified or the old one restored; `recover` finishes whatever a killed run left.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from agent.host import drain, loadcheck, serverinfo
from agent.host.adopt import kept_secret_env
from agent.host.daemon_unit import DaemonUnit
from agent.host.decide import Action, Failure, Gate, fail
from agent.host.events import EventLog, utc_now
from agent.host.groupmachine import Do, Phase, Saw, files_of, node_step
from agent.host.groupmachine import Node as GroupNode
from agent.host.groupnode import NodeWaits, start_bound_s
from agent.host.grouprecovery import GroupRecord, recovery
from agent.host.groupsignal import Decision, Signals
from agent.host.loadcheck import LoadResult
from agent.host.poll import wait_until
from agent.host.router import HttpRouter, RouterError, RouterPort, put_back, take_out, undo_removal
from agent.host.secrets import SecretFiles
from agent.host.state import (
    PHASE_RESTARTED,
    PHASE_ROLLING_BACK,
    PHASE_VERIFIED,
    PHASE_WRITTEN,
    CorruptRecord,
    Record,
    StateDir,
)
from agent.host.timeline import downtime
from agent.host.txn_ports import (
    NO_UNIT,
    ProbeFactory,
    ProbePort,
    Result,
    SystemdPort,
    flags_of,
    http_probe,
    node_rank,
    utc_clock,
)
from agent.host.units import UnitFiles, UnitWriteError
from agent.host.watch import JournalPort, WatchedStart, WatchResult, watch_start
from agent.protocol.answers import HistoryEntry
from agent.protocol.common import ProtocolError
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Event, Outcome, OutcomeData, RouterData, Stage
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, Request, Smoke
from agent.sglang.flags import parse_unit_flags
from agent.sglang.logs.summary import summarize

if TYPE_CHECKING:
    from agent.host.prewarm import Prewarmed
    from agent.host.probe import SmokeResult
    from agent.host.systemd import JobResult, UnitState

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
        self.req = req
        self.txn = txn
        self.systemd = systemd
        self.journal = journal
        self.log = log
        self.probe: ProbeFactory = http_probe  # the HTTP checks (a fake in the pure tests)
        self.router: Callable[[str], RouterPort] = HttpRouter  # the model gateway's API (a fake, too)
        self.now: Callable[[], datetime] = utc_clock  # the clock of backup names and records
        self.files = UnitFiles(req.unit_dir)
        self.secrets = SecretFiles(req.secrets_dir, req.unit)
        self.state = StateDir(req.state_dir)
        self.unit = req.unit
        self.smoke_result: SmokeResult | None = None
        self.load_result: LoadResult | None = None
        self.unrecovered: Record | None = None  # the record whose recovery failed
        self.recovered: str | None = None  # what the last recover() did
        self.prewarmed: Prewarmed | None = None
        self.drains: list[drain.Drain] = []  # the old server's, then (a rollback) the rejected one's
        self.stopping_at = ""
        self.barrier: str | None = None  # a node of a group that got no "go": why it never started
        self.group_start_bound_s: float | None = None  # rank 0's start bound; the pure tests' is short
        self.no_go = False  # rank 0 aborted before any rank took "go": its old unit starts at once
        self.recovering = False  # restoring an earlier change's backup: never this change's barrier
        self.hold_old = False  # a group node's recovery: the old unit starts only on its group's go-back
        self.in_doubt: str | None = None  # a group's node that stopped and got no word: why it stays stopped
        self.events: list[Event] = []  # this run's events: the downtime is read off them
        self.daemon = DaemonUnit(self.files, self.state, req.unit, systemd, log, req.timeouts.weights_s)
        log.listeners.append(self.events.append)

    # -- the verbs ------------------------------------------------------------------------------
    def apply(self) -> Result:
        assert self.req.unit_text is not None and self.req.target_context is not None
        blocked = self._recover_first()
        if blocked is not None:
            return blocked
        compared = self.compare()
        if isinstance(compared, Result):
            return compared
        refused = self._check_with_sglang(self.req.unit_text)
        if refused is not None:
            return refused
        daemon = self.daemon.refusal(self.req.unit_text, self.req.daemon_text)
        if daemon is not None:  # a dead daemon, or one holding another fingerprint: before any restart
            self.log.emit(Stage.COMPARE, "warning", daemon)
            return Result(Outcome.ERROR, daemon + "; nothing changed")
        gate = Gate(self.req.target_context, self.req.planned_pool, self.req.margin, self.req.timeouts,
                    calibrated=self.req.pool_calibrated)  # fmt: skip
        text = self.req.unit_text
        return self._shadowed() or self._out_of_router(
            lambda: self._change(text, compared, gate, smoke=self.req.smoke)
        )

    def _check_with_sglang(self, new: str) -> Result | None:
        """Validate before install: the host's own SGLang parser reads the new flags (host/argcheck.py)."""
        from agent.host.argcheck import Verdict, check_unit

        checked = check_unit(new)
        if checked.verdict is Verdict.REFUSED:
            msg = f"SGLang's own argument parser refuses the new flags: {checked.detail}"
            self.log.emit(Stage.COMPARE, "warning", msg)
            return Result(Outcome.ERROR, msg + "; nothing changed")
        said = (
            checked.detail if checked.verdict is Verdict.ACCEPTED else f"flag check skipped: {checked.detail}"
        )
        self.log.emit(Stage.COMPARE, "step", said)
        return None

    def compare(self, wait: bool = True) -> Result | dict[str, str | None]:
        """The installed unit against the request, changing nothing: a Result when there is nothing to
        do (up to date, or refused), else the secret files the new unit needs.

        wait: a start of this very unit that systemd began and that is still in progress is waited for
        (bounded by the gate's timeouts) rather than restarted; False hands that to the caller.
        """
        assert self.req.unit_text is not None
        new = self.req.unit_text
        current = self.files.read(self.unit)
        # An empty file is no unit (systemd masks it): the laptop that saw it may say "absent".
        seen = {sha256(current), *(("absent",) if not current else ())} if current is not None else {"absent"}
        if self.req.expect_sha256 is not None and self.req.expect_sha256 not in seen:
            msg = f"{self.files.path(self.unit)} changed on the host since it was planned (edited by hand?)"
            self.log.emit(Stage.COMPARE, "warning", msg)
            return Result(Outcome.ERROR, msg + "; nothing changed: re-run to plan against it")
        kept = kept_secret_env(self.req.keep_secret_env, self.secrets.current()["env"], current)
        missing = [n for n in self.req.keep_secret_env if n not in kept]
        if missing:
            msg = f"no value on the host for the kept secret variable(s) {', '.join(missing)}"
            self.log.emit(Stage.COMPARE, "warning", msg)
            return Result(Outcome.ERROR, msg + "; nothing changed: set them in the inventory's environment")
        secrets = self.secrets.wanted({**kept, **self.req.secret_env}, self.req.secret_flags)
        same = current == new and self.secrets.current() == secrets
        # A node of a group restarts with the others even when its own unit is unchanged: the laptop asks
        # only when some rank needs it, and one rank cannot restart alone.
        if same and self._running_as_installed() and self.req.group is None:
            if self._met_target(sha256(new)):
                msg = f"{self.unit} is already up to date and its pool meets the target: nothing to do"
                self.log.emit(Stage.COMPARE, "step", msg)
                return Result(Outcome.UP_TO_DATE, msg)
            if wait and self._starting():
                waited = self._wait_for_start()
                if waited is not None:
                    return waited
        return secrets

    def _starting(self) -> bool:
        """The running start (systemd's own: a reboot, Restart=) logged, but neither ready nor a failure."""
        lines = self.journal.last_invocation_lines(self.unit, 20000)
        figures = summarize(lines).to_dict() if lines else {}
        return bool(lines) and not figures.get("ready") and not figures.get("failure")

    def _wait_for_start(self) -> Result | None:
        """Follow the start in progress to its verdict: UP_TO_DATE when it serves a pool that meets the
        target, None (restart it, as before) when it fails, falls short or never answers."""
        from agent.host.probe import ProbeError

        self.log.emit(Stage.COMPARE, "step", f"{self.unit} is starting as installed: waiting for that start")
        state = self.systemd.unit_state(self.unit)
        gate = Gate(self.req.target_context, None, 0.0, self.req.timeouts)
        watched = WatchedStart(
            self.unit, self.journal, self.systemd, gate, None, state.invocation_id, state.n_restarts
        )
        started = watch_start(watched, self.log, Stage.WATCH)
        if started.verdict.action is not Action.READY:
            self.log.emit(Stage.COMPARE, "warning", f"the start in progress failed: {started.verdict.reason}")
            return None
        try:
            self.probe(self.req.http_host, self.req.port, self.secrets.api_key()).wait_ready(
                self.req.timeouts.ready_s
            )
        except ProbeError as exc:
            self.log.emit(Stage.COMPARE, "warning", f"the start in progress does not answer: {exc}")
            return None
        pool = int(started.summary.get("kv_tokens") or 0)
        msg = f"{self.unit}: the start in progress is ready with a KV pool of {pool:,} tokens: nothing to do"
        self.log.emit(Stage.COMPARE, "step", msg)
        return Result(Outcome.UP_TO_DATE, msg, {"summary": started.summary})

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
        gate = Gate(None, None, 0.0, self.req.timeouts)
        result = self._shadowed() or self._out_of_router(
            lambda: self._change(text, self.secrets.of_backup(name), gate, smoke=None, restored_from=name)
        )
        result.data["restored_from"] = name
        return result

    def recover_only(self) -> Result:
        """The `recover` verb: what finishing an earlier run's change came to, as an outcome."""
        blocked = self._recover_first()
        if blocked is not None:
            return blocked
        if self.recovered is None:
            return Result(Outcome.UP_TO_DATE, "nothing to recover")
        if self.recovered == "kept":
            return Result(Outcome.APPLIED, "the interrupted change had been verified: kept")
        if self.recovered == "in-doubt":
            return Result(Outcome.ROLLBACK_FAILED, self.in_doubt or "in doubt")
        return Result(Outcome.ROLLED_BACK, "an interrupted change was rolled back; the old unit is healthy")

    def _recover_first(self, explicit: bool = False) -> Result | None:
        """Finish an earlier run's change; a failed or impossible recovery stops everything here."""
        self.log.emit(Stage.RECOVER, "step", "checking for an unfinished earlier run")
        found = self.recovered = self.recover()
        if found not in ("corrupt", "failed"):
            self._rejoin_left_out()
        if found == "corrupt":
            path = self.state.record_path(self.unit)
            return Result(
                Outcome.ERROR,
                f"the recovery record {path} is unreadable: nothing changed; compare {self.unit} with its "
                f"backups (deployctl backups), restore the right one by hand, then remove {path}",
            )
        if found == "failed" and not explicit:
            record = self.unrecovered
            backup = record.backup if record else None
            return Result(
                Outcome.ROLLBACK_FAILED,
                f"an earlier change ({record.txn if record else '?'}) could not be rolled back, so nothing "
                f"else was changed: its good unit is the backup {backup or '(none: there was no unit)'}; "
                f"fix what stops it from starting, then re-run (the restore is tried again), or choose a "
                f"unit yourself with: deployctl rollback HOST --to {backup or 'BACKUP'}",
                {"backup": backup},
            )
        return None

    def recover(self) -> str | None:
        """Finish what an earlier run left: keep a verified unit, otherwise restore the backup.

        The service is restarted only if it was restarted since the record was written: a run killed
        before its restart only needs the file put back, never a model load for nothing.
        """
        try:
            record = self.state.load_record(self.unit)
        except CorruptRecord as exc:
            self.log.emit(Stage.RECOVER, "warning", f"{exc}: refusing to change {self.unit}")
            return "corrupt"
        if record is None:
            return None
        if record.phase == PHASE_VERIFIED:
            self.state.clear_record(self.unit)
            self.log.emit(Stage.RECOVER, "step", f"transaction {record.txn} had been verified: kept")
            return "kept"
        self.log.emit(
            Stage.RECOVER, "warning", f"transaction {record.txn} did not finish: restoring the old unit"
        )
        try:
            self.recovering = record.txn != self.txn  # this change's own record rolls back with its group
            group = self._group_record(record) if self.recovering else None
            if group is not None:
                return self._recover_group(record, group)
            ok, reason = self._restore(record)
        except OSError as exc:  # a disk fault mid-restore: the record stays for the next run
            ok, reason = False, str(exc)
        finally:
            self.hold_old = False
        stopped, self.recovering = self.recovering and self.req.group is not None, False
        if ok:
            self.state.clear_record(self.unit)
            how = "restored, stopped until its group starts it" if stopped else "restored and healthy"
            self.log.emit(Stage.RECOVER, "step", f"old unit of {record.txn} {how}")
            return "restored"
        self.unrecovered = record
        self.log.emit(Stage.RECOVER, "warning", f"restoring the old unit of {record.txn} failed: {reason}")
        return "failed"

    def _group_record(self, record: Record) -> GroupRecord | None:
        """The interrupted change's rank and bounds when it was a multi-node change (its own request)."""
        try:
            req = Request.from_json((self.state.txn_dir(record.txn) / "request.json").read_text("utf-8"))
        except (OSError, ValueError, TypeError, KeyError, ProtocolError):
            return None  # an older agent's folder, or none: recovered as a one-host change
        return GroupRecord.of(req, drain.stop_timeout_s(req.drain_timeout_s, req.drain_stop_allowance_s))

    def _recover_group(self, record: Record, group: GroupRecord) -> str:
        """A group node whose agent died: what the group machine says (host/grouprecovery.py)."""
        signals = Signals(self.state.txn_dir(record.txn))
        running = self.systemd.unit_state(self.unit).active_state == "active"
        step = recovery(group, signals, running)
        if step.node.phase is Phase.COMMITTED:
            if Do.START_NEW in step.done and not running:
                self.systemd.start(self.unit, RESTART_JOB_TIMEOUT_S)
            self.state.clear_record(self.unit)
            self.log.emit(Stage.RECOVER, "step", f"transaction {record.txn}: the group committed: kept")
            return "kept"
        self._stop_clean(RESTART_JOB_TIMEOUT_S)  # its new server must not meet an old peer, nor stay
        self.hold_old = True
        ok, reason = self._restore(record)
        self.hold_old = False
        if not ok:
            self.unrecovered = record
            self.log.emit(
                Stage.RECOVER, "warning", f"restoring the old unit of {record.txn} failed: {reason}"
            )
            return "failed"
        self.state.clear_record(self.unit)
        return self._group_back(record, group, step.wait_back_s)

    def _group_back(self, record: Record, group: GroupRecord, wait_back_s: float) -> str:
        """A recovered node stopped with its old unit file: its old unit starts on the go-back of the
        change's own coordinator, else it stays stopped (in doubt, or for the new group change)."""
        signals = Signals(self.state.txn_dir(record.txn))
        if self.req.group is None:  # the change's own coordinator may still follow: it counts this stop
            self.log.emit(Stage.RECOVER, "step", f"rank {group.rank} stopped, its old unit file back: "
                          "waiting for every rank to stop", vote="stopped_back")  # fmt: skip
        # only the coordinator of that change sends its "go-back"; a later run starts it with its peers
        wait_s = wait_back_s if self.req.died == record.txn else 0.0
        if self.req.group is None and wait_until(lambda: signals.for_rollback().gone(), wait_s):
            ok, reason = self._verify_old()
            how = "every rank stopped: old unit restarted and healthy" if ok else f"old unit failed: {reason}"
            self.log.emit(Stage.RECOVER, "step" if ok else "warning", how)
            return "restored" if ok else "failed"
        if self.req.group is not None:
            self.log.emit(Stage.RECOVER, "step", "stopped: the group's change starts it with its peers")
            return "restored"
        self.in_doubt = (
            f"rank {group.rank} in doubt: its agent died mid-change and no go-back came: it stays stopped "
            "with its old unit (never a generation of its own); deployctl apply again brings the group back"
        )
        self.log.emit(Stage.RECOVER, "warning", self.in_doubt)
        return "in-doubt"

    # -- the router ------------------------------------------------------------------------------
    def _out_of_router(self, change: Callable[[], Result]) -> Result:
        """With a router in front: take the server out before the change (so the drain only waits for
        what it has), and put whatever serves afterwards back in, however the change ended."""
        url, worker = self.req.router_url, self.req.router_worker_url
        if url is None or worker is None:
            return change()
        router = self.router(url)
        try:  # the mark is written before the DELETE: a run killed after it leaves it for the next run
            taken = take_out(
                router,
                worker,
                self.req.router_timeout_s,
                lambda: self.state.mark_router_out(self.unit, worker),
            )
        except RouterError as exc:
            return self._router_refused(router, worker, exc)
        self.log.emit(Stage.ROUTER, "step", taken.message, out=taken.out)
        left = time.monotonic()
        result: Result | None = None
        try:
            result = change()
        finally:
            back = self._back_in_router(router, worker) if taken.out else None
            if result is not None:
                out_s = round(time.monotonic() - left, 3) if taken.out else 0.0
                result.data["router"] = RouterData(url=url, worker=worker, out_s=out_s, back=back)
        return result

    def _router_refused(self, router: RouterPort, worker: str, exc: RouterError) -> Result:
        """The removal was not confirmed: nothing changes, and a worker whose DELETE went out is put back
        (or found listed) before the run reports; the mark stays unless that is sure."""
        if self.state.router_left_out(self.unit) == worker:
            try:
                undone = undo_removal(router, worker, self.req.router_timeout_s)
                self.log.emit(Stage.ROUTER, "step" if undone.sure else "warning", undone.message)
                if undone.sure:
                    self.state.clear_router_out(self.unit)
            except RouterError as again:
                self.log.emit(Stage.ROUTER, "warning", f"putting {worker} back failed: {again}; the next run "
                              "puts it back")  # fmt: skip
        return Result(Outcome.ERROR, f"the router at {self.req.router_url} did not take {worker} out: {exc}; "
                      "nothing changed")  # fmt: skip

    def _back_in_router(self, router: RouterPort, worker: str) -> bool:
        """Put the worker back when its server answers /health; a server that does not stays out."""
        from agent.host.probe import ProbeError

        try:
            self.probe(self.req.http_host, self.req.port, self.secrets.api_key()).wait_ready(10.0)
        except ProbeError as exc:
            self.log.emit(Stage.ROUTER, "warning", f"left {worker} out of the router: the server does not "
                          f"serve ({exc})")  # fmt: skip
            return False
        try:
            self.log.emit(Stage.ROUTER, "step", put_back(router, worker, self.req.router_timeout_s))
        except RouterError as exc:
            self.log.emit(Stage.ROUTER, "warning", f"putting {worker} back in the router failed: {exc}")
            return False
        self.state.clear_router_out(self.unit)
        return True

    def _rejoin_left_out(self) -> None:
        """An earlier run took the worker out and was killed before it put it back: put it back now, once
        that run's change is finished (recovered or kept) and the server answers."""
        worker = self.state.router_left_out(self.unit)
        if worker is None or self.req.router_url is None or worker != self.req.router_worker_url:
            return
        self.log.emit(Stage.ROUTER, "step", f"an earlier run left {worker} out of the router")
        self._back_in_router(self.router(self.req.router_url), worker)

    # -- the change ------------------------------------------------------------------------------
    def _change(
        self,
        new: str,
        secrets: dict[str, str | None],
        gate: Gate,
        smoke: Smoke | None,
        restored_from: str | None = None,
    ) -> Result:
        """Back up, write (secrets, then the unit), reload, restart, watch, gate: commit or roll back."""
        current = self.files.read(self.unit)
        live = self.secrets.current()
        wrote = current != new or live != secrets
        backup_name: str | None = None
        touched: dict[str, str | None] | None = None  # the live secrets, once this run began writing them
        try:
            if not wrote and self.req.group is None:
                # Written but not running as written: finish the start; go back to the last other unit.
                backup_name = self._last_different_backup(new)
                self.log.emit(Stage.COMPARE, "step", f"{self.unit} is installed but not running as written")
            if current is not None and backup_name is None:
                backup_name = self._backup()
            self._record(PHASE_WRITTEN, backup_name, new, wrote)
            if wrote:
                touched = live
                self.secrets.write(secrets)  # first: the unit that names them never runs without them
            self._write_units(current, new, backup_name, restored_from)
        except OSError as exc:
            return self._undo_write(exc, current, touched)
        self.files.prune(self.unit, self.req.keep_backups, protect=(backup_name, restored_from))
        self.secrets.prune({b.name for b in self.files.backups(self.unit)})
        self.log.emit(Stage.WRITE, "step", f"wrote {self.files.path(self.unit)}", sha256=sha256(new))
        self.systemd.daemon_reload()
        self.log.emit(Stage.RELOAD, "step", "systemd reloaded its units")
        elsewhere = self._loaded_elsewhere()
        if elsewhere is not None:
            return self._refuse_unloaded(elsewhere, backup_name, wrote)
        self._prewarm(new)
        self._record(PHASE_RESTARTED, backup_name, new, wrote)
        return self._start_and_decide(new, gate, smoke, backup_name, restored_from)

    def _write_units(self, current: str | None, new: str, backup: str | None, restored: str | None) -> None:
        """The unit, atomically; with [weight_cache], its daemon's unit beside it (host/daemon_unit.py)."""
        if current != new:
            self.files.write(self.unit, new)
        self.daemon.write(current, new, backup, self.req.daemon_text, restored)

    def _backup(self) -> str:
        """The unit and its secrets copied under one backup name.

        A backup whose secrets could not be copied (disk full) is dropped before the error goes on:
        restoring it later would delete the secrets it lacks.
        """
        name = self.files.backup(self.unit, self.now()).name
        try:
            self.secrets.backup(name)
        except OSError:
            with contextlib.suppress(OSError):  # best effort: a read-only disk kept nothing to drop
                self.files.path(name).unlink(missing_ok=True)
                self.secrets.prune({b.name for b in self.files.backups(self.unit)})
            raise
        self.log.emit(Stage.BACKUP, "step", f"backed up to {name}", backup=name)
        return name

    def _undo_write(self, exc: OSError, current: str | None, live: dict[str, str | None] | None) -> Result:
        """A write failed (disk full, I/O error, read-only): put back what was there, from memory.

        Secrets are put back only if this run began writing them, and from the copy read before it
        did: a backup that failed half-way has missing copies, and a missing copy means "no such file".
        """
        reason = exc.strerror if isinstance(exc, UnitWriteError) else str(exc)
        if current is not None and self.files.read(self.unit) != current:  # never the case: atomic
            self.files.write(self.unit, current)
        if live is not None:
            try:
                self.secrets.write(live)
            except OSError as again:  # the record stays: the next run restores them from the backup
                return Result(Outcome.ERROR, f"{reason}; putting the secrets back failed too: {again}")
        self.state.clear_record(self.unit)
        return Result(Outcome.ERROR, f"{reason}; {self.unit} left as it was")

    def _start_and_decide(
        self, new: str, gate: Gate, smoke: Smoke | None, backup: str | None, restored_from: str | None
    ) -> Result:
        """Restart, watch, gate, verify: commit the new unit, or roll back to the backup."""
        if self.req.group is not None:
            return self._group_start_and_decide(new, gate, smoke, backup, restored_from)
        started = self._restart_and_watch(gate, Stage.WATCH)
        if started.verdict.action is Action.READY:
            verified = self._verify(started, smoke, gate, new)
            if verified is None:
                return self._commit(started, new, backup, restored_from)
            reason = verified
        else:
            reason = started.verdict.reason
        return self._roll_back(reason, started, backup, new)

    def _shadowed(self) -> Result | None:
        """Where systemd loads the unit from, before the first change: a copy in a folder it searches
        before ours would shadow whatever we write (refused, nothing written); one it searches after
        ours (/run/systemd/system, /usr/local/lib, /usr/lib) is overridden, and a rollback removes ours."""
        loaded = self.systemd.unit_state(self.unit).fragment_path
        ours = self.files.path(self.unit)
        if not loaded or loaded == str(ours):
            return None
        if Path(loaded).parent.name in _SEARCHED_BEFORE_ETC:
            msg = f"systemd loads {self.unit} from {loaded}, which shadows {ours}"
            self.log.emit(Stage.COMPARE, "warning", f"refusing: {msg}")
            return Result(Outcome.ERROR, f"{msg}; nothing changed: remove that copy first")
        self.log.emit(
            Stage.COMPARE, "step", f"systemd loads {self.unit} from {loaded}; {ours} will override it"
        )
        return None

    def _loaded_elsewhere(self) -> str | None:
        """Why what systemd loaded is not the file just written (another copy or a drop-in wins), or None.

        A unit of the same name in /run/systemd/system (or any folder before ours) shadows the file we
        wrote, and a drop-in that sets ExecStart= replaces our command: "applied" would be a lie.
        """
        state = self.systemd.unit_state(self.unit)
        ours = str(self.files.path(self.unit))
        if state.fragment_path and state.fragment_path != ours:
            return f"systemd loads {self.unit} from {state.fragment_path}, not from {ours}"
        for path in state.drop_in_paths:
            if _sets_exec_start(path):
                return f"the drop-in {path} sets ExecStart= for {self.unit}, overriding the unit written"
        return None

    def _refuse_unloaded(self, why: str, backup: str | None, wrote: bool) -> Result:
        """Put the file back and reload; nothing was restarted, so nothing needs to be."""
        self.log.emit(Stage.RELOAD, "warning", f"refusing: {why}")
        if wrote:
            if backup is None:
                self.files.remove(self.unit)
            else:
                self.files.restore(self.unit, backup)
            self.secrets.restore(backup)
            self.daemon.restore(backup)  # [weight_cache]: the daemon's unit as it was
            self.systemd.daemon_reload()
        self.state.clear_record(self.unit)
        return Result(Outcome.ERROR, f"{why}; {self.unit} put back as it was and nothing restarted")

    def _prewarm(self, new: str) -> None:
        """Read the new unit's weights into the page cache while the old server still serves."""
        if not self.req.prewarm:
            return
        from agent.host.prewarm import GIB, prewarm

        try:
            margin = int(self.req.prewarm_margin_gib * GIB)
            # Bounded by the time the start itself may take to load the same weights.
            self.prewarmed = prewarm(parse_unit_flags(new), margin, self.req.timeouts.weights_s)
        except Exception as exc:  # only ever a slower start: never a reason to stop the change
            self.log.emit(Stage.PREWARM, "warning", f"pre-warm failed: {type(exc).__name__}: {exc}")
            return
        self.log.emit(Stage.PREWARM, "step", self.prewarmed.describe(), **self.prewarmed.to_dict())

    def _group_start_and_decide(
        self, new: str, gate: Gate, smoke: Smoke | None, backup: str | None, restored_from: str | None
    ) -> Result:
        """One node of a multi-node service: stop, wait for every rank to stop ("go"), start, watch, vote,
        then do what the group decided; no word from the coordinator in time is a rollback."""
        assert self.req.group is not None
        signals = Signals(self.state.txn_dir(self.txn))
        started = self._restart_and_watch(gate, Stage.WATCH, barrier=signals)
        rank = self.req.group.rank
        if self.barrier is not None:  # aborted before it started: the group's word, not a failure of its own
            return self._roll_back(self.barrier, started, backup, new)
        reason = started.verdict.reason
        if started.verdict.kind is Failure.ABANDONED:  # the group's word, not a failure of its own
            self.log.emit(Stage.GROUP, "step", reason, decision="abort")
            return self._roll_back(reason, started, backup, new)
        if started.verdict.action is Action.READY:
            reason = self._verify(started, smoke, gate, new) or ""
        if reason:
            stands = signals.claim(Decision.ABORT, f"rank {rank}: {reason}", "node")
            self.log.emit(Stage.GROUP, "warning", f"rank {rank} failed: {reason}", vote="failed")
        else:
            pool = started.summary.get("kv_tokens")
            self.log.emit(Stage.GROUP, "step", f"rank {rank} ready (KV pool {pool:,} tokens): waiting for "
                          "the group's decision", vote="ready", kv_tokens=pool)  # fmt: skip
            return self._decided(signals, started, new, backup, restored_from)
        self.log.emit(Stage.GROUP, "step", f"the group rolled back: {stands.reason}", decision="abort")
        return self._roll_back(reason, started, backup, new)

    def _waits(self, signals: Signals) -> NodeWaits:
        assert self.req.group is not None
        stop_s = drain.stop_timeout_s(self.req.drain_timeout_s, self.req.drain_stop_allowance_s)
        bound = self.group_start_bound_s or start_bound_s(self.req, stop_s + RESTART_JOB_TIMEOUT_S)
        return NodeWaits(signals, self.req.group.rank, self.req.group.wait_s, bound)

    def _decided(
        self, signals: Signals, started: WatchResult, new: str, backup: str | None, restored_from: str | None
    ) -> Result:
        """Voted ready: do what the group machine says once the word comes, or its deadline passes."""
        node, done = self._wait_for_decision(signals)
        stands = signals.decided()
        why = stands.reason if stands else "no word"
        if node.phase is Phase.COMMITTED:
            if Do.START_NEW in done:  # it had stopped before the word: rank 0 committed
                self.systemd.start(self.unit, RESTART_JOB_TIMEOUT_S)
            self.log.emit(Stage.GROUP, "step", "the group committed", decision="commit")
            return self._commit(started, new, backup, restored_from)
        if node.phase is Phase.IN_DOUBT:
            self.in_doubt = (
                f"rank {node.rank} in doubt: its server stopped and no word came from deployctl or rank 0;"
                " it stays stopped (never a generation of its own): deployctl apply again takes it to rank"
                " 0's decision"
            )
            self.log.emit(Stage.GROUP, "warning", self.in_doubt, decision="in-doubt")
            return Result(Outcome.ROLLBACK_FAILED, self.in_doubt, {"backup": backup})
        self.log.emit(Stage.GROUP, "step", f"the group rolled back: {why}", decision="abort")
        return self._roll_back(f"the group rolled back ({why})", started, backup, new)

    def _wait_for_decision(self, signals: Signals) -> tuple[GroupNode, tuple[Do, ...]]:
        """The group's decision, or what the group machine says without one (host/groupmachine.py): rank 0
        aborts alone; a rank >= 1 keeps the new unit when its server outlived rank 0's deadline, and stops
        (systemd's Restart= must not bring it back to join another generation) when it did not."""
        started = self.systemd.unit_state(self.unit)
        waits = self._waits(signals)

        def gone() -> bool:
            now = self.systemd.unit_state(self.unit)
            return now.invocation_id != started.invocation_id or now.active_state != "active"

        node, done = waits.decision(gone)
        if node.phase is Phase.HELD:
            self._stop_clean(RESTART_JOB_TIMEOUT_S)
            self.log.emit(Stage.GROUP, "warning", f"rank {node.rank}'s server stopped before any word: "
                          "stopped, waiting for rank 0's decision")  # fmt: skip
            node, done = waits.held()
        return node, done

    def _restart_and_watch(self, gate: Gate, stage: Stage, barrier: Signals | None = None) -> WatchResult:
        cursor = self.journal.cursor()
        before = self.systemd.unit_state(self.unit)
        gate = replace(gate, follower=node_rank(self.files.read(self.unit) or "") >= 1)
        if self.req.group is not None:  # a rank waits at the rendezvous for its peers, silently
            t, more = gate.timeouts, self.req.group.wait_s
            waits = replace(t, weights_s=t.weights_s + more, no_progress_s=t.no_progress_s + more)
            gate = replace(gate, timeouts=waits)
        job = self._drained_restart(before.invocation_id, barrier)
        if barrier is not None and not barrier.back and self.barrier:  # never started: not every rank stopped
            return WatchResult(fail(self.barrier, Failure.TIMEOUT), {}, 0.0)
        if barrier is not None and barrier.back and self.in_doubt:  # stopped, and stays so
            return WatchResult(fail(self.in_doubt, Failure.TIMEOUT), {}, 0.0)
        after = self.systemd.unit_state(self.unit)
        self.log.emit(
            Stage.RESTART,
            "step",
            f"restart job {job.result}",
            invocation=after.invocation_id,
            job=job.result,
            stopping_at=self.stopping_at,
        )
        n0 = after.n_restarts
        if after.invocation_id == before.invocation_id and not job.ok:
            n0 = -1  # the job failed before a new invocation: decide() sees a crash at once
        abandon = self._abandon(barrier) if barrier is not None and not barrier.back else None
        start = WatchedStart(
            self.unit, self.journal, self.systemd, gate, cursor, after.invocation_id, max(n0, 0), abandon
        )
        return watch_start(start, self.log, stage)

    def _abandon(self, barrier: Signals) -> Callable[[], str | None]:
        """While a group's node starts: the group's abort ends its watch (the group machine's step), so it
        stops at once instead of waiting out a start that cannot complete without its stopping peers."""
        assert self.req.group is not None
        rank = self.req.group.rank

        def why() -> str | None:
            node, _ = node_step(GroupNode(rank, Phase.STARTING, files_of(barrier)), Saw.SIGNAL)
            stands = barrier.decided()
            if node.phase is not Phase.BACK or stands is None:
                return None
            return f"the group rolled back while rank {rank} started ({stands.reason})"

        return why

    def _drained_restart(self, old_invocation: str, barrier: Signals | None = None) -> JobResult:
        """Let the running server finish what it has (bounded by [drain] timeout_s), then restart; a node
        of a group stops, waits for the coordinator's "go" and only then starts."""
        from agent.host.drainer import restart_drained

        # The job covers SGLang's own drain (up to TimeoutStopSec) before the new process starts.
        timeout = drain.stop_timeout_s(self.req.drain_timeout_s, self.req.drain_stop_allowance_s)

        def restart() -> JobResult:
            self.stopping_at = utc_now()  # the old server stops answering from here: the downtime begins
            if barrier is not None:
                return self._stop_then_start(barrier, timeout + RESTART_JOB_TIMEOUT_S)
            t = timeout + RESTART_JOB_TIMEOUT_S  # [weight_cache]: the daemon's (re)start or stop comes first
            job: JobResult = self.daemon.restart_engine(lambda: self.systemd.restart(self.unit, t), t)
            return job

        def old_log() -> list[str]:  # the old server's last words: SGLang's own drain lines
            return self.journal.invocation_tail(self.unit, old_invocation, 50) if old_invocation else []

        job, drained = restart_drained(self.req, self.secrets.api_key(), restart, self.log, old_log)
        self.drains.append(drained)
        self.log.emit(Stage.DRAIN, "step", drained.describe(), **drained.to_dict())
        return job

    def _stop_then_start(self, barrier: Signals, timeout: float) -> JobResult:
        """A group's node: stop, tell the coordinator, start once every rank has stopped. A rank that
        started early would join the other ranks' old servers (their rendezvous port is the same)."""
        assert self.req.group is not None
        if barrier.back:
            return self._stop_then_start_old(barrier, timeout)
        stopped = self._stop_clean(timeout)
        rank, wait_s = self.req.group.rank, self.req.group.wait_s
        self.log.emit(Stage.GROUP, "step", f"rank {rank} stopped ({stopped.result}): waiting for every rank "
                      "to stop", vote="stopped", job=stopped.result)  # fmt: skip
        if not wait_until(lambda: barrier.gone() or barrier.decided() is not None, wait_s):
            barrier.claim(Decision.ABORT, f"rank {rank} got no start signal within {wait_s:.0f} s", "node")
        stands = barrier.decided()
        if stands is not None and stands.decision is Decision.ABORT:  # by the coordinator, or on its own
            self.barrier = f"the group rolled back before the start ({stands.reason})"
            self.no_go = (
                self._waits(barrier).step(Phase.STOPPED, Saw.SIGNAL, "")[0].phase is Phase.ROLLED_BACK
            )
            return stopped
        self.log.emit(Stage.GROUP, "step", f"every rank stopped: starting rank {rank}")
        job: JobResult = self.systemd.start(self.unit, RESTART_JOB_TIMEOUT_S)
        return job

    def _stop_clean(self, timeout: float) -> JobResult:
        """Stop, and see that no process of the unit is left: on the real two-node server a stop once
        logged "Failed to kill control group ...: Input/output error" and the next start failed with
        219/CGROUP; on a GPU host a leftover scheduler would also hold memory the next pool counts on."""
        stopped = self.systemd.stop(self.unit, timeout)
        left = self.systemd.leftovers(self.unit)
        if left:
            self.log.emit(Stage.GROUP, "warning", f"{len(left)} process(es) left after the stop "
                          f"({', '.join(map(str, left[:5]))}): killing them")  # fmt: skip
            self.systemd.kill(self.unit, 9)
            wait_until(lambda: not self.systemd.leftovers(self.unit), 30.0)
        return stopped

    def _stop_then_start_old(self, barrier: Signals, timeout: float) -> JobResult:
        """The rollback of a group's node: stop the new server, and start the old one once every rank
        has stopped its new one (an old rank must not meet a new one at the rendezvous); with no word
        from the coordinator within wait_s, start it anyway: the others do the same."""
        assert self.req.group is not None
        stopped = self._stop_clean(timeout)
        rank, wait_s = self.req.group.rank, self.req.group.wait_s
        self.log.emit(Stage.GROUP, "step", f"rank {rank} stopped ({stopped.result}) to roll back: waiting "
                      "for every rank to stop", vote="stopped_back", job=stopped.result)  # fmt: skip
        node = self._waits(Signals(barrier.folder)).back(self.no_go)
        if node.phase is Phase.IN_DOUBT:  # a peer's new server may run, or come back under Restart=
            self.in_doubt = (
                f"no go-back from deployctl within {wait_s:.0f} s: rank {rank} stays stopped (an old start "
                "could meet a peer's new server); deployctl apply again brings the group back together"
            )
            self.log.emit(Stage.GROUP, "warning", self.in_doubt)
            return stopped
        why = "no rank took go" if self.no_go else "every rank stopped"
        self.log.emit(Stage.GROUP, "step", f"{why}: starting rank {rank}'s old unit")
        job: JobResult = self.systemd.start(self.unit, RESTART_JOB_TIMEOUT_S)
        return job

    def _verify(self, started: WatchResult, smoke: Smoke | None, gate: Gate, new: str) -> str | None:
        """After the log said ready: the HTTP API answers, runs what was rendered, and a long prompt fits.
        A node rank >= 1 has a placeholder that answers 200 to anything: rank 0 is checked instead."""
        return None if node_rank(new) >= 1 else self._verify_http(started, smoke, gate, new)

    def _verify_http(self, started: WatchResult, smoke: Smoke | None, gate: Gate, new: str) -> str | None:
        from agent.host.probe import ProbeError  # requests: only once a start is ready

        probe = self.probe(self.req.http_host, self.req.port, self.secrets.api_key())
        try:
            probe.wait_ready(self.req.timeouts.ready_s)
            self.log.emit(Stage.READY, "step", "the server answers /health")
            wrong = serverinfo.verdict(flags_of(new), probe.server_info())
            if wrong is not None:
                self.log.emit(Stage.GATE, "warning", wrong)
                return wrong
            self.log.emit(Stage.READY, "step", "/server_info shows the rendered context, fraction and cap")
            if smoke is None or not smoke.enabled:
                return None
            context = started.summary.get("context_len") or gate.target_context or smoke.prompt_tokens
            fitted = Smoke(
                **{**smoke.__dict__, "prompt_tokens": min(smoke.prompt_tokens, int(context * 0.9))}
            )
            self.log.emit(Stage.SMOKE, "step", f"smoke test: a prompt of ~{fitted.prompt_tokens:,} tokens")
            res = probe.smoke(fitted)
        except ProbeError as exc:
            return str(exc)
        self.smoke_result = res
        self.log.emit(
            Stage.SMOKE,
            "step",
            f"answer {res.answer!r} after {res.seconds:.1f} s ({res.prompt_tokens:,} prompt tokens)",
            prompt_tokens=res.prompt_tokens,
            seconds=round(res.seconds, 3),
            answer=res.answer,
            passed=res.passed,
        )
        if not res.passed:
            return f"smoke test failed: {res.detail or res.answer}"
        if not smoke.load:
            return None
        chunk = flags_of(new).get("chunked-prefill-size")
        return self._load_check(probe, smoke, chunk if isinstance(chunk, int) else None, int(context))

    def _load_check(self, probe: ProbePort, smoke: Smoke, chunk: int | None, context: int) -> str | None:
        """[smoke] load: chunk-sized prompts and one at the target context at once; a failure rolls back.
        chunk: the unit's --chunked-prefill-size (SGLang's 8192 stands in when the unit leaves it out)."""
        spec = loadcheck.spec(smoke.load, chunk, context, smoke.timeout_s)
        self.log.emit(Stage.SMOKE, "step", f"load check: {spec.concurrent} prompts of ~{spec.chunk_tokens:,} "
                      f"tokens and one of ~{spec.long_tokens:,}, at once")  # fmt: skip
        self.load_result = probe.load(smoke, spec)
        text = self.load_result.describe(spec)
        self.log.emit(Stage.SMOKE, "step" if self.load_result.passed else "warning", f"load check: {text}",
                      **self.load_result.to_dict())  # fmt: skip
        return None if self.load_result.passed else f"load check failed: {text}"

    def _commit(
        self, started: WatchResult, new: str, backup: str | None, restored_from: str | None
    ) -> Result:
        self._record(PHASE_VERIFIED, backup, new)
        state = self.systemd.unit_state(self.unit)
        down = downtime(self.events).to_dict()
        entry: HistoryEntry = {
            "txn": self.txn,
            "at": self.now().isoformat(),
            "sha256": sha256(new),
            "invocation": state.invocation_id,
            "start_seconds": round(started.seconds, 2),
            "downtime": down,
            "prewarm": self.prewarmed.to_dict() if self.prewarmed is not None else None,
            **started.summary,
        }
        self.state.append_history(self.unit, entry)
        self.state.clear_record(self.unit)
        self.log.emit(Stage.COMMIT, "step", "committed", backup=backup)
        data: OutcomeData = {
            "summary": started.summary,
            "backup": backup,
            "start_seconds": started.seconds,
            "downtime": down,
        }
        if self.prewarmed is not None:
            data["prewarm"] = self.prewarmed.to_dict()
        if self.drains:
            data["drain"] = self.drains[0].to_dict()
        if self.smoke_result is not None:
            data["smoke"] = self.smoke_result.to_dict()
        if self.load_result is not None:
            data["load"] = self.load_result.to_dict()
        what = f"restored {restored_from}" if restored_from else "applied"
        pool = started.summary.get("kv_tokens")
        return Result(Outcome.APPLIED, f"{self.unit} {what}: KV pool {pool:,} tokens, server ready", data)

    def _roll_back(self, reason: str, started: WatchResult, backup: str | None, new: str) -> Result:
        self.log.emit(Stage.ROLLBACK, "step", f"rolling back: {reason}", reason=reason)
        rejected = self.state.txn_dir(self.txn) / f"rejected-{self.unit}"
        rejected.parent.mkdir(parents=True, exist_ok=True)
        rejected.write_text(new, encoding="utf-8", errors="surrogateescape")
        record = Record(
            self.txn,
            self.unit,
            PHASE_ROLLING_BACK,
            backup,
            sha256(new),
            self.req.verb,
            self.now().isoformat(),
        )  # no invocation: the service runs the rejected unit, so the restore must restart it
        self.state.save_record(record)
        ok, why = self._restore(record)
        data: OutcomeData = {
            "reason": reason,
            "failure_kind": started.verdict.kind,
            "summary": started.summary,
            "rejected": str(rejected),
        }
        data["backup"] = backup
        if self.drains:
            data["drain"] = self.drains[0].to_dict()
        if ok:
            self.state.clear_record(self.unit)
            return Result(Outcome.ROLLED_BACK, self._rolled_back(reason, backup), data)
        data["restore_failure"] = why
        return Result(
            Outcome.ROLLBACK_FAILED,
            f"change rejected ({reason}) and the old unit did not come back: {why}; "
            f"old unit in place from {backup}, rejected unit kept at {rejected}",
            data,
        )

    def _rolled_back(self, reason: str, backup: str | None) -> str:
        """What a rollback came to: a service is called healthy only once it was restarted and verified."""
        if self.systemd.unit_state(self.unit).load_state not in NO_UNIT:
            return f"change rejected ({reason}); old unit restored and healthy"
        what = "no unit" if backup is None else "an empty (masked) unit"
        return (
            f"change rejected ({reason}); there was {what} before it (no unit before: nothing to restart), "
            f"so the new unit was taken back out and {self.unit} is stopped, as it was"
        )

    def _restore(self, record: Record) -> tuple[bool, str]:
        """Put the backup back (or remove a unit that had none); restart and verify only if needed.

        Without a backup the old unit may still be one systemd loads from elsewhere (/usr/lib,
        /usr/local/lib, /run): removing ours brings it back, and it is restarted and verified like any.
        """
        self.log.emit(Stage.RESTORE, "step", f"restoring {record.backup or 'no unit (there was none here)'}")
        state = self.systemd.unit_state(self.unit)
        untouched = bool(record.invocation) and state.invocation_id == record.invocation
        if untouched and not record.wrote and record.backup is not None:
            return True, ""  # nothing was written and nothing restarted: nothing to undo
        try:
            self.daemon.restore(record.backup)  # [weight_cache]: the daemon's unit of the backup's time
            if record.backup is None:
                self.files.remove(self.unit)
            elif self.files.read(self.unit) != self.files.read(record.backup):
                self.files.restore(self.unit, record.backup)
            self.secrets.restore(record.backup)
        except (OSError, UnitWriteError) as exc:
            return False, f"cannot restore {record.backup or 'the absence of a unit'}: {exc}"
        self.systemd.daemon_reload()
        loaded = self.systemd.unit_state(self.unit)
        if loaded.load_state in NO_UNIT:  # no unit, or an empty (masked) one: nothing ran before
            if not untouched:
                self.systemd.stop(self.unit, RESTART_JOB_TIMEOUT_S)
            self.log.emit(
                Stage.RESTORE, "step", f"{self.unit} is {loaded.load_state} again: stopped as before"
            )
            return True, ""
        # A packaged unit was not rewritten: its file's age says nothing of which unit the start ran.
        rewritten = record.backup is not None
        if untouched or (rewritten and self._runs_restored_file(state, loaded.fragment_path)):
            # Never restarted since the record (or restarted from the restored file, e.g. by a reboot):
            # the running start already is the old unit's.
            self.log.emit(
                Stage.RESTORE, "step", f"{self.unit} was not restarted with the new unit: no restart"
            )
            return True, ""
        return self._verify_old()

    def _verify_old(self) -> tuple[bool, str]:
        """Restart the restored unit and see it serve: a rollback is reported only once it does."""
        from agent.host.probe import ProbeError

        if self.hold_old or (self.req.group is not None and self.recovering):  # never a barrier nobody sends
            self._stop_clean(RESTART_JOB_TIMEOUT_S)
            self.log.emit(Stage.RECOVER, "step", "stopped: the group's change starts it with its peers")
            return True, ""
        back = Signals(self.state.txn_dir(self.txn), back=True) if self.req.group is not None else None
        old = self._restart_and_watch(Gate(None, None, 0.0, self.req.timeouts), Stage.VERIFY_OLD, back)
        if old.verdict.action is not Action.READY:
            return False, old.verdict.reason
        if node_rank(self.files.read(self.unit) or "") >= 1:  # its /health is a placeholder's
            self.log.emit(Stage.VERIFY_OLD, "step", "old unit running with its KV pool (node rank >= 1)")
            return True, ""
        try:
            self.probe(self.req.http_host, self.req.port, self.secrets.api_key()).wait_ready(
                self.req.timeouts.ready_s
            )
        except ProbeError as exc:
            return False, str(exc)
        pool = old.summary.get("kv_tokens")
        self.log.emit(
            Stage.VERIFY_OLD, "step", f"old unit healthy: KV pool {pool:,} tokens, ready", kv_tokens=pool
        )
        return True, ""

    def _runs_restored_file(self, state: UnitState, fragment: str) -> bool:
        """The running start began after the unit file (now the old one) last changed, and is ready."""
        if not (state.active_state == "active" and state.sub_state == "running"):
            return False
        try:
            if Path(fragment).stat().st_mtime_ns // 1000 >= state.active_enter_timestamp_us:
                return False
        except OSError:
            return False
        lines = self.journal.last_invocation_lines(self.unit, 20000)
        return bool(lines) and bool(summarize(lines).to_dict().get("ready"))

    # -- helpers ---------------------------------------------------------------------------------
    def _record(self, phase: str, backup: str | None, new: str, wrote: bool = True) -> None:
        started = self.now().isoformat()
        invocation = self.systemd.unit_state(self.unit).invocation_id
        self.state.save_record(
            Record(self.txn, self.unit, phase, backup, sha256(new), self.req.verb, started, wrote, invocation)
        )

    def _running_as_installed(self) -> bool:
        s = self.systemd.unit_state(self.unit)
        return bool(s.active_state == "active" and s.sub_state == "running" and not s.need_daemon_reload)

    def _met_target(self, sha: str) -> bool:
        """The running start of this very unit logged a pool that meets the target, and is serving."""
        invocation = self.systemd.unit_state(self.unit).invocation_id
        target = self.req.target_context or 0
        history = [e for e in self.state.history(self.unit) if e.get("sha256") == sha]
        for entry in reversed(history):
            if entry.get("invocation") == invocation:
                return int(entry.get("kv_tokens") or 0) >= target
        # Not started by deployctl (or its history is gone): believe the running start's own log.
        lines = self.journal.last_invocation_lines(self.unit, 20000)
        figures = summarize(lines).to_dict() if lines else {}
        kv_tokens = figures.get("kv_tokens")
        if kv_tokens:
            return bool(figures.get("ready")) and int(kv_tokens) >= target
        if history:
            # This start's log is gone (a reboot, then the journal rotated): the same unit's verified
            # start, kept in our own state, stands for it rather than a restart for nothing.
            entry = history[-1]
            self.log.emit(
                Stage.COMPARE,
                "step",
                f"this start's log is gone; the same unit's start verified in {entry.get('txn')} "
                f"logged a pool of {int(entry.get('kv_tokens') or 0):,} tokens",
            )
            return int(entry.get("kv_tokens") or 0) >= target
        return False

    def _last_different_backup(self, text: str) -> str | None:
        for b in self.files.backups(self.unit):
            if self.files.read(b.name) != text:
                return b.name
        return None


# systemd's unit folders searched before /etc/systemd/system (systemd.unit(5), "Unit File Load Path")
_SEARCHED_BEFORE_ETC = ("system.control", "transient", "generator.early")


def _sets_exec_start(path: str) -> bool:
    """Whether a drop-in file assigns ExecStart= (an empty assignment first, then its own command)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(line.strip().replace(" ", "").startswith("ExecStart=") for line in text.splitlines())
