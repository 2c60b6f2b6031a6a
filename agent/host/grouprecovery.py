"""Recovering one node of a multi-node change whose agent died: what the group machine says
(host/groupmachine.py, Saw.RECOVER), never a generation of the node's own.

A one-host change's recovery restores the old unit and restarts it. A group node must not: an old start
could meet its peers' new servers at the rendezvous. It keeps the new unit when the group committed (or,
rank 0 only, when its decision deadline passed with its new server running: its peers took that for a
commit); otherwise it stops, puts the old unit file back, and starts it only on "go-back", which the
coordinator sends once every rank has stopped its new server. With no go-back in time it stays stopped,
in doubt: the next `deployctl apply` of the group takes it to rank 0's decision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from agent.host.groupmachine import Do, Node, Phase, Saw, files_of, node_step
from agent.host.groupnode import start_bound_s
from agent.host.groupsignal import Signals
from agent.protocol.common import ProtocolError
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, Request, stop_timeout_s


@dataclass(frozen=True)
class GroupRecord:
    """What recovery needs of the interrupted change's own request: the node's rank and its bounds."""

    rank: int
    wait_s: float
    start_bound_s: float

    @classmethod
    def of(cls, req: Request) -> GroupRecord | None:
        if req.group is None:
            return None
        stop_s = stop_timeout_s(req.drain_timeout_s, req.drain_stop_allowance_s)
        return cls(req.group.rank, req.group.wait_s, start_bound_s(req, stop_s + RESTART_JOB_TIMEOUT_S))

    @classmethod
    def read(cls, txn_dir: Path) -> GroupRecord | None:
        """The group of the change whose folder this is, from its own request.json; None for a one-host
        change, or a folder without a request this agent can read (recovered as a one-host change)."""
        try:
            req = Request.from_json((txn_dir / "request.json").read_text("utf-8"))
        except (OSError, ValueError, TypeError, KeyError, ProtocolError):
            return None
        return cls.of(req)

    @property
    def horizon_s(self) -> float:
        """From "go", the longest any rank of the change may still act on its own (a rank >= 1's deadline)."""
        return self.wait_s + self.start_bound_s


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


def recovery(group: GroupRecord, signals: Signals, running: bool, now: float | None = None) -> Recovery:
    """The machine's step for a node found mid-change, its claim made on disk (the first writer wins)."""
    now = time.time() if now is None else now
    files = files_of(signals)
    age = _go_age_s(signals, now)
    phase = Phase.STARTING if files.go else Phase.STOPPED
    late = group.rank == 0 and running and age is not None and age > group.horizon_s
    saw = Saw.RECOVER_LATE if late else Saw.RECOVER
    node, done = node_step(Node(group.rank, phase, files), saw)
    if node.files.decision is not None and files.decision is None:
        why = "its agent died mid-change; recovered " + ("late" if late else "before the decision")
        stands = signals.claim(node.files.decision, f"rank {group.rank}: {why}", "node")
        if stands.decision is not node.files.decision:  # the coordinator's word came first: it stands
            node, done = node_step(Node(group.rank, phase, files_of(signals)), saw)
    started = now - age if age is not None else now
    return Recovery(node, done, max(0.0, started + group.horizon_s - now) if files.go else group.wait_s)
