"""A change of a multi-node service: one transaction per node, coordinated from here.

Each node's agent runs its own transaction (backup, write, stop, then wait); this side follows every
node's events in a thread, sends "go" once every rank stopped, and commit or abort once every rank voted
(agent/group/decide.py decides). A signal is a file the node's transaction reads (host/groupsignal.py),
delivered over a fresh connection, so a dropped link delays it but loses nothing; a node that hears
nothing in [nodes] wait_s rolls itself back. At the end, a node that kept the new unit while another went
back is rolled back too.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from agent.errors import ConnectError, RemoteError
from agent.group.decide import Next, Rank, Step, Vote, next_step, to_roll_back
from agent.inventory import HostConfig
from agent.protocol.answers import SignalAnswer
from agent.protocol.events import Event, Outcome
from agent.protocol.requests import Request
from agent.remote.client import AgentClient, base_request
from agent.remote.follow import Watch, connected
from agent.remote.follow import follow as follow_transaction
from agent.remote.transport import ConnectionLost

SIGNAL_TRIES = 6  # over about a minute: a link that stays down longer leaves it to the node's own wait


@dataclass
class Node:
    rank: int
    host: HostConfig
    client: AgentClient | None  # None in the pure tests, whose follow and signals need none
    request: Request
    view: Rank = field(default_factory=Rank)
    outcome: Event | None = None


Signal = Callable[[Node, str, str], SignalAnswer]  # (node, "go"/"commit"/"abort", reason) -> its answer
Hear = Callable[[Node, Event], None]  # every event of every node, for the screen
# Start a node's transaction and pass on its events until its outcome; ConnectError/ConnectionLost when
# the link cannot be re-attached to.
Follow = Callable[[Node, Callable[[Event], None]], object]


def follow(node: Node, on_event: Callable[[Event], None]) -> object:
    assert node.client is not None
    return follow_transaction(node.client, node.host, node.request, Watch(on_event))


def signal(node: Node, word: str, reason: str) -> SignalAnswer:
    """Deliver one signal over a fresh connection (the follow's may be the one that dropped)."""
    req = base_request(node.host, "signal", txn=node.request.txn, signal=word, reason=reason)
    last: Exception | None = None
    for attempt in range(SIGNAL_TRIES):
        try:
            with connected(node.host) as agent:
                return cast(SignalAnswer, agent.call(req))
        except (ConnectError, ConnectionLost, RemoteError) as exc:
            last = exc
            time.sleep(min(2.0 * (attempt + 1), 15.0))
    raise ConnectError(f"{node.host.name}: cannot deliver {word!r}: {last}")


@dataclass
class Coordinator:
    nodes: Sequence[Node]
    hear: Hear
    deliver: Signal = signal
    follow: Follow = follow
    went: bool = False
    went_back: bool = False
    decided: Step | None = None
    reason: str = ""
    events: queue.Queue[tuple[int, Event | None]] = field(default_factory=queue.Queue)

    def run(self) -> None:
        """Start every node's transaction, then act on their events until every one has ended."""
        for node in self.nodes:
            threading.Thread(target=self._follow, args=(node,), daemon=True).start()
        while True:
            rank, event = self.events.get()
            self._take(self.nodes[rank], event)
            nxt = next_step([n.view for n in self.nodes], self.went, self.decided, self.went_back)
            if nxt.step is Step.DONE:
                return
            self._act(nxt)

    def _follow(self, node: Node) -> None:
        try:
            self.follow(node, lambda e: self.events.put((node.rank, e)))
        except (ConnectError, ConnectionLost, RemoteError) as exc:
            node.view = replace(node.view, lost=True, why=str(exc))
            self.events.put((node.rank, None))

    def _take(self, node: Node, event: Event | None) -> None:
        if event is None:
            return
        self.hear(node, event)
        vote = event.data.get("vote")
        if event.is_outcome:
            node.outcome = event
            outcome = Outcome.read(event.data.get("outcome")) or Outcome.AGENT_ERROR
            node.view = replace(node.view, outcome=outcome, why=node.view.why or event.message)
        elif vote == "stopped" and node.view.vote is Vote.STARTED:
            node.view = replace(node.view, vote=Vote.STOPPED)
        elif vote == "ready":
            node.view = replace(node.view, vote=Vote.READY)
        elif vote == "stopped_back":
            node.view = replace(node.view, back=True)
        elif vote == "failed":
            node.view = replace(node.view, vote=Vote.FAILED, why=event.message)

    def _act(self, nxt: Next) -> None:
        if nxt.step is Step.GO:
            self.went = True
            self._send_all("go", "")
        elif nxt.step is Step.GO_BACK:
            self.went_back = True
            self._send_all("go-back", "")
        elif nxt.step in (Step.COMMIT, Step.ABORT):
            self._decide(nxt.step, nxt.reason)

    def _decide(self, step: Step, reason: str) -> None:
        """Send the decision to every node; a node that cannot be told, or that already decided abort
        for itself (it waited too long), turns a commit into an abort for the nodes not told yet. A commit
        goes to rank 0 last: a rank >= 1 out of reach then leaves every node uncommitted, so the group
        goes back together (rank 1 rolls itself back when no word comes) instead of converging later."""
        self.decided, self.reason = step, reason
        order = [*self.nodes[1:], self.nodes[0]] if step is Step.COMMIT else list(self.nodes)
        for node in order:
            word = self.decided.value
            try:
                answer = self.deliver(node, word, self.reason)
            except ConnectError as exc:  # it rolls itself back when its wait runs out
                answer = {"decision": "abort", "reason": f"not reachable: {exc}"}
            if self.decided is Step.COMMIT and answer.get("decision") == "abort":
                self.decided = Step.ABORT
                self.reason = f"rank {node.rank} rolled back: {answer.get('reason', '')}"

    def _send_all(self, word: str, reason: str) -> None:
        for node in self.nodes:
            try:
                answer = self.deliver(node, word, reason)
            except ConnectError:
                continue  # its follow tells what became of it; without "go" it rolls itself back
            if answer.get("decision") == "abort" and not self.decided:
                self._decide(Step.ABORT, f"rank {node.rank}: {answer.get('reason', '')}")
                return


def converge(nodes: Sequence[Node], rollback: Callable[[Node, str], Event]) -> bool:
    """Every transaction ended: roll back the nodes that kept the new unit while another did not.
    Whether the group is now all on one side."""
    ranks = to_roll_back([n.view for n in nodes])
    ok = True
    for rank in ranks:
        node = nodes[rank]
        backup = node.outcome.data.get("backup") if node.outcome else None
        if not isinstance(backup, str):
            ok = False
            continue
        outcome = rollback(node, backup)
        result = Outcome.read(outcome.data.get("outcome"))
        node.view = replace(node.view, outcome=Outcome.ROLLED_BACK if result is Outcome.APPLIED else result)
        node.outcome = outcome
        ok = ok and result is Outcome.APPLIED
    return ok
