"""The commit step of the host transaction: the verified unit's record, its line of history, the outcome."""

from __future__ import annotations

from agent.host.change.ports import Change, Ports, Result, Run
from agent.host.change.record import PHASE_VERIFIED
from agent.host.roles.pdrouter import pool_said
from agent.host.watch.start import WatchResult
from agent.host.watch.timeline import downtime
from agent.protocol.answers import HistoryEntry
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Outcome, OutcomeData, Stage


def commit(p: Ports, run: Run, started: WatchResult, change: Change) -> Result:
    """Record the new unit as verified, add its history entry, and clear the recovery record."""
    p.record(PHASE_VERIFIED, change.backup, change.new)
    state = p.systemd.unit_state(p.unit)
    down = downtime(run.events).to_dict()
    entry: HistoryEntry = {
        "txn": p.txn,
        "at": p.now().isoformat(),
        "sha256": sha256(change.new),
        "invocation": state.invocation_id,
        "start_seconds": round(started.seconds, 2),
        "downtime": down,
        "prewarm": run.prewarmed.to_dict() if run.prewarmed is not None else None,
        **started.summary,
    }
    p.state.append_history(p.unit, entry)
    p.clear_record()
    p.log.emit(Stage.COMMIT, "step", "committed", backup=change.backup)
    data: OutcomeData = {
        "summary": started.summary,
        "backup": change.backup,
        "start_seconds": started.seconds,
        "downtime": down,
    }
    _seen(run, data)
    what = f"restored {change.restored_from}" if change.restored_from else "applied"
    said = pool_said(dict(started.summary))
    return Result(Outcome.APPLIED, f"{p.unit} {what}: {said}, server ready", data)


def _seen(run: Run, data: OutcomeData) -> None:
    """What the run's earlier steps measured, in the outcome: pre-warm, drain, smoke and load checks."""
    if run.prewarmed is not None:
        data["prewarm"] = run.prewarmed.to_dict()
    if run.drains:
        data["drain"] = run.drains[0].to_dict()
    if run.smoke_result is not None:
        data["smoke"] = run.smoke_result.to_dict()
    if run.load_result is not None:
        data["load"] = run.load_result.to_dict()
