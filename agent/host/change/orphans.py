"""Every recovery decision in one place: a change whose agent died, a record left behind, a bug mid-change.

The record (record.Record) is written before the first change to the unit and cleared at commit; whoever
finds it without a live runner finishes the job (Transaction.recover restores or keeps the unit).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from agent.host.change.record import CorruptRecord
from agent.host.change.transaction import Transaction
from agent.host.events import EventLog
from agent.host.state import StateDir
from agent.host.systemd import Systemd
from agent.host.watch.journal import Journal
from agent.protocol.answers import Holder
from agent.protocol.events import Outcome
from agent.protocol.grouprecord import GroupRecord, UnreadableGroupRecord
from agent.protocol.requests import Request


def orphaned(req: Request, running: Callable[[], Holder | None]) -> bool:
    """A change whose agent died (SIGKILL, reboot) left its record: the caller runs `recover` next.

    `running` is asked only when there is a record: it costs systemd calls every read-only verb would pay.
    """
    state_dir = StateDir(req.state_dir)
    if record_state(state_dir, req.unit) is not RecordState.PENDING or running() is not None:
        return False  # a corrupt record is not recovered: every change refuses until a person looks
    last = state_dir.last_txn(req.unit)
    # a change that ended with a failed rollback waits for a person; a group node that ended in doubt
    # (stopped, its record kept) is taken to its group's decision by the next run
    return last is None or not state_dir.has_outcome(last) or was_group_change(state_dir, req.unit)


def was_group_change(state_dir: StateDir, unit: str) -> bool:
    """Whether the unit's pending record is a multi-node change's (its request names a group)."""
    try:
        record = state_dir.load_record(unit)
    except CorruptRecord:
        return False
    if record is None:
        return False
    try:
        return GroupRecord.read(state_dir.txn_dir(record.txn)) is not None
    except UnreadableGroupRecord:
        return True  # the recovery refuses it and says why: never silently left alone


class RecordState(str, Enum):
    NONE = "none"
    PENDING = "pending"  # an unfinished change's record: the next run finishes it
    CORRUPT = "corrupt"  # a record that cannot be read: every change refuses until a person looks


def record_state(state_dir: StateDir, unit: str) -> RecordState:
    try:
        return RecordState.NONE if state_dir.load_record(unit) is None else RecordState.PENDING
    except CorruptRecord:
        return RecordState.CORRUPT


def try_recover(req: Request, txn: str, log: EventLog) -> str:
    try:
        with Systemd() as sd:
            return str(Transaction(req, txn, sd, Journal(), log).recover() or "nothing to do")
    except Exception as exc:  # the record is still on disk: the next agent start tries again
        return f"failed ({type(exc).__name__}: {exc})"


def died_without_record(state_dir: StateDir, unit: str, txn: str) -> tuple[Outcome, str]:
    """No record left: the runner died before its first change, or after its commit cleared it."""
    if any(h.get("txn") == txn for h in state_dir.history(unit, 5)):
        outcome, msg = Outcome.APPLIED, "the change had been verified and committed before its agent died"
    else:
        outcome, msg = Outcome.ERROR, "the agent died before it changed anything; nothing changed: re-run"
    return outcome, msg
