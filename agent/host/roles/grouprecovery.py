"""Recovering one node of a multi-node change whose agent died: what the group machine says
(protocol/groupmachine.py, Saw.RECOVER), never a generation of the node's own.

A one-host change's recovery restores the old unit and restarts it. A group node must not: an old start
could meet its peers' new servers at the rendezvous. It keeps the new unit when the group committed (or,
rank 0 of a collective only, when its decision deadline passed with its new server running: its peers
took that for a commit); otherwise it stops, puts the old unit file back, and starts it only on "go-back",
which the coordinator sends once every rank has stopped its new server. With no go-back in time it stays
stopped, in doubt: the next `deployctl apply` of the group takes it to rank 0's decision.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from agent.host.roles.groupsignal import Signals, files_of
from agent.protocol.groupmachine import Decision, Do, Files, Node, Phase, Saw, Step, node_step
from agent.protocol.grouprecord import GroupRecord


@dataclass(frozen=True)
class Recovery:
    node: Node
    done: tuple[Do, ...]
    wait_back_s: float  # how long to wait for "go-back" once stopped (0: the change's time is over)


def _go_age_s(signals: Signals, now: float) -> float | None:
    try:
        return now - Path(signals.folder / "group-go").stat().st_mtime
    except OSError:
        return None


def recovery_step(rank: int, files: Files, running: bool, go_age_s: float | None, horizon_s: float) -> Step:
    """Pure: the machine's step for a node found mid-change with these signal files. It knows no phase of
    its own, only its files: "go" taken means its new unit may have started. Rank 0 keeps a new server it
    finds running past the horizon from "go" (its peers took that for its commit); a stopped one (a reboot)
    is no evidence of anything, so it aborts like every other node without a decision. Without a
    collective ([pd]) no peer takes a running server for a commit: its horizon is infinite, rank 0 aborts."""
    phase = Phase.STARTING if files.go else Phase.STOPPED
    late = rank == 0 and running and go_age_s is not None and go_age_s > horizon_s
    return node_step(Node(rank, phase, files), Saw.RECOVER_LATE if late else Saw.RECOVER)


def recovery(group: GroupRecord, signals: Signals, running: bool, now: float | None = None) -> Recovery:
    """recovery_step on this node's files, its claim made on disk (the first writer wins)."""
    now = time.time() if now is None else now
    files = files_of(signals)
    age = _go_age_s(signals, now)
    horizon = group.horizon_s if group.collective else math.inf  # no collective: no late commit
    node, done = recovery_step(group.rank, files, running, age, horizon)
    if node.files.decision is not None and files.decision is None:
        late = node.files.decision is Decision.COMMIT
        why = "its agent died mid-change; recovered " + ("late" if late else "before the decision")
        stands = signals.claim(node.files.decision, f"rank {group.rank}: {why}", "node")
        if stands.decision is not node.files.decision:  # the coordinator's word came first: it stands
            node, done = recovery_step(group.rank, files_of(signals), running, age, horizon)
    started = now - age if age is not None else now
    return Recovery(node, done, max(0.0, started + group.horizon_s - now) if files.go else group.wait_s)
