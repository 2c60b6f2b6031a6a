"""What a group change's recovery and its coordinator need of the change's own request: the node's rank and
its bounds (host/roles/grouprecovery.py recovers a node with it; group/run.py bounds its waits by it).

The agent writes it as a small versioned file, group.json, in the change's folder before its request.json
(host/change/folder.py), so a folder whose request is known to the `signal` verb has it. A recovery that finds
it unreadable refuses (nothing changed, the path named): taken for a one-host change, a group node would
restart its old unit alone, into its peers' new servers."""

from __future__ import annotations

import json
import math
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


GROUP_RECORD = "group.json"
VERSION = 1


class UnreadableGroupRecord(Exception):
    """A change's group record (or, in a folder without one, its request) that cannot be read: whether the
    node is one of a group, and which rank, is unknown, so nothing may change until a person looks."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"the group record {path} is unreadable ({detail})")
        self.path = path


@dataclass(frozen=True)
class GroupRecord:
    """What recovery needs of the interrupted change's own request: the node's rank and its bounds."""

    rank: int
    wait_s: float
    start_bound_s: float
    collective: bool = True  # false for a [pd] group: no late commit (protocol/groupmachine.py)

    @classmethod
    def of(cls, req: Request) -> GroupRecord | None:
        if req.group is None:
            return None
        stop_s = stop_timeout_s(req.drain_timeout_s, req.drain_stop_allowance_s)
        bound = start_bound_s(req, stop_s + RESTART_JOB_TIMEOUT_S)
        return cls(req.group.rank, req.group.wait_s, bound, req.group.collective)

    def to_json(self) -> str:
        body = {
            "version": VERSION,
            "rank": self.rank,
            "wait_s": self.wait_s,
            "start_bound_s": self.start_bound_s,
        }
        if not self.collective:  # written only when false: a [nodes] record reads as before
            body["collective"] = False
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GroupRecord:
        """Strict: this version, exactly these fields (`collective` optional, a bool), a rank >= 0 and
        positive finite bounds (ValueError)."""
        body = json.loads(text)
        fields = {"version", "rank", "wait_s", "start_bound_s"}
        if not isinstance(body, dict) or set(body) - {"collective"} != fields:
            raise ValueError(f"fields {sorted(body) if isinstance(body, dict) else type(body).__name__}")
        if body["version"] != VERSION or isinstance(body["version"], bool):
            raise ValueError(f"version {body['version']!r}, this agent reads {VERSION}")
        rank, wait_s, bound_s = body["rank"], body["wait_s"], body["start_bound_s"]
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"rank {rank!r}")
        for name, value in (("wait_s", wait_s), ("start_bound_s", bound_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"{name} {value!r}")
        collective = body.get("collective", True)
        if not isinstance(collective, bool):
            raise ValueError(f"collective {collective!r}")
        return cls(rank, float(wait_s), float(bound_s), collective)

    @classmethod
    def read(cls, txn_dir: Path) -> GroupRecord | None:
        """The group of the change whose folder this is; None for a one-host change. A folder without a
        group record (written by an agent before it had one) is read from its request.json. Raises
        UnreadableGroupRecord when the record, or that request, exists but cannot be read."""
        path = txn_dir / GROUP_RECORD
        try:
            return cls.from_json(path.read_text("utf-8"))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise UnreadableGroupRecord(path, str(exc)) from None
        path = txn_dir / "request.json"
        try:
            text = path.read_text("utf-8")
            if json.loads(text).get("group") is None:
                return None  # a one-host change, whatever else its request says
            req = Request.from_json(text)
        except FileNotFoundError:
            return None  # nothing names a group: a one-host change
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ProtocolError) as exc:
            raise UnreadableGroupRecord(path, str(exc) or type(exc).__name__) from None
        return cls.of(req)

    @property
    def horizon_s(self) -> float:
        """From "go", the longest any rank of the change may still act on its own (a rank >= 1's deadline)."""
        return self.wait_s + self.start_bound_s
