"""A change of a multi-node service: one transaction per node, coordinated from here.

Each node's agent runs its own transaction (backup, write, stop, then wait); this side follows every
node's events in a thread, sends "go" once every rank stopped, and commit or abort once every rank voted
(agent/group/decide.py decides). A signal is a file the node's transaction reads (host/roles/groupsignal.py),
delivered over a fresh connection, so a dropped link delays it but loses nothing; a node that hears
nothing in [nodes] wait_s rolls itself back. At the end, the one node that kept the new unit while the
others went back is rolled back too, once the abort stands at every other node (converge).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from agent.errors import ConnectError, RemoteError
from agent.group.decide import (
    Rank,
    Step,
    Vote,
    may_roll_back,
    next_step,
    next_wave,
    one_side,
    to_revoke,
    to_roll_back,
)
from agent.inventory import HostConfig
from agent.protocol.answers import SignalAnswer
from agent.protocol.events import Event, Outcome
from agent.protocol.groupmachine import Answer, Decision, Then, Word, after_answer, answer_of, delivery_order
from agent.protocol.grouprecord import GroupRecord
from agent.protocol.requests import Request
from agent.remote.client import AgentClient, base_request
from agent.remote.follow import Watch, connected
from agent.remote.follow import follow as follow_transaction
from agent.remote.transport import ConnectionLost

SIGNAL_TRIES = 6  # over about a minute: a link that stays down longer leaves it to the node's own wait
RETELL_PAUSE_S = 10.0  # between rounds of telling a lost rank the decision


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
    held: bool = False  # rank 0's word unknown: nothing more is sent (each node's own rules apply)
    untold: set[int] = field(
        default_factory=set
    )  # ranks >= 1 the decision did not reach: told once they speak
    decided: Step | None = None
    reason: str = ""
    events: queue.Queue[tuple[int, Event | None]] = field(default_factory=queue.Queue)
    clock: Callable[[], float] = time.monotonic
    pause: Callable[[float], None] = time.sleep
    # each rank's wave ([pd]: prefills 0, decodes 1, the router 2); empty: "go" to every rank at once
    waves: tuple[int, ...] = ()
    sent_waves: int = 0

    def run(self) -> None:
        """Start every node's transaction, then act on their events until every one has ended."""
        for node in self.nodes:
            threading.Thread(target=self._follow, args=(node,), daemon=True).start()
        while True:
            rank, event = self.events.get()
            self._take(self.nodes[rank], event)
            if event is not None and rank in self.untold:  # its link is back: the decision reaches it now
                self._retell(rank)
            nxt = next_step([n.view for n in self.nodes], self.went, self.decided, self.went_back)
            if nxt.step is Step.DONE:
                self._retell_the_lost()
                return
            if nxt.step is Step.GO and self.waves:
                self._go_wave()
            elif nxt.step is not Step.WAIT and not self.held:
                self._send(Word(nxt.step.value), nxt.reason)

    def _follow(self, node: Node) -> None:
        """Pass on a node's events; however it ends, it queues something, so the loop never waits on it."""
        ended: list[Event] = []

        def on_event(event: Event) -> None:
            if event.is_outcome:
                ended.append(event)
            self.events.put((node.rank, event))

        try:
            last = self.follow(node, on_event)
            if not ended and isinstance(last, Event) and last.is_outcome:
                on_event(last)  # a re-attach found it already written: returned, not streamed
        except (ConnectError, ConnectionLost, RemoteError) as exc:
            node.view = replace(node.view, lost=True, why=str(exc))
        except Exception as exc:  # a bug here must not leave the coordinator waiting for ever
            node.view = replace(node.view, lost=True, why=f"following it failed: {exc!r}")
        finally:
            if not ended and not node.view.lost:
                node.view = replace(node.view, lost=True, why="its follow ended without an outcome")
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

    def _go_wave(self) -> None:
        """ "go" to the next wave once the waves before it are ready (decide.next_wave); "went" once the last
        wave has it. A wave that has not had "go" waits stopped, as every rank does before any "go"."""
        wave = next_wave([n.view for n in self.nodes], self.waves, self.sent_waves)
        if wave is None or self.held:
            return
        self.sent_waves = wave + 1
        ranks = tuple(r for r, w in enumerate(self.waves) if w == wave)
        self._send(Word.GO, f"wave {wave}", ranks, last=self.sent_waves > max(self.waves))

    def _send(self, word: Word, reason: str, only: tuple[int, ...] = (), last: bool = True) -> None:
        """Deliver a word rank by rank, rank 0 first (its files are the group's commit point), and do what
        the group machine says after each answer (protocol/groupmachine.py after_answer)."""
        if word is Word.GO:
            self.went = last
        elif word is Word.GO_BACK:
            self.went_back = True
        else:
            self.decided, self.reason = Step(word.value), reason
        for rank in delivery_order(word, len(self.nodes)):
            if only and rank not in only:
                continue
            answer, why = self._deliver(self.nodes[rank], word)
            if answer is Answer.UNREACHABLE and rank >= 1 and word in (Word.COMMIT, Word.ABORT):
                self.untold.add(rank)
            then = after_answer(word, rank, answer)
            if then is Then.HOLD:
                self.held = True
                self.reason = f"rank 0's decision is unknown ({why}): each node follows its own rule"
                return
            if then is Then.ABORT:
                self._send(Word.ABORT, f"rank {rank}: {why}")
                return

    def _retell_the_lost(self) -> None:
        """A rank the decision missed and whose follow was lost waits for it until its own deadline (its
        vote + wait_s + the start bound), then decides alone: keep telling it until then, so a link that
        comes back within that bound ends the change at once, as decided."""
        lost = [r for r in sorted(self.untold) if self.nodes[r].view.outcome is None]
        for rank in lost:
            group = GroupRecord.of(self.nodes[rank].request)
            assert group is not None
            deadline = self.clock() + group.horizon_s  # how long a ready rank waits before deciding alone
            while rank in self.untold and self.clock() < deadline:
                self._retell(rank)
                if rank in self.untold:
                    self.pause(RETELL_PAUSE_S)

    def _retell(self, rank: int) -> None:
        assert self.decided is not None
        answer, _ = self._deliver(self.nodes[rank], Word(self.decided.value))
        if answer is not Answer.UNREACHABLE:
            self.untold.discard(rank)

    def _deliver(self, node: Node, word: Word) -> tuple[Answer, str]:
        return delivered(self.deliver, node, word, self.reason)


def delivered(deliver: Signal, node: Node, word: Word, reason: str) -> tuple[Answer, str]:
    """One delivery and the machine's reading of its answer; `known: false` is an error: the node does not
    run this transaction."""
    try:
        got = deliver(node, word.value, reason)
    except ConnectError as exc:
        return Answer.UNREACHABLE, f"not reachable: {exc}"
    stands = got.get("decision")
    answer = answer_of(
        bool(got.get("known")), True, word, Decision(stands) if stands else None, got.get("by") == "node"
    )
    if answer is Answer.UNKNOWN:
        return answer, f"rank {node.rank} does not run transaction {node.request.txn}"
    return answer, str(got.get("reason", ""))


def converge(nodes: Sequence[Node], rollback: Callable[[Node, str], Event], deliver: Signal = signal) -> bool:
    """Every transaction ended: roll back the node that kept the new unit while the others did not, once the
    abort stands at every other node (decide.to_revoke: a node in doubt may hold the commit, and its next
    recovery would start the new unit). Whether the group is now all on one side."""
    ranks = to_roll_back([n.view for n in nodes])
    if not ranks:  # nothing to roll back, or nothing that may be: on one side, or left as it is
        return one_side([n.view for n in nodes])
    for rank in to_revoke([n.view for n in nodes]):
        answer, _ = delivered(
            deliver, nodes[rank], Word.ABORT, "converging: the group goes back to its old units"
        )
        if not may_roll_back((answer,)):  # a commit stands there, or no answer: leave every rank as it is
            return False
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
