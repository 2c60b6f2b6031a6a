"""The restore step of the host transaction: roll a rejected change back, put the backup back (or remove a
unit that had none), and restart and verify the old unit only where it needs it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent.host.change.decide import Action, Gate
from agent.host.change.jobs import touched
from agent.host.change.ports import NO_UNIT, Change, Ports, Result, Run, flags_of, node_rank
from agent.host.change.record import PHASE_ROLLING_BACK, Record
from agent.host.change.restart import after_check, restart_and_watch, stop_clean
from agent.host.roles.groupsignal import Signals
from agent.host.roles.pdrouter import pool_said
from agent.host.units import UnitWriteError
from agent.host.watch.start import WatchResult
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Outcome, OutcomeData, Stage
from agent.protocol.requests import MAX_RESTARTS_UNDER_CHECK, RESTART_JOB_TIMEOUT_S
from agent.sglang.logs.summary import summarize

if TYPE_CHECKING:
    from agent.host.systemd import UnitState


def roll_back(p: Ports, run: Run, change: Change, reason: str, started: WatchResult) -> Result:
    """The rejected unit kept aside, a rolling-back record, then the backup restored."""
    backup, new = change.backup, change.new
    p.log.emit(Stage.ROLLBACK, "step", f"rolling back: {reason}", reason=reason)
    rejected = p.state.txn_dir(p.txn) / f"rejected-{p.unit}"
    rejected.parent.mkdir(parents=True, exist_ok=True)
    rejected.write_text(new, encoding="utf-8", errors="surrogateescape")
    record = Record(
        p.txn,
        p.unit,
        PHASE_ROLLING_BACK,
        backup,
        sha256(new),
        p.req.verb,
        p.now().isoformat(),
    )  # no invocation: the service runs the rejected unit, so the restore must restart it
    p.state.save_record(record)
    ok, why = restore(p, run, record)
    data: OutcomeData = {
        "reason": reason,
        "failure_kind": started.verdict.kind,
        "summary": started.summary,
        "rejected": str(rejected),
    }
    data["backup"] = backup
    if run.drains:
        data["drain"] = run.drains[0].to_dict()
    if ok:
        p.clear_record()
        return Result(Outcome.ROLLED_BACK, rolled_back(p, reason, backup), data)
    data["restore_failure"] = why
    return Result(
        Outcome.ROLLBACK_FAILED,
        f"change rejected ({reason}) and the old unit did not come back: {why}; "
        f"old unit in place from {backup}, rejected unit kept at {rejected}",
        data,
    )


def group_node(*texts: str | None) -> bool:
    """Either unit is one rank of a multi-node service (--nnodes >= 2)."""
    return any(str(flags_of(t or "").get("nnodes", "1")) not in ("", "0", "1") for t in texts)


def stop_rank(p: Ports, run: Run, change: Change, reason: str, started: WatchResult) -> Result:
    """A one-host rollback of a group's node whose old unit failed: the one-host undo would restore the
    new unit and restart it alone, beside peers that run (or wait on) the old one. The rank is stopped
    with the unit it was sent in place, its new unit kept in the backup; the group is left in doubt."""
    stop_clean(p, RESTART_JOB_TIMEOUT_S)
    p.clear_record()
    p.log.emit(Stage.ROLLBACK, "warning", f"{change.restored_from or 'the old unit'} failed ({reason}): "
               "this rank is stopped, never restarted alone on its new unit")  # fmt: skip
    data: OutcomeData = {"reason": reason, "failure_kind": started.verdict.kind, "summary": started.summary}
    data["backup"] = change.backup
    return Result(
        Outcome.ROLLBACK_FAILED,
        f"{change.restored_from or 'the old unit'} did not start ({reason}): {p.unit} is one rank of a "
        f"group, so it is left stopped with that unit in place (its new unit is kept in {change.backup}, "
        "never restarted alone); the group is in doubt: deployctl apply again brings it back together",
        data,
    )


def rolled_back(p: Ports, reason: str, backup: str | None) -> str:
    """What a rollback came to: a service is called healthy only once it was restarted and verified."""
    if p.systemd.unit_state(p.unit).load_state not in NO_UNIT:
        return f"change rejected ({reason}); old unit restored and healthy"
    what = "no unit" if backup is None else "an empty (masked) unit"
    return (
        f"change rejected ({reason}); there was {what} before it (no unit before: nothing to restart), "
        f"so the new unit was taken back out and {p.unit} is stopped, as it was"
    )


def restore(p: Ports, run: Run, record: Record) -> tuple[bool, str]:
    """Put the backup back (or remove a unit that had none); restart and verify only if needed.

    Without a backup the old unit may still be one systemd loads from elsewhere (/usr/lib,
    /usr/local/lib, /run): removing ours brings it back, and it is restarted and verified like any.
    """
    p.log.emit(Stage.RESTORE, "step", f"restoring {record.backup or 'no unit (there was none here)'}")
    state = p.systemd.unit_state(p.unit)
    # An inactive engine, another start of it, or a job begun on another unit (host/change/jobs.py): touched
    look = p.daemon.jobs.look
    untouched = not touched(record, p.unit, state.active_state, state.invocation_id, look)
    if untouched and not record.wrote and record.backup is not None:
        return True, ""  # nothing was written and nothing restarted: nothing to undo
    try:
        _put_back(p, record.backup)
    except (OSError, UnitWriteError) as exc:
        return False, f"cannot restore {record.backup or 'the absence of a unit'}: {exc}"
    p.systemd.daemon_reload()
    loaded = p.systemd.unit_state(p.unit)
    if loaded.load_state in NO_UNIT:  # no unit, or an empty (masked) one: nothing ran before
        if not untouched:
            p.systemd.stop(p.unit, RESTART_JOB_TIMEOUT_S)
        p.log.emit(Stage.RESTORE, "step", f"{p.unit} is {loaded.load_state} again: stopped as before")
        return True, ""
    # A packaged unit was not rewritten: its file's age says nothing of which unit the start ran.
    rewritten = record.backup is not None
    if untouched or (rewritten and runs_restored_file(p, state, loaded.fragment_path)):
        # Never restarted since the record (or restarted from the restored file, e.g. by a reboot):
        # the running start already is the old unit's.
        p.log.emit(Stage.RESTORE, "step", f"{p.unit} was not restarted with the new unit: no restart")
        return True, ""
    return verify_old(p, run)


def _put_back(p: Ports, backup: str | None) -> None:
    """The files of the backup's time: the daemon's unit, the unit (or none), the secrets."""
    p.daemon.restore(backup)  # [weight_cache]: the daemon's unit of the backup's time
    if backup is None:
        p.files.remove(p.unit)
    elif p.files.read(p.unit) != p.files.read(backup):
        p.files.restore(p.unit, backup)
    p.secrets.restore(backup)


def verify_old(p: Ports, run: Run) -> tuple[bool, str]:
    """Restart the restored unit and see it serve: a rollback is reported only once it does."""
    from agent.host.watch.probe import ProbeError

    if run.hold_old or (p.req.group is not None and run.recovering):  # never a barrier nobody sends
        stop_clean(p, RESTART_JOB_TIMEOUT_S)
        p.log.emit(Stage.RECOVER, "step", "stopped: its old unit starts only with its peers")
        return True, ""
    back = Signals(p.state.txn_dir(p.txn), back=True) if p.req.group is not None else None
    gate = Gate(None, None, 0.0, p.req.timeouts)
    old: WatchResult | str | None = restart_and_watch(p, run, gate, Stage.VERIFY_OLD, back)
    for _ in range(MAX_RESTARTS_UNDER_CHECK + 1):
        assert isinstance(old, WatchResult)
        if old.verdict.action is not Action.READY:
            return False, old.verdict.reason
        if node_rank(p.files.read(p.unit) or "") >= 1:  # its /health is a placeholder's
            p.log.emit(Stage.VERIFY_OLD, "step", "old unit running with its KV pool (node rank >= 1)")
            return True, ""
        cursor = p.journal.cursor()
        try:
            p.http().wait_ready(p.req.timeouts.ready_s)
        except ProbeError as exc:
            return False, str(exc)
        # [weight_cache]: a daemon crash under the check restarts the old unit too (host/change/settle.py)
        again = after_check(p, old, gate, cursor)
        if again is None:
            return True, _healthy(p, old)
        if isinstance(again, str):
            return False, again
        old = again
    return False, "the old unit keeps being restarted under the checks"


def _healthy(p: Ports, old: WatchResult) -> str:
    pool = old.summary.get("kv_tokens")
    said = pool_said(dict(old.summary))
    p.log.emit(Stage.VERIFY_OLD, "step", f"old unit healthy: {said}, ready", kv_tokens=pool)
    return ""


def runs_restored_file(p: Ports, state: UnitState, fragment: str) -> bool:
    """The running start began after the unit file (now the old one) last changed, and is ready."""
    if not (state.active_state == "active" and state.sub_state == "running"):
        return False
    try:
        if Path(fragment).stat().st_mtime_ns // 1000 >= state.active_enter_timestamp_us:
            return False
    except OSError:
        return False
    lines = p.journal.last_invocation_lines(p.unit, 20000)
    return bool(lines) and bool(summarize(lines).to_dict().get("ready"))
