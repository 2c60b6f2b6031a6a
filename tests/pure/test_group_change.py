"""A multi-node change end to end with fakes: the coordinator (group/run.py) drives a real host transaction
per node (fake systemd and journal, txnfakes.py), and its signals go through the agent's own `signal` verb.
Each fault is one test: a rank that fails, a link that drops, a coordinator that goes away."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from agent.errors import ConnectError
from agent.group.decide import Rank, Step, Vote, first_cause, group_outcome, next_step, to_roll_back
from agent.group.run import Coordinator, Node, converge
from agent.host import verbs
from agent.host.roles.groupsignal import Signals
from agent.inventory import HostConfig
from agent.protocol.answers import SignalAnswer
from agent.protocol.events import Event, Outcome
from agent.protocol.groupmachine import Answer, Decision, Then, Word, after_answer
from agent.protocol.requests import Group, Request, Timeouts
from agent.remote.transport import ConnectionLost
from tests.pure.test_group_node import BROKEN, NEW, OLD, node_request, node_unit
from tests.pure.txnfakes import TXN, Host, Script

WAIT_S = 5.0  # generous: the coordinator runs in threads, a loaded machine must not make a node time out


@dataclass
class FakeNode:
    """One node: its fake host, and whether the link to it is down for signals."""

    host: Host
    link_down: bool = False

    def txn_dir(self, txn: str) -> Path:
        return self.host.root / "state" / "txn" / txn


def nodes_for(tmp_path: Path, contexts: list[int]) -> tuple[list[Node], list[FakeNode]]:
    fakes, nodes = [], []
    for rank, context in enumerate(contexts):
        host = Host(
            tmp_path / f"n{rank}", Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"})
        )
        host.install(host.etc, node_unit(OLD, rank))
        req = replace(node_request(host, context, rank), txn=TXN, group=Group(rank, len(contexts), WAIT_S))
        fakes.append(FakeNode(host))
        nodes.append(Node(rank, HostConfig.model_construct(name=f"n{rank}"), None, req))
    return nodes, fakes


def fake_follow(fakes: list[FakeNode]) -> Callable[[Node, Callable[[Event], None]], object]:
    """Run the node's transaction on its fake host, its events to the coordinator."""

    def follow(node: Node, on_event: Callable[[Event], None]) -> object:
        fake = fakes[node.rank]
        fake.txn_dir(TXN).mkdir(parents=True, exist_ok=True)
        (fake.txn_dir(TXN) / "request.json").write_text(node.request.to_json())  # as the runner does
        txn = fake.host.transaction(node.request)
        txn.group_start_bound_s = 1.0  # rank 0 of these fakes decides at once
        txn.log.listeners.append(on_event)
        result = txn.apply()
        data = {"outcome": result.outcome.value, **result.data}
        on_event(Event(TXN, 99, "", "done", "outcome", result.message, data))
        return None

    return follow


def fake_deliver(fakes: list[FakeNode]) -> Callable[[Node, str, str], SignalAnswer]:
    """A signal through the agent's own `signal` verb, unless the link to that node is down."""

    def deliver(node: Node, word: str, reason: str) -> SignalAnswer:
        if fakes[node.rank].link_down:
            raise ConnectError(f"{node.host.name}: connection refused")
        return verbs.signal(replace(node.request, verb="signal", signal=word, reason=reason, group=None))

    return deliver


def run_group(nodes: list[Node], fakes: list[FakeNode]) -> Coordinator:
    coordinator = Coordinator(
        nodes, lambda node, event: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes)
    )
    coordinator.run()
    return coordinator


def rollback(fakes: list[FakeNode]) -> Callable[[Node, str], Event]:
    def back(node: Node, backup: str) -> Event:
        req = replace(node.request, verb="rollback", backup=backup, group=None, txn=None)
        result = fakes[node.rank].host.transaction(req, txn="20261203T130000Z-abcdef").rollback()
        return Event("-", 0, "", "done", "outcome", result.message, {"outcome": result.outcome.value})

    return back


def served(fake: FakeNode) -> str:
    assert fake.host.systemd.active == "active"
    return fake.host.systemd.loaded


def test_two_healthy_ranks_are_raised_in_one_restart_each(tmp_path: Path) -> None:
    nodes, fakes = nodes_for(tmp_path, [NEW, NEW])
    run_group(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.APPLIED
    for rank, fake in enumerate(fakes):
        assert served(fake) == node_unit(NEW, rank)
        assert (fake.host.systemd.stops, fake.host.systemd.starts, fake.host.systemd.restarts) == (1, 1, 0)


def test_a_failure_on_rank_1_rolls_both_back_and_names_rank_1(tmp_path: Path) -> None:
    nodes, fakes = nodes_for(tmp_path, [NEW, BROKEN])
    run_group(nodes, fakes)
    converged = converge(nodes, rollback(fakes))
    assert group_outcome([n.view for n in nodes], converged) is Outcome.ROLLED_BACK
    assert served(fakes[0]) == node_unit(OLD, 0) and served(fakes[1]) == node_unit(OLD, 1)
    assert nodes[0].outcome is not None and "rank 1" in nodes[0].outcome.message
    assert "cuda_oom" in nodes[1].view.why or "OutOfMemory" in nodes[1].view.why


def test_a_commit_that_cannot_reach_rank_1_ends_with_both_on_the_new_units(tmp_path: Path) -> None:
    nodes, fakes = nodes_for(tmp_path, [NEW, NEW])

    def cut_when_ready(event: Event) -> None:  # the link to rank 1 drops once it voted ready
        if event.data.get("vote") == "ready":
            fakes[1].link_down = True

    run_with_hook(nodes, fakes, rank=1, hook=cut_when_ready)
    # the commit goes to rank 0 first (the commit point); rank 1, whose server outlived rank 0's own
    # deadline, keeps the new unit: both ranks run the same generation
    assert served(fakes[0]) == node_unit(NEW, 0) and served(fakes[1]) == node_unit(NEW, 1)
    assert nodes[0].view.outcome is Outcome.APPLIED and nodes[1].view.outcome is Outcome.APPLIED


def test_losing_rank_0_between_the_commits_does_not_split_the_group(tmp_path: Path) -> None:
    nodes, fakes = nodes_for(tmp_path, [NEW, NEW])
    through = fake_deliver(fakes)

    def deliver(node: Node, word: str, reason: str) -> SignalAnswer:
        answer = through(node, word, reason)
        if node.rank == 1 and word == "commit":  # rank 1 took "commit": the link to rank 0 drops
            fakes[0].link_down = True
        return answer

    Coordinator(nodes, lambda node, event: None, deliver=deliver, follow=fake_follow(fakes)).run()
    assert served(fakes[0]) == node_unit(NEW, 0) and served(fakes[1]) == node_unit(NEW, 1)


def run_with_hook(nodes: list[Node], fakes: list[FakeNode], rank: int, hook: Callable[[Event], None]) -> None:
    """run_group, with `hook` hearing every event of node `rank` first."""
    real_transaction = fakes[rank].host.transaction

    def transaction(req, txn=TXN):  # type: ignore[no-untyped-def]
        t = real_transaction(req, txn)
        t.log.listeners.append(hook)
        return t

    fakes[rank].host.transaction = transaction  # type: ignore[method-assign]
    run_group(nodes, fakes)


def test_rank_0_that_gave_up_before_the_commit_turns_it_into_an_abort(tmp_path: Path) -> None:
    nodes, fakes = nodes_for(tmp_path, [NEW, NEW])
    # rank 0 claimed its own abort (it waited too long) just before the coordinator decides: the commit
    # goes to rank 0 first, reads its abort, and every rank goes back (a rank >= 1 never aborts once ready)
    run_with_hook(
        nodes, fakes, rank=0,
        hook=lambda e: e.data.get("vote") == "ready" and verbs.signal(
            replace(nodes[0].request, verb="signal", signal="abort", reason="no decision in time", group=None)
        ),
    )  # fmt: skip
    converged = converge(nodes, rollback(fakes))
    assert converged and group_outcome([n.view for n in nodes], converged) is Outcome.ROLLED_BACK
    assert served(fakes[0]) == node_unit(OLD, 0) and served(fakes[1]) == node_unit(OLD, 1)


def test_a_node_whose_follow_is_lost_is_in_doubt_not_rolled_back_blindly() -> None:
    ranks = [Rank(Vote.READY, Outcome.APPLIED), Rank(Vote.READY, None, lost=True)]
    assert to_roll_back(ranks) == ()  # rank 0 restarted alone could meet rank 1's other generation
    assert to_roll_back([Rank(Vote.READY, Outcome.APPLIED), Rank(Vote.FAILED, Outcome.ROLLED_BACK)]) == (0,)
    assert group_outcome(ranks, converged=False) is Outcome.ROLLBACK_FAILED


@pytest.mark.parametrize(
    ("ranks", "went", "step"),
    [
        ([Rank(Vote.STOPPED), Rank(Vote.STARTED)], False, Step.WAIT),  # rank 1 still draining or stopping
        ([Rank(Vote.STOPPED), Rank(Vote.STOPPED)], False, Step.GO),
        ([Rank(Vote.READY), Rank(Vote.STOPPED)], True, Step.WAIT),
        ([Rank(Vote.READY), Rank(Vote.READY)], True, Step.COMMIT),
        ([Rank(Vote.READY), Rank(Vote.FAILED, why="OOM")], True, Step.ABORT),
        ([Rank(Vote.STARTED, Outcome.ERROR, why="locked"), Rank(Vote.STOPPED)], False, Step.ABORT),
        ([Rank(Vote.STOPPED), Rank(lost=True)], False, Step.ABORT),
        # its agent died mid-start; the next one stopped its new server: roll the group back
        ([Rank(Vote.READY), Rank(Vote.STOPPED, back=True)], True, Step.ABORT),
    ],
)
def test_next_step(ranks: list[Rank], went: bool, step: Step) -> None:
    assert next_step(ranks, went, None).step is step


def test_the_abort_names_the_rank_and_why() -> None:
    nxt = next_step([Rank(Vote.READY), Rank(Vote.FAILED, why="SGLang failed (cuda_oom)")], True, None)
    assert nxt.reason == "rank 1 failed: SGLang failed (cuda_oom)"


def test_signal_verb_on_an_unknown_transaction_changes_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path, Script())
    req = replace(host.request(NEW), verb="signal", signal="commit", txn=TXN)
    assert verbs.signal(req) == {"known": False, "go": False, "decision": None}
    assert not (tmp_path / "state" / "txn").exists()


def test_request_json_round_trips_the_group(tmp_path: Path) -> None:
    host = Host(tmp_path, Script())
    req = replace(node_request(host, NEW, 1), timeouts=Timeouts())
    back = Request.from_json(req.to_json())
    assert back.group == Group(1, 2, 0.4) and json.loads(req.to_json())["group"]["rank"] == 1


def test_the_rank_that_failed_on_its_own_is_named_not_the_one_that_lost_its_peer() -> None:
    gloo = "SGLang failed: RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:4"
    ranks = [Rank(Vote.FAILED, why=gloo), Rank(Vote.FAILED, why="SGLang failed (crash): weights corrupt")]
    assert first_cause(ranks) == (1, "SGLang failed (crash): weights corrupt")
    assert first_cause([Rank(Vote.FAILED, why=gloo), Rank(Vote.READY)]) == (0, gloo)
    assert first_cause([Rank(Vote.READY), Rank(Vote.READY)]) is None


def test_go_back_waits_for_every_rank_that_rolls_back_to_stop_its_new_server() -> None:
    stopping = [Rank(Vote.READY, back=True), Rank(Vote.READY)]  # rank 1 still running its new server
    assert next_step(stopping, True, Step.ABORT).step is Step.WAIT
    stopped = [Rank(Vote.READY, back=True), Rank(Vote.FAILED, back=True)]
    assert next_step(stopped, True, Step.ABORT).step is Step.GO_BACK
    assert next_step(stopped, True, Step.ABORT, went_back=True).step is Step.WAIT
    ended = [Rank(Vote.READY, back=True), Rank(Vote.STARTED, Outcome.ERROR)]  # refused: nothing to stop
    assert next_step(ended, True, Step.ABORT).step is Step.GO_BACK


def pure_nodes(n: int) -> list[Node]:
    host = HostConfig.model_construct(name="n")
    return [Node(r, host, None, Request("apply", txn=TXN, group=Group(r, n, WAIT_S))) for r in range(n)]


def test_a_follow_thread_that_dies_of_a_bug_does_not_block_the_coordinator() -> None:
    def follow(node: Node, on_event: Callable[[Event], None]) -> object:
        if node.rank == 1:
            raise ValueError("a bug")
        on_event(Event(TXN, 1, "", "done", "outcome", "refused", {"outcome": "error"}))
        return None

    coordinator = Coordinator(pure_nodes(2), lambda n, e: None, deliver=lambda n, w, r: {}, follow=follow)
    thread = threading.Thread(target=coordinator.run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()  # it ended: rank 1 is named lost, with the bug
    assert "a bug" in coordinator.nodes[1].view.why


def test_a_node_that_does_not_run_the_transaction_is_an_error_not_a_delivery() -> None:
    nodes = pure_nodes(2)
    decided = threading.Event()

    def follow(node: Node, on_event: Callable[[Event], None]) -> object:
        on_event(Event(TXN, 1, "", "group", "step", "stopped", {"vote": "stopped"}))
        decided.wait(10)
        on_event(Event(TXN, 2, "", "done", "outcome", "back", {"outcome": "rolled_back"}))
        return None

    def deliver(node: Node, word: str, reason: str) -> SignalAnswer:
        if word == "abort":
            decided.set()
        return {"known": False, "go": False, "decision": None}  # a re-run's id the nodes never saw

    coordinator = Coordinator(nodes, lambda n, e: None, deliver=deliver, follow=follow)
    coordinator.run()
    assert coordinator.decided is Step.ABORT and "does not run transaction" in coordinator.reason


def test_the_recover_run_that_finishes_a_dead_node_s_change_is_a_valid_request() -> None:
    """A dead group node's runner is finished by a `recover` run; with the group kept in its request that
    run was refused at once ("only apply runs as a node of a group") and the follower started another one
    every 2 s for ever, never reaching the coordinator."""
    from agent.host.runner import recover_request

    node = Request("apply", txn=TXN, group=Group(1, 2, WAIT_S), unit_text="[Service]\nExecStart=/bin/true\n")
    rec = recover_request(node, TXN)
    assert (rec.verb, rec.txn, rec.group, rec.died) == ("recover", None, None, TXN)
    Request.from_json(rec.to_json())  # validates


def test_an_outcome_a_re_attach_found_already_written_is_the_node_s_outcome() -> None:
    """A link dropped at rank 0's commit: the re-attach reads its outcome from the host's status and
    returns it (no event stream is left to carry it). The coordinator took that for "its follow ended
    without an outcome" and reported the group rolled back in doubt (exit 5) while both ranks ran new."""

    committed = threading.Event()

    def follow(node: Node, on_event: Callable[[Event], None]) -> object:
        on_event(Event(TXN, 1, "", "group", "step", "stopped", {"vote": "stopped"}))
        on_event(Event(TXN, 2, "", "group", "step", "ready", {"vote": "ready"}))
        committed.wait(10)
        applied = Event(TXN, 9, "", "done", "outcome", "committed", {"outcome": "applied"})
        if node.rank == 0:
            return applied  # the link dropped: found by the re-attach
        on_event(applied)
        return applied

    def deliver(node: Node, word: str, reason: str) -> SignalAnswer:
        if word == "commit" and node.rank == 1:
            committed.set()
        return {"known": True, "go": True, "decision": "commit" if word == "commit" else None}

    coordinator = Coordinator(pure_nodes(2), lambda n, e: None, deliver=deliver, follow=follow)
    thread = threading.Thread(target=coordinator.run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [n.view.outcome for n in coordinator.nodes] == [Outcome.APPLIED, Outcome.APPLIED]
    assert not any(n.view.lost for n in coordinator.nodes)


def test_a_lost_rank_the_commit_missed_is_told_until_its_own_deadline() -> None:
    """The link to rank 1 was down longer than its follow re-attaches: the commit did not reach it and
    its follow was given up. The coordinator keeps telling it (within the rank's own deadline, after
    which it decides alone) instead of leaving it to wait for minutes: once the link is back it is told."""
    tries: list[str] = []

    def follow(node: Node, on_event: Callable[[Event], None]) -> object:
        on_event(Event(TXN, 1, "", "group", "step", "stopped", {"vote": "stopped"}))
        on_event(Event(TXN, 2, "", "group", "step", "ready", {"vote": "ready"}))
        if node.rank == 1:
            first_try.wait(10)  # the link dropped as the commit went out: its follow is given up
            raise ConnectionLost("the link is down")
        told_0.wait(10)
        on_event(Event(TXN, 9, "", "done", "outcome", "committed", {"outcome": "applied"}))
        return None

    told_0, first_try = threading.Event(), threading.Event()

    def deliver(node: Node, word: str, reason: str) -> SignalAnswer:
        if node.rank == 0:
            if word == "commit":
                told_0.set()
        elif word == "commit" and tries.count("down") < 4:
            tries.append("down")
            first_try.set()
            raise ConnectError("unreachable")
        else:
            tries.append(word)
        return {"known": True, "go": True, "decision": "commit" if word == "commit" else None}

    pauses: list[float] = []
    coordinator = Coordinator(
        pure_nodes(2), lambda n, e: None, deliver=deliver, follow=follow, pause=pauses.append
    )
    thread = threading.Thread(target=coordinator.run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert tries.count("down") == 4 and tries[-1] == "commit"  # told once the link came back
    assert coordinator.untold == set() and len(pauses) == 3


def ended_in_doubt_after_rank_0_committed(tmp_path: Path) -> tuple[list[Node], list[FakeNode]]:
    """Rank 0 committed and kept its new unit; rank 1 stopped before any word reached it and ended in doubt
    (its transaction folder is there: its record waits for its next recovery)."""
    nodes, fakes = nodes_for(tmp_path, [NEW, NEW])
    for node, fake in zip(nodes, fakes, strict=True):
        fake.txn_dir(TXN).mkdir(parents=True, exist_ok=True)
        (fake.txn_dir(TXN) / "request.json").write_text(node.request.to_json())
    Signals(fakes[0].txn_dir(TXN)).claim(Decision.COMMIT, "every rank ready", "deployctl")
    nodes[0].view = Rank(Vote.READY, Outcome.APPLIED)
    nodes[0].outcome = Event(TXN, 9, "", "done", "outcome", "applied", {"outcome": "applied", "backup": "b0"})
    nodes[1].view = Rank(Vote.READY, Outcome.ROLLBACK_FAILED, why="rank 1 in doubt")
    return nodes, fakes


def test_converge_never_rolls_back_toward_a_rank_in_doubt_that_holds_the_commit(tmp_path: Path) -> None:
    """The commit reached rank 1's folder after it ended in doubt (the coordinator retold it). Rolling
    rank 0 back alone left two generations: rank 1's next recovery reads the commit and starts its new
    unit against rank 0's old one. Converge claims the abort there first; a commit that stands holds it."""
    nodes, fakes = ended_in_doubt_after_rank_0_committed(tmp_path)
    Signals(fakes[1].txn_dir(TXN)).claim(Decision.COMMIT, "retold", "deployctl")
    rolled: list[int] = []

    def back(node: Node, backup: str) -> Event:
        rolled.append(node.rank)
        return Event("-", 0, "", "done", "outcome", "", {"outcome": "applied"})

    converged = converge(nodes, back, fake_deliver(fakes))
    assert not converged and rolled == []
    assert group_outcome([n.view for n in nodes], converged) is Outcome.ROLLBACK_FAILED
    stands = Signals(fakes[1].txn_dir(TXN)).decided()
    assert stands is not None and stands.decision is Decision.COMMIT  # its recovery takes it to rank 0's side


@pytest.mark.parametrize("link_down", [False, True])
def test_converge_claims_the_abort_at_a_rank_in_doubt_before_rolling_rank_0_back(
    tmp_path: Path, link_down: bool
) -> None:
    nodes, fakes = ended_in_doubt_after_rank_0_committed(tmp_path)
    fakes[1].link_down = link_down
    rolled: list[int] = []

    def back(node: Node, backup: str) -> Event:
        stands = Signals(fakes[1].txn_dir(TXN)).decided()
        assert stands is not None and stands.decision is Decision.ABORT  # claimed before any rollback
        rolled.append(node.rank)
        return Event("-", 0, "", "done", "outcome", "", {"outcome": "applied"})

    converged = converge(nodes, back, fake_deliver(fakes))
    # no answer from rank 1: whether a commit stands there is unknown, so nothing is rolled back
    assert (converged, rolled) == ((False, []) if link_down else (True, [0]))


def test_rank_0_that_refused_the_change_does_not_hold_the_others_abort() -> None:
    """Rank 0 answers `known: false` (it refused: locked by another run): it has no new unit to keep, so the
    abort goes on to the others and their go-back follows; it held every other rank stopped, in doubt."""
    assert after_answer(Word.ABORT, 0, Answer.UNKNOWN) is Then.NEXT
    assert after_answer(Word.ABORT, 0, Answer.UNREACHABLE) is Then.HOLD
    assert after_answer(Word.ABORT, 0, Answer.COMMITTED) is Then.HOLD


def test_converge_never_rolls_back_several_ranks_one_by_one(tmp_path: Path) -> None:
    """Ranks 0 and 1 kept the new unit (rank 0 recovered late, rank 1 by its deadline rule), rank 2 went
    back: rolled back one at a time, rank 0's old start met rank 1's new server at the rendezvous (the model
    check's 3-rank schedule). Nothing is rolled back and the group is reported in doubt."""
    applied = Rank(Vote.READY, Outcome.APPLIED)
    ranks = [applied, applied, Rank(Vote.FAILED, Outcome.ROLLED_BACK)]
    assert to_roll_back(ranks) == ()
    nodes = pure_nodes(3)
    for node, view in zip(nodes, ranks, strict=True):
        node.view = view
    rolled: list[int] = []

    def back(node: Node, backup: str) -> Event:
        rolled.append(node.rank)
        return Event("-", 0, "", "done", "outcome", "", {"outcome": "applied"})

    converged = converge(
        nodes, back, lambda node, word, reason: {"known": False, "go": False, "decision": None}
    )
    assert (converged, rolled) == (False, [])
    assert group_outcome([n.view for n in nodes], converged) is Outcome.ROLLBACK_FAILED
