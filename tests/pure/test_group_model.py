"""The group change, model-checked: every interleaving of 2 and 3 nodes' steps
(agent/protocol/groupmachine.py), the coordinator's (agent/group/decide.py next_step, groupmachine's delivery
rules) and the faults: the laptop dying, each link dropping (and coming back or not), each node's agent killed
or its host rebooted, any deadline passing before a signal arrives. A breadth-first search over every
reachable world, with a visited set, asserts in every state that no two ranks run different generations, and
in every end state that no node waits for a word no live party can send, that each node's lock time stays
within LOCK_BOUND, and that every node's end is named.

The physics it assumes (docs/topologies.md): a rank >= 1's new server exits once rank 0's new server
stops (SGLang's shutdown broadcast; Restart= then brings it back to wait at the rendezvous, so it still
counts as a new server); a start is ready only when every rank runs the new generation; a rebooted node
of a change not yet committed comes back stopped; a rank >= 1's decision deadline (wait_s + start bound)
passes only after rank 0's own deadline and after any peer exit that rank 0's stop causes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum

import pytest

from agent.group.decide import Rank, Step, Vote, next_step
from agent.protocol import Outcome
from agent.protocol.groupmachine import (
    Answer,
    Decision,
    Do,
    Files,
    Node,
    Phase,
    Saw,
    Then,
    Word,
    after_answer,
    answer_of,
    delivery_order,
    node_step,
)


class Gen(str, Enum):
    NONE = "none"
    OLD = "old"
    NEW = "new"


class Link(str, Enum):
    UP = "up"
    DOWN = "down"
    BACK = "back"  # dropped once, up again


# The bound on one agent's lock, in phases: stopping (drain + stop: D), stopped (W = wait_s), starting
# (S = the start's own bound), deciding (W, or W + S for a rank >= 1), held (W), back (W).
COST = {
    Phase.STOPPING: (0, 0, 1), Phase.STOPPED: (1, 0, 0), Phase.STARTING: (0, 1, 0), Phase.DECIDING: (1, 0, 0),
    Phase.HELD: (1, 0, 0), Phase.BACK: (1, 0, 0),
}  # fmt: skip
LOCK_BOUND = (4, 2, 1)  # lock <= D + 4 W + 2 S (docs/topologies.md)


@dataclass(frozen=True)
class World:
    nodes: tuple[Node, ...]
    gen: tuple[Gen, ...]  # what each node's server runs
    gone: tuple[bool, ...]  # its new server exited since it started (a peer went away)
    agent: tuple[bool, ...]  # its transaction's agent is alive
    late: tuple[bool, ...]  # rank 0's decision deadline passed while its agent was dead
    link: tuple[Link, ...]
    votes: tuple[Rank, ...]  # what each node said (its event log, durable)
    views: tuple[Rank, ...]  # what the coordinator has heard
    laptop: bool = True
    went: bool = False
    decided: Step | None = None
    went_back: bool = False
    sending: tuple[Word, int] | None = None  # a word on its way, and the index of the next rank in order
    held: bool = False  # rank 0's word unknown: the coordinator tells no one anything more
    faults: int = 0


def wr(w: World, **changes: object) -> World:
    """dataclasses.replace for World, without its checks (the search calls it millions of times)."""
    new = object.__new__(World)
    new.__dict__.update(w.__dict__)
    new.__dict__.update(changes)
    return new


def start(n: int) -> World:
    return World(
        nodes=tuple(Node(r) for r in range(n)), gen=(Gen.OLD,) * n, gone=(False,) * n, agent=(True,) * n,
        late=(False,) * n, link=(Link.UP,) * n, votes=(Rank(),) * n, views=(Rank(),) * n,
    )  # fmt: skip


def put(t: tuple, i: int, v: object) -> tuple:  # type: ignore[type-arg]
    return (*t[:i], v, *t[i + 1 :])


def vote_of(node: Node, done: tuple[Do, ...], was: Rank) -> Rank:
    vote = was
    for do in done:
        if do is Do.VOTE_STOPPED and vote.vote is Vote.STARTED:
            vote = replace(vote, vote=Vote.STOPPED)
        elif do is Do.VOTE_READY:
            vote = replace(vote, vote=Vote.READY)
        elif do is Do.VOTE_FAILED:
            vote = replace(vote, vote=Vote.FAILED)
        elif do is Do.VOTE_BACK:
            vote = replace(vote, back=True)
    if node.phase.ended:
        ended = {Phase.COMMITTED: Outcome.APPLIED, Phase.ROLLED_BACK: Outcome.ROLLED_BACK}
        vote = replace(vote, outcome=ended.get(node.phase, Outcome.ROLLBACK_FAILED))
    return vote


def set_gen(w: World, i: int, gen: Gen) -> World:
    """Node i's server now runs gen; rank 0's new server stopping ends every peer's new one."""
    was = w.gen[i]
    w = wr(w, gen=put(w.gen, i, gen), gone=put(w.gone, i, False) if gen is Gen.NEW else w.gone)
    if was is Gen.NEW and gen is not Gen.NEW:
        gone = tuple(
            g or (r != i and w.gen[r] is Gen.NEW and (i == 0 or r == 0)) for r, g in enumerate(w.gone)
        )
        w = wr(w, gone=gone)
    return w


def step_node(w: World, i: int, saw: Saw) -> World:
    node, done = node_step(w.nodes[i], saw)
    if node == w.nodes[i] and not done:
        return w
    w = wr(w, nodes=put(w.nodes, i, node), votes=put(w.votes, i, vote_of(node, done, w.votes[i])))
    for do in done:
        if do in (Do.START_NEW, Do.START_OLD, Do.STOP):
            w = set_gen(w, i, {Do.START_NEW: Gen.NEW, Do.START_OLD: Gen.OLD, Do.STOP: Gen.NONE}[do])
    return w


def node_moves(w: World, i: int) -> Iterator[World]:
    node = w.nodes[i]
    if not w.agent[i]:
        if i == 0 and not w.late[0] and node.phase in (Phase.STARTING, Phase.DECIDING):
            yield wr(w, late=put(w.late, 0, True))  # its clock runs on
        return
    phase = node.phase
    if phase is Phase.STOPPING:
        yield step_node(set_gen(w, i, Gen.NONE), i, Saw.STOPPED)
    if phase in (Phase.STOPPED, Phase.DECIDING, Phase.HELD, Phase.BACK):
        yield step_node(w, i, Saw.SIGNAL)
        # a rank >= 1's deadline comes after rank 0's, and after the exit rank 0's stop causes
        later = phase is Phase.DECIDING and i >= 1
        if not later or (rank0_decided(w) and not w.gone[i]):
            yield step_node(w, i, Saw.DEADLINE)
    if phase is Phase.STARTING:
        yield step_node(w, i, Saw.SIGNAL)  # the group's abort ends its start (its watch polls the files)
        if all(g is Gen.NEW for g in w.gen) and not w.gone[i]:
            yield step_node(w, i, Saw.READY)
        yield step_node(w, i, Saw.FAILED)
    if phase in (Phase.STARTING, Phase.DECIDING) and w.gone[i]:
        yield step_node(wr(w, gone=put(w.gone, i, False)), i, Saw.GONE)


def rank0_decided(w: World) -> bool:
    """A rank >= 1's deadline comes after rank 0's: rank 0 has decided by then, or could not (no agent)."""
    return (
        w.nodes[0].phase not in (Phase.STOPPING, Phase.STOPPED, Phase.STARTING, Phase.DECIDING) or w.late[0]
    )


def deliver(w: World, i: int, word: Word, written: bool) -> tuple[World, Answer]:
    node = w.nodes[i]
    files = node.files
    if written:
        if word is Word.GO:
            files = replace(files, go=True)
        elif word is Word.GO_BACK:
            files = replace(files, go_back=True)
        else:
            files = files.claim(Decision(word.value), by_node=False)
        w = wr(w, nodes=put(w.nodes, i, replace(node, files=files)))
    reachable = written and w.link[i] is not Link.DOWN
    return w, answer_of(True, reachable, word, files.decision, files.by_node)


def coordinator_moves(w: World) -> Iterator[World]:
    if not w.laptop:
        return
    n = len(w.nodes)
    for i in range(n):  # give up following a node out of reach; re-attach to one whose agent died
        if w.link[i] is Link.DOWN and not w.views[i].lost:
            yield wr(w, views=put(w.views, i, replace(w.views[i], lost=True, why="lost")))
        if w.link[i] is not Link.DOWN and not w.agent[i] and not w.views[i].lost:  # re-attach: recover
            late = Saw.RECOVER_LATE if i == 0 and w.late[0] else Saw.RECOVER
            yield step_node(wr(w, agent=put(w.agent, i, True)), i, late)
    if w.sending is not None:
        yield from send_moves(w)
    elif not w.held:
        nxt = next_step(w.views, w.went, w.decided, w.went_back)
        if nxt.step in (Step.GO, Step.GO_BACK, Step.COMMIT, Step.ABORT):
            yield begin(w, Word(nxt.step.value))


def begin(w: World, word: Word) -> World:
    w = wr(w, sending=(word, 0))
    if word is Word.GO:
        return wr(w, went=True)
    if word is Word.GO_BACK:
        return wr(w, went_back=True)
    return wr(w, decided=Step(word.value))


def send_moves(w: World) -> Iterator[World]:
    assert w.sending is not None
    word, k = w.sending
    order = delivery_order(word, len(w.nodes))
    i = order[k]
    for written in (True, False) if w.link[i] is Link.DOWN else (True,):
        w2, answer = deliver(w, i, word, written)
        then = after_answer(word, i, answer)
        if then is Then.NEXT:
            yield wr(w2, sending=(word, k + 1) if k + 1 < len(order) else None)
        elif then is Then.ABORT:
            yield (begin(wr(w2, sending=None), Word.ABORT) if w.decided is None else wr(w2, sending=None))
        else:
            yield wr(w2, sending=None, held=True)


def fault_moves(w: World, max_faults: int) -> Iterator[World]:
    if w.faults >= max_faults:
        return
    f = wr(w, faults=w.faults + 1)
    if w.laptop:
        yield wr(f, laptop=False)
    for i in range(len(w.nodes)):
        if w.link[i] is Link.UP:
            yield wr(f, link=put(w.link, i, Link.DOWN))
        if w.link[i] is Link.DOWN:
            yield wr(f, link=put(w.link, i, Link.BACK))
        if w.agent[i] and not w.nodes[i].phase.ended:
            yield wr(f, agent=put(w.agent, i, False))  # killed: its server runs on under systemd
            yield reboot(f, i)


def reboot(w: World, i: int) -> World:
    """The host restarts: agent gone; a committed unit starts at boot, anything else stays stopped."""
    w = wr(w, agent=put(w.agent, i, False))
    node = w.nodes[i]
    if node.phase.ended:
        return w
    committed = node.files.decision is Decision.COMMIT and node.phase in (Phase.DECIDING, Phase.COMMITTED)
    return set_gen(w, i, Gen.NEW if committed and w.gen[i] is Gen.NEW else Gen.NONE)


def heard(w: World) -> World:
    """The coordinator hears a reachable node's events as they happen (its follow); a link that is down
    delays them (and may be given up on: lost)."""
    if not w.laptop:
        return w
    views = tuple(
        w.votes[i] if w.link[i] is not Link.DOWN and not v.lost else v for i, v in enumerate(w.views)
    )
    return w if views == w.views else wr(w, views=views)


def moves(w: World, max_faults: int) -> list[World]:
    out = [m for i in range(len(w.nodes)) for m in node_moves(w, i)]
    out += list(coordinator_moves(w)) + list(fault_moves(w, max_faults))
    return [h for h in map(heard, out) if h != w]


def mixed(w: World) -> bool:
    return Gen.OLD in w.gen and Gen.NEW in w.gen


def end_ok(w: World) -> str | None:
    """Why this end state breaks a promise, or None."""
    for i, node in enumerate(w.nodes):
        if w.agent[i] and not node.phase.ended:
            return f"rank {i} waits in {node.phase.value} with nothing left to wake it"
    return None


def explore(n: int, max_faults: int) -> tuple[int, int, dict[str, int]]:
    """Every reachable world; (states, end states, how the ends are named)."""
    first = start(n)
    seen, todo, ends = {first}, deque([first]), 0
    named: dict[str, int] = {}
    while todo:
        w = todo.popleft()
        assert not mixed(w), f"ranks run different generations: {w}"
        nxt = moves(w, max_faults)
        if not nxt:
            ends += 1
            why = end_ok(w)
            assert why is None, f"{why}: {w}"
            name = ",".join(n.phase.value if w.agent[r] else "agent-died" for r, n in enumerate(w.nodes))
            named[name] = named.get(name, 0) + 1
        for m in nxt:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return len(seen), ends, named


@pytest.mark.parametrize(("n", "max_faults"), [(2, 2), (3, 1)])
def test_the_group_never_runs_two_generations_whatever_is_lost(n: int, max_faults: int) -> None:
    states, ends, named = explore(n, max_faults)
    print(
        f"\n{n} ranks, up to {max_faults} faults: {states:,} states, {ends:,} end states, {len(named)} ends"
    )
    assert states > 1000 and ends > 10
    assert "committed," * (n - 1) + "committed" in named  # with nothing lost it commits


def longest_lock(node: Node, rank: int) -> tuple[int, int, int]:
    """The most lock time one agent can spend from this node state on, over every input and every file
    deployctl may write meanwhile (the node machine alone: its phases form no cycle)."""
    cost = COST.get(node.phase, (0, 0, 0))
    if node.phase is Phase.DECIDING and rank >= 1:
        cost = (cost[0], cost[1] + 1, cost[2])
    best = (0, 0, 0)
    for files in writes(node):
        for saw in Saw:
            if saw in (Saw.RECOVER, Saw.RECOVER_LATE):
                continue  # a new agent: a new lock, which starts at the recovery (BACK: W)
            nxt, _ = node_step(replace(node, files=files), saw)
            if nxt.phase is not node.phase:
                best = max(best, longest_lock(nxt, rank), key=sum)
    return tuple(a + b for a, b in zip(cost, best, strict=True))  # type: ignore[return-value]


def writes(node: Node) -> list[Files]:
    f = node.files
    out = [f, replace(f, go=True), replace(f, go_back=True)]
    return out + [f.claim(d, by_node=False) for d in Decision]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_node_holds_its_lock_at_most_d_plus_4w_plus_2s(rank: int) -> None:
    spent = longest_lock(Node(rank), rank)
    assert all(a <= b for a, b in zip(spent, LOCK_BOUND, strict=True)), spent
    print(f"\nrank {rank}: lock <= {spent[2]} D + {spent[0]} W + {spent[1]} S")
