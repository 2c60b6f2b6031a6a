"""One node's waits in a group change, each ending in what the group machine (protocol/groupmachine.py) says:
the transaction's group step (host/roles/groupstep.py) waits here, and does what the machine answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.host.roles.groupsignal import Signals, files_of
from agent.host.watch.poll import wait_until
from agent.protocol.groupmachine import Do, Node, Phase, Saw, deadline_s, node_step

Wait = Callable[[Callable[[], bool], float], bool]


@dataclass
class NodeWaits:
    signals: Signals
    rank: int
    wait_s: float
    start_bound_s: float
    wait: Wait = wait_until
    collective: bool = True  # false for a [pd] group: its deadline is no commit (protocol/groupmachine.py)

    def step(self, phase: Phase, saw: Saw, reason: str) -> tuple[Node, tuple[Do, ...]]:
        """The machine's step; a decision it claims is claimed on disk, where the first writer wins."""
        files = files_of(self.signals)
        node, done = node_step(Node(self.rank, phase, files, self.collective), saw)
        if node.files.decision is not None and files.decision is None:
            stands = self.signals.claim(node.files.decision, reason, "node")
            if stands.decision is not node.files.decision:  # the coordinator's word came first
                return node_step(Node(self.rank, phase, files_of(self.signals), self.collective), Saw.SIGNAL)
        return node, done

    def decision(self, gone: Callable[[], bool]) -> tuple[Node, tuple[Do, ...]]:
        """Voted ready: the group's word, or what the machine says when none comes in time or the server
        stops meanwhile."""
        limit = deadline_s(Node(self.rank, Phase.DECIDING), self.wait_s, self.start_bound_s)
        if self.wait(lambda: self.signals.decided() is not None or gone(), limit):
            saw = Saw.SIGNAL if self.signals.decided() is not None else Saw.GONE
        else:
            saw = Saw.DEADLINE
        reason = {
            Saw.SIGNAL: "",
            Saw.GONE: "its server stopped while it waited for the decision",
            Saw.DEADLINE: f"no decision from deployctl within {limit:.0f} s" + self._late(),
        }[saw]
        return self.step(Phase.DECIDING, saw, reason)

    def _late(self) -> str:
        if self.rank == 0:
            return ""
        if not self.collective:
            return ": no collective, so its running server proves nothing: it stops and waits for the word"
        return ": its server outlived rank 0's own deadline, so rank 0 committed"

    def held(self) -> tuple[Node, tuple[Do, ...]]:
        """Stopped before any word: wait for the word once more, then end in doubt."""
        came = self.wait(lambda: self.signals.decided() is not None, self.wait_s)
        return self.step(Phase.HELD, Saw.SIGNAL if came else Saw.DEADLINE, "")

    def back(self, no_go: bool) -> Node:
        """Rolling back, its new server stopped: "go-back", or in doubt when none comes in time. Rank 0 that
        took no "go" starts its old unit at once: no rank can run a new server."""
        if no_go:
            return Node(self.rank, Phase.ROLLED_BACK)
        came = self.wait(lambda: Signals(self.signals.folder, back=True).gone(), self.wait_s)
        return self.step(Phase.BACK, Saw.SIGNAL if came else Saw.DEADLINE, "")[0]
