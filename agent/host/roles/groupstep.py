"""The group step of the host transaction: one node of a multi-node service starts with its peers, votes,
and does what the group decided (the group machine, protocol/groupmachine.py, through
host/roles/groupnode.py); the plain steps (restart, verify, commit, restore) do the rest."""

from __future__ import annotations

from agent.host.change.commit import commit
from agent.host.change.decide import Failure
from agent.host.change.next_step import Step, after_group, next_step, verified, watched
from agent.host.change.ports import Change, Ports, Result, Run
from agent.host.change.restart import restart_and_watch, stop_clean, waits
from agent.host.change.restore import roll_back
from agent.host.change.verify import verify
from agent.host.roles.groupsignal import Signals
from agent.host.roles.pdrouter import pool_said
from agent.host.watch.start import WatchResult
from agent.protocol.events import Outcome, Stage
from agent.protocol.groupmachine import Decision, Do, Phase
from agent.protocol.groupmachine import Node as GroupNode
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S


def start_and_decide(p: Ports, run: Run, change: Change) -> Result:
    """One node of a multi-node service: stop, wait for every rank to stop ("go"), start, watch, vote,
    then do what the group decided; no word from the coordinator in time is a rollback."""
    assert p.req.group is not None
    signals = Signals(p.state.txn_dir(p.txn))
    started = restart_and_watch(p, run, change.gate, Stage.WATCH, barrier=signals)
    rank = p.req.group.rank
    if run.barrier is not None:  # aborted before it started: the group's word, not a failure of its own
        return roll_back(p, run, change, run.barrier, started)
    reason = started.verdict.reason
    if started.verdict.kind is Failure.ABANDONED:  # the group's word, not a failure of its own
        p.log.emit(Stage.GROUP, "step", reason, decision="abort")
        return roll_back(p, run, change, reason, started)
    # Its vote is what the one decider makes of its own steps (host/change/next_step.py): ready only for a
    # start the watch found READY and that verified; anything else votes failed.
    seen = watched(started.verdict.action)
    if next_step(seen) is Step.VERIFY:
        failed = verify(p, run, started, change)
        seen, reason = verified(seen, failed), failed or ""
    if next_step(seen) is Step.COMMIT:
        pool = started.summary.get("kv_tokens")
        p.log.emit(Stage.GROUP, "step", f"rank {rank} ready ({pool_said(dict(started.summary))}): "
                   "waiting for the group's decision", vote="ready", kv_tokens=pool)  # fmt: skip
        return decided(p, run, signals, started, change)
    reason = reason or f"its start ended at {started.verdict.action.value}, not ready"
    stands = signals.claim(Decision.ABORT, f"rank {rank}: {reason}", "node")
    p.log.emit(Stage.GROUP, "warning", f"rank {rank} failed: {reason}", vote="failed")
    p.log.emit(Stage.GROUP, "step", f"the group rolled back: {stands.reason}", decision="abort")
    return roll_back(p, run, change, reason, started)


def decided(p: Ports, run: Run, signals: Signals, started: WatchResult, change: Change) -> Result:
    """Voted ready: do what the group machine says once the word comes, or its deadline passes."""
    node, done = wait_for_decision(p, run, signals)
    stands = signals.decided()
    why = stands.reason if stands else "no word"
    step = after_group(node.phase)
    if step is Step.COMMIT:
        if Do.START_NEW in done:  # it had stopped before the word: rank 0 committed
            p.systemd.start(p.unit, RESTART_JOB_TIMEOUT_S)
        p.log.emit(Stage.GROUP, "step", "the group committed", decision="commit")
        return commit(p, run, started, change)
    if step is Step.STAY_STOPPED:
        run.in_doubt = (
            f"rank {node.rank} in doubt: its server stopped and no word came from deployctl or rank 0;"
            " it stays stopped (never a generation of its own): deployctl apply again takes it to rank"
            " 0's decision"
        )
        p.log.emit(Stage.GROUP, "warning", run.in_doubt, decision="in-doubt")
        return Result(Outcome.ROLLBACK_FAILED, run.in_doubt, {"backup": change.backup})
    p.log.emit(Stage.GROUP, "step", f"the group rolled back: {why}", decision="abort")
    return roll_back(p, run, change, f"the group rolled back ({why})", started)


def wait_for_decision(p: Ports, run: Run, signals: Signals) -> tuple[GroupNode, tuple[Do, ...]]:
    """The group's decision, or what the group machine says without one (protocol/groupmachine.py): rank 0
    aborts alone; a rank >= 1 keeps the new unit when its server outlived rank 0's deadline, and stops
    (systemd's Restart= must not bring it back to join another generation) when it did not."""
    started = p.systemd.unit_state(p.unit)
    node_waits = waits(p, run, signals)

    def gone() -> bool:
        now = p.systemd.unit_state(p.unit)
        return now.invocation_id != started.invocation_id or now.active_state != "active"

    node, done = node_waits.decision(gone)
    if node.phase is Phase.HELD:
        stop_clean(p, RESTART_JOB_TIMEOUT_S)
        p.log.emit(Stage.GROUP, "warning", f"rank {node.rank}'s server stopped before any word: "
                   "stopped, waiting for rank 0's decision")  # fmt: skip
        node, done = node_waits.held()
    return node, done
