"""What a group change's recovery and its coordinator need of the change's own request: the node's rank and
its bounds (host/grouprecovery.py recovers a node with it; group/run.py bounds its waits by it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.protocol.common import ProtocolError
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, Request, stop_timeout_s


def start_bound_s(req: Request, stop_s: float) -> float:
    """The longest rank 0 can take from "go" to its vote and, if it aborts, to its new server's stop: its
    start's own bounds (the rendezvous allowance included), the smoke test, and the stop."""
    assert req.group is not None
    t = req.timeouts
    return (
        t.weights_s + t.pool_s + t.ready_s + t.no_progress_s + req.group.wait_s + req.smoke.timeout_s + stop_s
    )


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
