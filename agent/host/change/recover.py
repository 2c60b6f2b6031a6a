"""The recovery step of the host transaction: finish what an earlier run left (keep a verified unit, else
restore its backup), a group node's recovery as the group machine says (host/roles/grouprecovery.py), and
what a failed or impossible recovery tells the verb that found it."""

from __future__ import annotations

from agent.host.change.ports import NO_UNIT, Ports, Result, Run
from agent.host.change.record import PHASE_VERIFIED, CorruptRecord, Record
from agent.host.change.restart import stop_clean
from agent.host.change.restore import restore, verify_old
from agent.host.roles.grouprecovery import recovery
from agent.host.roles.groupsignal import Signals
from agent.host.watch.poll import wait_until
from agent.protocol.events import Outcome, Stage
from agent.protocol.groupmachine import Do, Phase
from agent.protocol.grouprecord import GroupRecord, UnreadableGroupRecord
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S

RUNNING = ("active", "reloading", "activating")


def blocked(p: Ports, run: Run, found: str | None, explicit: bool) -> Result | None:
    """What a recovery that found a corrupt record, or failed, stops the verb with (None: go on)."""
    if found == "corrupt":
        path = p.state.record_path(p.unit)
        return Result(
            Outcome.ERROR,
            f"the recovery record {path} is unreadable: nothing changed; compare {p.unit} with its "
            f"backups (deployctl backups), restore the right one by hand, then remove {path}",
        )
    if found == "group-unreadable":  # never a one-host recovery: its old start could meet new peers
        return Result(
            Outcome.ERROR,
            f"{run.unreadable}: nothing changed; whether {p.unit} is one rank of a group, and which, is "
            f"unknown: compare it with its backups (deployctl backups) and its group's other nodes "
            f"(deployctl status), restore the right unit by hand, then remove {p.state.record_path(p.unit)}",
        )
    if found == "failed" and not explicit and run.unrecovered and run.unrecovered.phase == PHASE_VERIFIED:
        return Result(
            Outcome.ROLLBACK_FAILED,
            f"an earlier change ({run.unrecovered.txn}) had been verified but {p.unit} does not start "
            f"again, so nothing else was changed: see its journal, then re-run (the start is tried again)",
            {"backup": run.unrecovered.backup},
        )
    if found == "failed" and not explicit:
        record = run.unrecovered
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


def recover(p: Ports, run: Run) -> str | None:
    """Finish what an earlier run left: keep a verified unit, otherwise restore the backup.

    The service is restarted only if it was restarted since the record was written: a run killed
    before its restart only needs the file put back, never a model load for nothing.
    """
    try:
        record = p.state.load_record(p.unit)
    except CorruptRecord as exc:
        p.log.emit(Stage.RECOVER, "warning", f"{exc}: refusing to change {p.unit}")
        return "corrupt"
    if record is None:
        orphan_guard(p)
        return None
    if p.guard.armed():  # this boot's agent decides now: the starts it makes pass the boot guard
        p.guard.allow()
    if record.phase == PHASE_VERIFIED:
        return keep_verified(p, run, record)
    run.recovering = record.txn != p.txn  # this change's own record rolls back with its group
    group, unreadable = read_group(p, run, record)
    if unreadable:
        return "group-unreadable"
    p.log.emit(Stage.RECOVER, "warning", f"transaction {record.txn} did not finish: restoring the old unit")
    try:
        if group is not None:
            return recover_group(p, run, record, group)
        ok, reason = restore(p, run, record)
    except OSError as exc:  # a disk fault mid-restore: the record stays for the next run
        ok, reason = False, str(exc)
    finally:
        run.hold_old = False
    stopped, run.recovering = run.recovering and p.req.group is not None, False
    if ok:
        p.clear_record()
        how = "restored, stopped until its group starts it" if stopped else "restored and healthy"
        p.log.emit(Stage.RECOVER, "step", f"old unit of {record.txn} {how}")
        return "restored"
    run.unrecovered = record
    p.log.emit(Stage.RECOVER, "warning", f"restoring the old unit of {record.txn} failed: {reason}")
    return "failed"


def orphan_guard(p: Ports) -> None:
    """A boot guard with no record (an older agent's kill between the two) would skip every boot's start."""
    if p.guard.disarm():
        p.systemd.daemon_reload()  # as clear_record: the unit is not left reading NeedDaemonReload=yes
        p.log.emit(Stage.RECOVER, "step", f"removed the boot guard of {p.unit}: no change pending")


def keep_verified(p: Ports, run: Run, record: Record) -> str:
    """A verified change killed before its record went: keep it. A reboot in between may have left its
    unit stopped (a group node's boot guard skips the start at boot): it is started and checked before
    the record goes, as a committed group's node is (recover_group)."""
    state = p.systemd.unit_state(p.unit)
    ok, reason = True, ""
    if state.active_state not in RUNNING and state.load_state not in NO_UNIT:
        p.log.emit(Stage.RECOVER, "step", f"transaction {record.txn} had been verified; {p.unit} is "
                   f"{state.active_state}: starting it")  # fmt: skip
        try:
            group = GroupRecord.read(p.state.txn_dir(record.txn))
        except UnreadableGroupRecord as exc:  # maybe a group's node: never restarted alone on a guess
            ok, reason, group = False, str(exc), None
        else:
            if group is not None:  # the group committed: its peers run this generation; no rank's own gate
                started = p.systemd.start(p.unit, RESTART_JOB_TIMEOUT_S)
                ok, reason = started.ok, f"its start ended {started.result}"
            else:
                ok, reason = verify_old(p, run)
    if not ok:
        run.unrecovered = record
        p.log.emit(Stage.RECOVER, "warning", f"the verified unit of {record.txn} did not start: {reason}")
        return "failed"
    p.clear_record()
    p.log.emit(Stage.RECOVER, "step", f"transaction {record.txn} had been verified: kept")
    return "kept"


def read_group(p: Ports, run: Run, record: Record) -> tuple[GroupRecord | None, bool]:
    """The interrupted change's group record: (None, False) for a one-host change (or this change's own
    record), (None, True) when it is unreadable: the recovery refuses (run.unreadable says why)."""
    if not run.recovering:
        return None, False
    try:
        return GroupRecord.read(p.state.txn_dir(record.txn)), False
    except UnreadableGroupRecord as exc:
        run.unreadable, run.recovering = str(exc), False
        p.log.emit(Stage.RECOVER, "warning", f"{exc}: refusing to change {p.unit}")
        return None, True


def recover_group(p: Ports, run: Run, record: Record, group: GroupRecord) -> str:
    """A group node whose agent died: what the group machine says (host/roles/grouprecovery.py)."""
    signals = Signals(p.state.txn_dir(record.txn))
    running = p.systemd.unit_state(p.unit).active_state == "active"
    step = recovery(group, signals, running)
    if step.node.phase is Phase.COMMITTED:
        if Do.START_NEW in step.done and not running:
            p.systemd.start(p.unit, RESTART_JOB_TIMEOUT_S)
        p.clear_record()
        p.log.emit(Stage.RECOVER, "step", f"transaction {record.txn}: the group committed: kept")
        return "kept"
    # The record, and the boot guard with it, stay until the old unit is back (or a group change
    # takes the node): a node in doubt, or whose old start failed, must not start at the next boot.
    p.guard.arm()
    stop_clean(p, RESTART_JOB_TIMEOUT_S)  # its new server must not meet an old peer, nor stay
    run.hold_old = True
    ok, reason = restore(p, run, record)
    run.hold_old = False
    if not ok:
        run.unrecovered = record
        p.log.emit(Stage.RECOVER, "warning", f"restoring the old unit of {record.txn} failed: {reason}")
        return "failed"
    back = group_back(p, run, record, group, step.wait_back_s)
    if back == "restored":
        p.clear_record()
    elif back == "failed":
        run.unrecovered = record
    return back


def group_back(p: Ports, run: Run, record: Record, group: GroupRecord, wait_back_s: float) -> str:
    """A recovered node stopped with its old unit file: its old unit starts on the go-back of the
    change's own coordinator, else it stays stopped (in doubt, or for the new group change)."""
    signals = Signals(p.state.txn_dir(record.txn))
    if p.req.group is None:  # the change's own coordinator may still follow: it counts this stop
        p.log.emit(Stage.RECOVER, "step", f"rank {group.rank} stopped, its old unit file back: "
                   "waiting for every rank to stop", vote="stopped_back")  # fmt: skip
    # only the coordinator of that change sends its "go-back"; a later run starts it with its peers
    wait_s = wait_back_s if p.req.died == record.txn else 0.0
    if p.req.group is None and wait_until(lambda: signals.for_rollback().gone(), wait_s):
        ok, reason = verify_old(p, run)
        how = "every rank stopped: old unit restarted and healthy" if ok else f"old unit failed: {reason}"
        p.log.emit(Stage.RECOVER, "step" if ok else "warning", how)
        return "restored" if ok else "failed"
    if p.req.group is not None:
        p.log.emit(Stage.RECOVER, "step", "stopped: the group's change starts it with its peers")
        return "restored"
    run.in_doubt = (
        f"rank {group.rank} in doubt: its agent died mid-change and no go-back came: it stays stopped "
        "with its old unit (never a generation of its own); deployctl apply again brings the group back"
    )
    p.log.emit(Stage.RECOVER, "warning", run.in_doubt)
    return "in-doubt"
