"""The deploy transaction on the host: back up, write, restart, watch, gate, commit -- or roll back.

The old unit is never lost: a recovery record is written before the first change and cleared only
after the new unit was verified or the old one restored; `recover` finishes whatever a killed run left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from agent.host.decide import Gate
from agent.host.events import EventLog
from agent.host.state import (
    PHASE_RESTARTED,
    PHASE_ROLLING_BACK,
    PHASE_VERIFIED,
    PHASE_WRITTEN,
    Record,
    StateDir,
)
from agent.host.units import UnitFiles, UnitWriteError
from agent.host.watch import JournalPort, WatchResult, watch_start
from agent.protocol import Outcome, Request, Smoke, Stage
from agent.protocol import unit_sha256 as sha256
from agent.sglang.logs import summarize

if TYPE_CHECKING:
    from agent.host.probe import SmokeResult

RESTART_JOB_TIMEOUT_S = 300.0


@dataclass
class Result:
    outcome: Outcome
    message: str
    data: dict[str, Any] = field(default_factory=dict)


class Transaction:
    """One verb on one unit, with the lock already held by the caller."""

    def __init__(
        self,
        req: Request,
        txn: str,
        systemd: Any,
        journal: JournalPort,
        log: EventLog,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.req = req
        self.txn = txn
        self.systemd = systemd
        self.journal = journal
        self.log = log
        self.now = now
        self.files = UnitFiles(req.unit_dir)
        self.state = StateDir(req.state_dir)
        self.unit = req.unit
        self.smoke_result: SmokeResult | None = None

    # -- the verbs ------------------------------------------------------------------------------
    def apply(self) -> Result:
        assert self.req.unit_text is not None and self.req.target_context is not None
        new = self.req.unit_text
        self.log.emit(Stage.RECOVER, "step", "checking for an unfinished earlier run")
        self.recover()
        current = self.files.read(self.unit)
        seen = sha256(current) if current is not None else "absent"
        if self.req.expect_sha256 not in (None, seen):
            msg = f"{self.files.path(self.unit)} changed on the host since it was planned (edited by hand?)"
            self.log.emit(Stage.COMPARE, "warning", msg)
            return Result(Outcome.ERROR, msg + "; nothing changed: re-run to plan against it")
        if current == new and self._running_as_installed() and self._met_target(sha256(new)):
            msg = f"{self.unit} is already up to date and its pool meets the target: nothing to do"
            self.log.emit(Stage.COMPARE, "step", msg)
            return Result(Outcome.UP_TO_DATE, msg)
        gate = Gate(self.req.target_context, self.req.planned_pool, self.req.margin, self.req.timeouts)
        return self._change(new, gate, smoke=self.req.smoke)

    def rollback(self) -> Result:
        """Manual rollback: install a backup through the same change-and-verify path, so it can be undone."""
        self.log.emit(Stage.RECOVER, "step", "checking for an unfinished earlier run")
        self.recover()
        backups = self.files.backups(self.unit)
        name = self.req.backup or (backups[0].name if backups else None)
        if name is None or not self.files.path(name).is_file():
            return Result(Outcome.ERROR, f"no backup {name or 'at all'} of {self.unit}")
        text = self.files.path(name).read_text(encoding="utf-8", errors="surrogateescape")
        gate = Gate(None, None, 0.0, self.req.timeouts)
        result = self._change(text, gate, smoke=None, restored_from=name)
        result.data["restored_from"] = name
        return result

    def recover(self) -> str | None:
        """Finish what an earlier run left: keep a verified unit, otherwise restore the backup."""
        record = self.state.load_record(self.unit)
        if record is None:
            return None
        if record.phase == PHASE_VERIFIED:
            self.state.clear_record(self.unit)
            self.log.emit(Stage.RECOVER, "step", f"transaction {record.txn} had been verified: kept")
            return "kept"
        self.log.emit(
            Stage.RECOVER, "warning", f"transaction {record.txn} did not finish: restoring the old unit"
        )
        ok, reason = self._restore(record)
        if ok:
            self.state.clear_record(self.unit)
            self.log.emit(Stage.RECOVER, "step", f"old unit of {record.txn} restored and healthy")
            return "restored"
        self.log.emit(Stage.RECOVER, "warning", f"restoring the old unit of {record.txn} failed: {reason}")
        return "failed"

    # -- the change ------------------------------------------------------------------------------
    def _change(self, new: str, gate: Gate, smoke: Smoke | None, restored_from: str | None = None) -> Result:
        current = self.files.read(self.unit)
        backup_name: str | None = None
        try:
            if current == new:
                # Written but not running as written: finish the start; go back to the last other unit.
                backup_name = self._last_different_backup(new)
                self.log.emit(Stage.COMPARE, "step", f"{self.unit} is installed but not running as written")
            if current is not None and backup_name is None:
                backup = self.files.backup(self.unit, self.now())
                backup_name = backup.name
                self.log.emit(Stage.BACKUP, "step", f"backed up to {backup.name}", backup=backup.name)
            self._record(PHASE_WRITTEN, backup_name, new)
            if current != new:
                self.files.write(self.unit, new)
        except UnitWriteError as exc:
            self.state.clear_record(self.unit)
            if current is not None and self.files.read(self.unit) != current:  # never the case: atomic
                self.files.write(self.unit, current)
            return Result(Outcome.ERROR, f"{exc.strerror}; {self.unit} left as it was")
        self.files.prune(self.unit, self.req.keep_backups, protect=backup_name)
        self.log.emit(Stage.WRITE, "step", f"wrote {self.files.path(self.unit)}", sha256=sha256(new))
        self._record(PHASE_RESTARTED, backup_name, new)
        started = self._restart_and_watch(gate, Stage.WATCH)
        if started.verdict.action == "ready":
            verified = self._verify(started, smoke, gate)
            if verified is None:
                return self._commit(started, new, backup_name, restored_from)
            reason = verified
        else:
            reason = started.verdict.reason
        return self._roll_back(reason, started, backup_name, new)

    def _restart_and_watch(self, gate: Gate, stage: Stage) -> WatchResult:
        self.systemd.daemon_reload()
        self.log.emit(Stage.RELOAD, "step", "systemd reloaded its units")
        cursor = self.journal.cursor()
        before = self.systemd.unit_state(self.unit)
        job = self.systemd.restart(self.unit, RESTART_JOB_TIMEOUT_S)
        after = self.systemd.unit_state(self.unit)
        self.log.emit(
            Stage.RESTART, "step", f"restart job {job.result}", invocation=after.invocation_id, job=job.result
        )
        n0 = after.n_restarts
        if after.invocation_id == before.invocation_id and not job.ok:
            n0 = -1  # the job failed before a new invocation: decide() sees a crash at once
        return watch_start(
            self.unit,
            self.journal,
            self.systemd,
            gate,
            cursor,
            after.invocation_id,
            max(n0, 0),
            self.log,
            stage,
        )

    def _verify(self, started: WatchResult, smoke: Smoke | None, gate: Gate) -> str | None:
        """After the log said ready: the HTTP API answers, and a long prompt really fits."""
        from agent.host.probe import Probe, ProbeError  # requests: only once a start is ready

        probe = Probe(self.req.http_host, self.req.port)
        try:
            probe.wait_ready(self.req.timeouts.ready_s)
            self.log.emit(Stage.READY, "step", "the server answers /health")
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
        return None if res.passed else f"smoke test failed: {res.detail or res.answer}"

    def _commit(
        self, started: WatchResult, new: str, backup: str | None, restored_from: str | None
    ) -> Result:
        self._record(PHASE_VERIFIED, backup, new)
        state = self.systemd.unit_state(self.unit)
        entry = {
            "txn": self.txn,
            "at": self.now().isoformat(),
            "sha256": sha256(new),
            "invocation": state.invocation_id,
            "start_seconds": round(started.seconds, 2),
            **started.summary,
        }
        self.state.append_history(self.unit, entry)
        self.state.clear_record(self.unit)
        self.log.emit(Stage.COMMIT, "step", "committed", backup=backup)
        data: dict[str, Any] = {
            "summary": started.summary,
            "backup": backup,
            "start_seconds": started.seconds,
        }
        if self.smoke_result is not None:
            data["smoke"] = self.smoke_result.__dict__
        what = f"restored {restored_from}" if restored_from else "applied"
        pool = started.summary.get("kv_tokens")
        return Result(Outcome.APPLIED, f"{self.unit} {what}: KV pool {pool:,} tokens, server ready", data)

    def _roll_back(self, reason: str, started: WatchResult, backup: str | None, new: str) -> Result:
        self.log.emit(Stage.ROLLBACK, "step", f"rolling back: {reason}", reason=reason)
        rejected = self.state.txn_dir(self.txn) / f"rejected-{self.unit}"
        rejected.parent.mkdir(parents=True, exist_ok=True)
        rejected.write_text(new, encoding="utf-8", errors="surrogateescape")
        record = Record(
            self.txn, self.unit, PHASE_ROLLING_BACK, backup, sha256(new), started=self.now().isoformat()
        )
        self.state.save_record(record)
        ok, why = self._restore(record)
        data: dict[str, Any] = {
            "reason": reason,
            "failure_kind": started.verdict.kind,
            "summary": started.summary,
            "rejected": str(rejected),
        }
        data["backup"] = backup
        if ok:
            self.state.clear_record(self.unit)
            return Result(
                Outcome.ROLLED_BACK, f"change rejected ({reason}); old unit restored and healthy", data
            )
        data["restore_failure"] = why
        return Result(
            Outcome.ROLLBACK_FAILED,
            f"change rejected ({reason}) and the old unit did not come back: {why}; "
            f"old unit in place from {backup}, rejected unit kept at {rejected}",
            data,
        )

    def _restore(self, record: Record) -> tuple[bool, str]:
        """Put the backup back (or remove a unit that had none), restart it and verify it is healthy."""
        from agent.host.probe import Probe, ProbeError

        self.log.emit(Stage.RESTORE, "step", f"restoring {record.backup or 'no unit (there was none)'}")
        try:
            if record.backup is None:
                self.systemd.stop(self.unit, RESTART_JOB_TIMEOUT_S)
                self.files.remove(self.unit)
                self.systemd.daemon_reload()
                return True, ""
            if self.files.read(self.unit) != self.files.read(record.backup):
                self.files.restore(self.unit, record.backup)
        except (OSError, UnitWriteError) as exc:
            return False, f"cannot restore {record.backup}: {exc}"
        old = self._restart_and_watch(Gate(None, None, 0.0, self.req.timeouts), Stage.VERIFY_OLD)
        if old.verdict.action != "ready":
            return False, old.verdict.reason
        try:
            Probe(self.req.http_host, self.req.port).wait_ready(self.req.timeouts.ready_s)
        except ProbeError as exc:
            return False, str(exc)
        pool = old.summary.get("kv_tokens")
        self.log.emit(
            Stage.VERIFY_OLD, "step", f"old unit healthy: KV pool {pool:,} tokens, ready", kv_tokens=pool
        )
        return True, ""

    # -- helpers ---------------------------------------------------------------------------------
    def _record(self, phase: str, backup: str | None, new: str) -> None:
        started = self.now().isoformat()
        self.state.save_record(
            Record(self.txn, self.unit, phase, backup, sha256(new), self.req.verb, started)
        )

    def _running_as_installed(self) -> bool:
        s = self.systemd.unit_state(self.unit)
        return bool(s.active_state == "active" and s.sub_state == "running" and not s.need_daemon_reload)

    def _met_target(self, sha: str) -> bool:
        """The running start of this very unit logged a pool that meets the target, and is serving."""
        invocation = self.systemd.unit_state(self.unit).invocation_id
        target = self.req.target_context or 0
        for entry in reversed(self.state.history(self.unit)):
            if entry.get("sha256") == sha and entry.get("invocation") == invocation:
                return int(entry.get("kv_tokens") or 0) >= target
        # Not started by deployctl (or its history is gone): believe the running start's own log.
        lines = self.journal.last_invocation_lines(self.unit, 20000)
        figures = summarize(lines).to_dict() if lines else {}
        return bool(figures.get("ready")) and int(figures.get("kv_tokens") or 0) >= target

    def _last_different_backup(self, text: str) -> str | None:
        for b in self.files.backups(self.unit):
            if b.path.read_text(encoding="utf-8", errors="surrogateescape") != text:
                return b.name
        return None
