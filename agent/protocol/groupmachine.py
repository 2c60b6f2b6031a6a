"""Pure: the group change as a state machine, one node's steps and the coordinator's, each a function of
(state, what it saw) -> (new state, what to do). The node's transaction (host/roles/groupstep.py) and the
coordinator (group/run.py) ask it what to do next, so it lives below both; tests/pure/test_group_model.py
explores it exhaustively.

The rule that keeps a group on one generation whatever is lost:

- **Rank 0's decision file is the group's commit point.** deployctl claims "go" and the decision on rank 0
  first, and tells the other ranks only what stands there. Rank 0 may decide alone (its own abort when
  nothing came within wait_s): whatever it claims first is the group's word.
- **A rank >= 1 never decides against rank 0, and never starts a generation alone.** Without word it waits;
  when its own deadline passes while its new server still runs, rank 0 must have committed (had rank 0
  aborted, it would have stopped its new server by then and this rank's server with it), so it keeps the
  new unit. When its server stopped before any word, it stops its unit and ends in doubt, stopped, if no
  word comes: the next run reads rank 0's decision and takes it there.
- **Without a collective the deadline proves nothing.** The late commit above rests on a collective (a
  rank's server exits when a peer's stops: a [nodes] group). The members of a [pd] group share none (a
  decode keeps running when its prefill stops), so such a member (`collective` false) at its deadline stops
  and waits for the word like a held rank, and ends in doubt without one: it never commits alone.
- **No old start may meet a new one.** A node starts its old unit only on "go-back" (every rank said it
  stopped its new server, or ended), or, rank 0 only, when no "go" was ever taken. Otherwise it ends in
  doubt, stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Decision(str, Enum):
    """The group's word on its change: one writer wins it (host/roles/groupsignal.py Signals.claim)."""

    COMMIT = "commit"
    ABORT = "abort"


class Phase(str, Enum):
    STOPPING = "stopping"  # draining and stopping its old server
    STOPPED = "stopped"  # waiting for "go"
    STARTING = "starting"  # "go" came: its new server starts and is gated
    DECIDING = "deciding"  # voted ready: waiting for the decision
    HELD = "held"  # rank >= 1: its server stopped before any word: stopped, waiting for the word
    BACK = "back"  # rolling back: its new server stopped, waiting for "go-back"
    COMMITTED = "committed"  # ended on the new unit
    ROLLED_BACK = "rolled-back"  # ended on the old unit, started after every rank stopped its new one
    IN_DOUBT = "in-doubt"  # ended stopped, with its record: the next run takes it to rank 0's decision

    @property
    def ended(self) -> bool:
        return self in (Phase.COMMITTED, Phase.ROLLED_BACK, Phase.IN_DOUBT)


class Saw(str, Enum):
    """What a node's transaction saw."""

    STOPPED = "stopped"  # its old server stopped
    SIGNAL = "signal"  # a signal file changed
    READY = "ready"  # its start passed its gate
    FAILED = "failed"  # its start failed
    GONE = "gone"  # its new server stopped (a peer went away)
    DEADLINE = "deadline"  # its wait ran out (deadline_s)
    RECOVER = "recover"  # its agent died mid-change and a new one found the record
    RECOVER_LATE = "recover-late"  # the same, rank 0 after "go", once its own decision deadline had passed


class Do(str, Enum):
    START_NEW = "start-new"
    START_OLD = "start-old"
    STOP = "stop"
    VOTE_STOPPED = "vote-stopped"
    VOTE_READY = "vote-ready"
    VOTE_FAILED = "vote-failed"
    VOTE_BACK = "vote-back"  # it stopped its new server to roll back: waiting for "go-back"


@dataclass(frozen=True)
class Files:
    """A node's signal files (host/roles/groupsignal.py): durable, written by deployctl or the node."""

    go: bool = False
    go_back: bool = False
    decision: Decision | None = None
    by_node: bool = False

    def claim(self, decision: Decision, by_node: bool) -> Files:
        """First writer wins (a hard link in groupsignal.Signals.claim)."""
        return self if self.decision is not None else replace(self, decision=decision, by_node=by_node)


@dataclass(frozen=True)
class Node:
    rank: int
    phase: Phase = Phase.STOPPING
    files: Files = Files()
    collective: bool = True  # a rank's server exits when a peer's stops ([nodes]); false for [pd]


Step = tuple[Node, tuple[Do, ...]]


def deadline_s(node: Node, wait_s: float, start_bound_s: float) -> float:
    """How long a node waits in its phase before it acts alone. A rank >= 1 that voted ready waits longer
    than rank 0 can take to start, verify and decide (start_bound_s covers rank 0's start, gate, smoke
    test, the stop of its new server and the peers' exit): its server still running then is the
    evidence rank 0 committed."""
    if node.phase is Phase.DECIDING and node.rank >= 1:
        return wait_s + start_bound_s
    return wait_s


def node_step(node: Node, saw: Saw) -> Step:
    """One node's next state and actions for what it saw."""
    if saw in (Saw.RECOVER, Saw.RECOVER_LATE):
        return _recover(node, late=saw is Saw.RECOVER_LATE)
    if node.phase is Phase.STOPPING:
        return (replace(node, phase=Phase.STOPPED), (Do.VOTE_STOPPED,)) if saw is Saw.STOPPED else (node, ())
    if node.phase is Phase.STOPPED:
        return _stopped(node, saw)
    if node.phase is Phase.STARTING:
        return _starting(node, saw)
    if node.phase in (Phase.DECIDING, Phase.HELD):
        return _deciding(node, saw)
    if node.phase is Phase.BACK:
        return _back(node, saw)
    return node, ()


def _stopped(node: Node, saw: Saw) -> Step:
    files = node.files
    if saw is Saw.DEADLINE:
        files = files.claim(Decision.ABORT, by_node=True)
    if files.decision is Decision.ABORT:  # the group's word, or its own: it never started its new server
        if node.rank == 0 and not files.go:  # no rank took "go": no new server anywhere
            return replace(node, phase=Phase.ROLLED_BACK, files=files), (Do.START_OLD,)
        return replace(node, phase=Phase.BACK, files=files), (Do.VOTE_BACK,)
    if files.go:
        return replace(node, phase=Phase.STARTING, files=files), (Do.START_NEW,)
    return node, ()


def _starting(node: Node, saw: Saw) -> Step:
    if saw in (Saw.FAILED, Saw.GONE):
        files = node.files.claim(Decision.ABORT, by_node=True)
        if files.decision is Decision.COMMIT:  # cannot be: a commit needs this rank's ready vote
            return replace(node, phase=Phase.COMMITTED, files=files), ()
        return replace(node, phase=Phase.BACK, files=files), (Do.VOTE_FAILED, Do.STOP, Do.VOTE_BACK)
    if saw is Saw.READY:
        if node.files.decision is Decision.ABORT:
            return replace(node, phase=Phase.BACK), (Do.STOP, Do.VOTE_BACK)
        return replace(node, phase=Phase.DECIDING), (Do.VOTE_READY,)
    if saw is Saw.SIGNAL and node.files.decision is Decision.ABORT:
        # the group rolled back while it started: its start cannot complete without the peers that stop
        # now, and rank 0 waits for every rank's stop before any old unit starts
        return replace(node, phase=Phase.BACK), (Do.STOP, Do.VOTE_BACK)
    return node, ()


def _deciding(node: Node, saw: Saw) -> Step:
    files, held = node.files, node.phase is Phase.HELD
    if files.decision is None and saw is Saw.DEADLINE:
        if held:  # stopped, no word: never start either generation alone
            return replace(node, phase=Phase.IN_DOUBT), ()
        if node.rank >= 1 and not node.collective:  # its running server is no evidence of rank 0's commit
            return replace(node, phase=Phase.HELD), (Do.STOP,)
        # rank 0 decides alone; a rank >= 1 whose server outlived rank 0's decision keeps it (see above)
        files = files.claim(Decision.ABORT if node.rank == 0 else Decision.COMMIT, by_node=True)
    elif files.decision is None and saw is Saw.GONE and not held:
        if node.rank >= 1:  # rank 0 went away: its word is unknown here
            return replace(node, phase=Phase.HELD), (Do.STOP,)
        files = files.claim(Decision.ABORT, by_node=True)
    if files.decision is Decision.COMMIT:
        return replace(node, phase=Phase.COMMITTED, files=files), ((Do.START_NEW,) if held else ())
    if files.decision is Decision.ABORT:
        return replace(node, phase=Phase.BACK, files=files), (
            (Do.VOTE_BACK,) if held else (Do.STOP, Do.VOTE_BACK)
        )
    return node, ()


def _back(node: Node, saw: Saw) -> Step:
    if node.files.go_back:
        return replace(node, phase=Phase.ROLLED_BACK), (Do.START_OLD,)
    if saw is Saw.DEADLINE:  # a peer's new server may still run (or come back under Restart=)
        return replace(node, phase=Phase.IN_DOUBT), ()
    return node, ()


def _recover(node: Node, late: bool) -> Step:
    """A new agent found the record of a change whose agent died: keep what was committed; otherwise stop
    and wait for "go-back" like any rank that rolls back (never start the old unit alone). Rank 0 whose
    decision deadline passed while no agent could abort keeps the new unit: its peers take a server that
    outlived that deadline for rank 0's commit (a collective only)."""
    if node.phase.ended:
        return node, ()
    going = node.phase in (Phase.STARTING, Phase.DECIDING)
    # without a collective no peer took rank 0's running server for a commit: nothing to keep
    claim = Decision.COMMIT if late and going and node.rank == 0 and node.collective else Decision.ABORT
    files = node.files.claim(claim, by_node=True)
    if files.decision is Decision.COMMIT:
        return replace(node, phase=Phase.COMMITTED, files=files), (Do.START_NEW,)
    return replace(node, phase=Phase.BACK, files=files), (Do.STOP, Do.VOTE_BACK)


# -- the coordinator ------------------------------------------------------------------------------------


class Word(str, Enum):
    GO = "go"
    COMMIT = "commit"
    ABORT = "abort"
    GO_BACK = "go-back"


class Answer(str, Enum):
    """What a delivery of a word to one node came back with."""

    TOOK = "took"  # the word stands
    ABORTED = "aborted"  # the node's own abort stands
    COMMITTED = "committed"  # the node's own commit stands
    UNREACHABLE = "unreachable"  # no answer: the word may or may not have been written
    UNKNOWN = "unknown"  # the node does not run that transaction (`known: false`)


class Then(str, Enum):
    NEXT = "next"  # deliver to the next rank
    ABORT = "abort"  # turn the group's word into an abort, for every rank
    HOLD = "hold"  # tell no other rank anything: rank 0's word is unknown (the nodes' own rules apply)


def delivery_order(word: Word, nnodes: int) -> tuple[int, ...]:
    """Every word goes to rank 0 first: its files are the group's commit point."""
    return tuple(range(nnodes))


def after_answer(word: Word, rank: int, answer: Answer) -> Then:
    """What the coordinator does after one delivery."""
    if word is Word.GO_BACK:
        return Then.NEXT
    if word is Word.ABORT:  # rank 0 out of reach may keep its new unit (its late rule): tell no one else;
        # rank 0 that does not run the change (`known: false`) has no new unit to keep: the others go back
        kept = answer in (Answer.UNREACHABLE, Answer.COMMITTED)
        return Then.HOLD if rank == 0 and kept else Then.NEXT
    if answer is Answer.ABORTED:
        return Then.ABORT
    if word is Word.GO:  # nobody can commit once the coordinator aborts: abort is always safe before a commit
        return Then.NEXT if answer is Answer.TOOK else Then.ABORT
    if rank == 0:  # the commit point
        return Then.NEXT if answer in (Answer.TOOK, Answer.COMMITTED) else Then.HOLD
    return Then.NEXT  # a rank >= 1 that missed the commit keeps its new server (its deadline rule)


def answer_of(known: bool, reachable: bool, word: Word, decision: Decision | None, by_node: bool) -> Answer:
    """Read a `signal` verb's answer."""
    if not reachable:
        return Answer.UNREACHABLE
    if not known:
        return Answer.UNKNOWN
    if decision is Decision.ABORT and word is not Word.ABORT and by_node:
        return Answer.ABORTED
    if decision is Decision.ABORT and word is Word.COMMIT:
        return Answer.ABORTED
    if decision is Decision.COMMIT and word is Word.ABORT:
        return Answer.COMMITTED
    return Answer.TOOK
