"""A [pd] service's change as one group, with fakes: the coordinator (group/run.py) drives a real host
transaction per unit (fake systemd and journal, txnfakes.py) in waves: the prefills, then the decodes, then
the router. Each unit's start is gated on its own pool; a failure of any role rolls every unit back."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.group.decide import Rank, Vote, group_outcome, next_wave
from agent.group.run import Coordinator, Node, converge
from agent.inventory import HostConfig
from agent.protocol.events import Event, Outcome
from agent.protocol.requests import Group
from tests.pure.test_group_change import FakeNode, fake_deliver, fake_follow, rollback, served
from tests.pure.txnfakes import TXN, Host, Script, unit_text

OLD, NEW, BROKEN = 100_000, 200_000, 300_000
WAIT_S = 5.0
ROLES = ("prefill", "decode", "router")


def role_unit(context: int, role: str) -> str:
    return unit_text(context).replace("--model-path /m", f"--model-path /m --disaggregation-mode {role}")


def pd_group(tmp_path: Path, news: list[int]) -> tuple[list[Node], list[FakeNode]]:
    """One fake host per unit (prefill, decode, router-as-unit), each installed with its old unit."""
    fakes, nodes = [], []
    for rank, (role, new) in enumerate(zip(ROLES, news, strict=True)):
        host = Host(tmp_path / role, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
        host.install(host.etc, role_unit(OLD, role))
        req = host.request(new, unit_text=role_unit(new, role))
        req = replace(req, txn=TXN, group=Group(rank, len(news), WAIT_S), drain=False)
        fakes.append(FakeNode(host))
        nodes.append(Node(rank, HostConfig.model_construct(name=role), None, req))
    return nodes, fakes


def run_waves(nodes: list[Node], fakes: list[FakeNode]) -> list[tuple[str, str]]:
    """Run the group in waves (0, 1, 2); what each unit said of its start and its vote, in order."""
    said: list[tuple[str, str]] = []
    lock = threading.Lock()

    def hear(node: Node, event: Event) -> None:
        with lock:
            if event.message.startswith("every rank stopped: starting") and "old unit" not in event.message:
                said.append((ROLES[node.rank], "start"))
            elif event.data.get("vote") == "ready":
                said.append((ROLES[node.rank], "ready"))

    waves = tuple(range(len(nodes)))
    Coordinator(nodes, hear, deliver=fake_deliver(fakes), follow=fake_follow(fakes), waves=waves).run()
    return said


def test_prefill_is_ready_before_the_decode_starts_and_the_router_last(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    said = run_waves(nodes, fakes)
    assert said == [(role, what) for role in ROLES for what in ("start", "ready")]
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.APPLIED
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(NEW, role)


@pytest.mark.parametrize("broken", [0, 1, 2])
def test_any_role_that_fails_rolls_every_unit_and_the_router_back(tmp_path: Path, broken: int) -> None:
    news = [NEW, NEW, NEW]
    news[broken] = BROKEN
    nodes, fakes = pd_group(tmp_path, news)
    said = run_waves(nodes, fakes)
    converged = converge(nodes, rollback(fakes))
    assert group_outcome([n.view for n in nodes], converged) is Outcome.ROLLED_BACK
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(OLD, role)
    # no later wave started once a role failed
    assert not any(ROLES.index(role) > broken for role, what in said if what == "start")


def test_a_role_below_its_need_fails_its_gate_and_rolls_all_back(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    # the decode's need (max-running-requests x (context + reserved)) above what its start logs
    nodes[1].request = replace(nodes[1].request, target_context=500_000)
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.ROLLED_BACK
    assert "500,000" in nodes[1].view.why or "500000" in nodes[1].view.why
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(OLD, role)


votes = st.sampled_from(list(Vote))


@given(st.lists(st.tuples(votes, st.integers(0, 2)), min_size=1, max_size=6), st.integers(0, 3))
def test_a_wave_goes_only_after_every_earlier_wave_is_ready(ranks: list[tuple[Vote, int]], sent: int) -> None:
    views, waves = [Rank(v) for v, _ in ranks], [w for _, w in ranks]
    wave = next_wave(views, waves, sent)
    if wave is not None:
        assert wave == sent <= max(waves)
        assert all(v is Vote.READY for v, w in ranks if w < sent)
    elif sent <= max(waves):
        assert any(v is not Vote.READY for v, w in ranks if w < sent)


def test_no_waves_is_no_wave() -> None:
    assert next_wave([Rank(Vote.STOPPED)], [], 0) is None
    assert next_wave([Rank(Vote.READY), Rank(Vote.STOPPED)], [0, 1], 2) is None
