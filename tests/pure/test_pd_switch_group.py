"""A [pd] member switched in place (host/roles/pdswitch.py), with fakes: the coordinator drives real host
transactions (fake systemd and journal, txnfakes.py) and a fake SGLang `POST /pd_role_switch`. A switch
that SGLang takes restarts nothing and writes the new unit with a backup; a refused one (safe to restore)
restarts the unit on its new unit instead; a broken one, or any member failing after the switch, rolls the
group back and restarts the switched unit on its old unit."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.group.decide import group_outcome
from agent.group.run import Coordinator, Node, converge
from agent.inventory import HostConfig
from agent.protocol.events import Event, Outcome
from agent.protocol.requests import Group
from tests.pure.test_group_change import FakeNode, fake_deliver, fake_follow, rollback
from tests.pure.test_pd_group import NEW, OLD, WAIT_S, role_unit
from tests.pure.txnfakes import TXN, Host, Script

PEER = "http://127.0.0.1:30021"
OK = {"success": True, "message": "ok", "old_role": "prefill", "new_role": "decode", "safe_to_restore": False}
BUSY = {"success": False, "message": "instance is not idle; drain all requests before switching",
        "old_role": "prefill", "new_role": "decode", "safe_to_restore": True}  # fmt: skip
UNHEALTHY = {"success": False, "message": "role switch failed; instance unhealthy, restart required: boom",
             "old_role": "prefill", "new_role": "decode", "safe_to_restore": False}  # fmt: skip


@dataclass
class FakeSwitch:
    """SGLang's endpoint: `reply` to every switch; the decode peer's measured graph memory."""

    reply: tuple[int, object] = (200, OK)
    graph: float | None = 0.25
    bodies: list[dict[str, object]] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)

    def __call__(self, host: str, port: int, api_key: str | None, admin_key: str | None) -> FakeSwitch:
        return self

    def switch(self, body: dict[str, object]) -> tuple[int, object]:
        self.bodies.append(body)
        return self.reply

    def graph_gb(self, peer_url: str) -> float | None:
        self.peers.append(peer_url)
        return self.graph


def switch_group(tmp_path: Path, sglang: FakeSwitch, other: int = NEW) -> tuple[list[Node], list[FakeNode]]:
    """Rank 0: a prefill restarted on a new unit (wave 0); rank 1: a prefill whose role alone changes,
    switched to decode (wave 1), its need the pool its running start logged."""
    script = Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"})
    a = Host(tmp_path / "prefill", script)
    a.install(a.etc, role_unit(OLD, "prefill"))
    b = Host(tmp_path / "switch", script, role_switch=sglang)
    b.install(b.etc, role_unit(OLD, "prefill"))
    reqs = [
        a.request(other, unit_text=role_unit(other, "prefill")),
        replace(b.request(OLD, unit_text=role_unit(OLD, "decode")), pd_switch_role="decode",
                pd_switch_graph_url=PEER),
    ]  # fmt: skip
    nodes = [
        Node(rank, HostConfig.model_construct(name=name), None,
             replace(req, txn=TXN, group=Group(rank, 2, WAIT_S, collective=False), drain=False))
        for rank, (name, req) in enumerate(zip(("prefill", "switch"), reqs, strict=True))
    ]  # fmt: skip
    return nodes, [FakeNode(a), FakeNode(b)]


def run(nodes: list[Node], fakes: list[FakeNode]) -> tuple[Outcome, list[str]]:
    said: list[str] = []
    lock = threading.Lock()

    def hear(node: Node, event: Event) -> None:
        with lock:
            said.append(f"{node.host.name}: {event.message}")

    Coordinator(nodes, hear, deliver=fake_deliver(fakes), follow=fake_follow(fakes), waves=(0, 1)).run()
    return group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))), said


def jobs(fake: FakeNode) -> tuple[int, int, int]:
    sd = fake.host.systemd
    return sd.stops, sd.starts, sd.restarts


def installed(fake: FakeNode) -> str:
    return (fake.host.etc / "sglang.service").read_text()


def test_a_switch_restarts_nothing_and_writes_the_new_role_with_a_backup(tmp_path: Path) -> None:
    sglang = FakeSwitch()
    nodes, fakes = switch_group(tmp_path, sglang)
    invocation = fakes[1].host.systemd.invocation
    outcome, said = run(nodes, fakes)
    assert outcome is Outcome.APPLIED, said
    assert sglang.bodies == [{"new_role": "decode", "decode_cuda_graph_memory_gb": 0.25}]
    assert sglang.peers == [PEER]
    assert jobs(fakes[1]) == (0, 0, 0) and fakes[1].host.systemd.invocation == invocation
    assert installed(fakes[1]) == role_unit(OLD, "decode")  # a later restart keeps the new role
    backups = list(fakes[1].host.etc.glob("sglang.service.*"))
    assert [b.read_text() for b in backups] == [role_unit(OLD, "prefill")]
    assert nodes[1].outcome is not None and "switched to decode without a restart" in nodes[1].outcome.message
    assert jobs(fakes[0]) == (1, 1, 0)  # the other member restarted as any


def test_a_refused_switch_restarts_the_unit_on_its_new_unit(tmp_path: Path) -> None:
    nodes, fakes = switch_group(tmp_path, FakeSwitch(reply=(400, BUSY)))
    outcome, said = run(nodes, fakes)
    assert outcome is Outcome.APPLIED, said
    assert jobs(fakes[1]) == (1, 1, 0)
    assert fakes[1].host.systemd.loaded == role_unit(OLD, "decode")
    assert any("SGLang refused the switch to decode (instance is not idle" in line for line in said)


def test_a_switch_that_leaves_the_server_unhealthy_rolls_the_group_back(tmp_path: Path) -> None:
    nodes, fakes = switch_group(tmp_path, FakeSwitch(reply=(400, UNHEALTHY)))
    outcome, said = run(nodes, fakes)
    assert outcome is Outcome.ROLLED_BACK, said
    assert "instance unhealthy, restart required: boom" in nodes[1].view.why
    for fake in fakes:  # both back on their old unit, the switched one restarted on it
        assert fake.host.systemd.active == "active" and fake.host.systemd.loaded == role_unit(OLD, "prefill")
        assert installed(fake) == role_unit(OLD, "prefill")
    assert jobs(fakes[1])[1] >= 1


def test_no_answer_at_all_is_a_broken_server(tmp_path: Path) -> None:
    nodes, fakes = switch_group(tmp_path, FakeSwitch(reply=(502, "Bad Gateway")))
    outcome, _ = run(nodes, fakes)
    assert outcome is Outcome.ROLLED_BACK
    assert fakes[1].host.systemd.loaded == role_unit(OLD, "prefill")


def test_a_peer_failing_after_the_switch_restarts_the_switched_unit_on_its_old_role(tmp_path: Path) -> None:
    """The switch went through before the group aborted (rank 0's start crashes): the switched server
    runs the new role while its restored unit says the old one, so it is restarted on that unit."""
    sglang = FakeSwitch()
    nodes, fakes = switch_group(tmp_path, sglang, other=300_000)
    outcome, said = run(nodes, fakes)
    assert outcome is Outcome.ROLLED_BACK, said
    assert len(sglang.bodies) == 1
    assert fakes[1].host.systemd.loaded == role_unit(OLD, "prefill") and installed(fakes[1]) == role_unit(
        OLD, "prefill"
    )
    assert jobs(fakes[1])[1] + jobs(fakes[1])[2] >= 1  # restarted, not only its file put back


def test_a_switched_pool_short_of_the_new_roles_need_fails(tmp_path: Path) -> None:
    nodes, fakes = switch_group(tmp_path, FakeSwitch())
    nodes[1].request = replace(nodes[1].request, target_context=500_000)
    outcome, _ = run(nodes, fakes)
    assert outcome is Outcome.ROLLED_BACK
    assert "short of its new role's need of 500,000" in nodes[1].view.why


def rotated(tmp_path: Path, pool: int | None) -> tuple[list[Node], list[FakeNode]]:
    """The switched unit's start logged its pool, then its journal lost it (rotated, vacuumed); its
    /server_info says max_total_num_tokens=pool (None: not at all)."""
    nodes, fakes = switch_group(tmp_path, FakeSwitch())
    fakes[1].host.systemd.lines.clear()
    fakes[1].host.probe.info = {} if pool is None else {"max_total_num_tokens": pool}
    return nodes, fakes


def test_a_switched_pool_the_journal_lost_is_read_from_server_info(tmp_path: Path) -> None:
    nodes, fakes = rotated(tmp_path, 110_000)
    outcome, said = run(nodes, fakes)
    assert outcome is Outcome.APPLIED, said
    assert "server_info" in fakes[1].host.probe.asked
    nodes, fakes = rotated(tmp_path / "short", 90_000)
    nodes[1].request = replace(nodes[1].request, target_context=100_000)
    outcome, _ = run(nodes, fakes)
    assert outcome is Outcome.ROLLED_BACK
    assert "KV pool of 90,000 tokens is short of its new role's need of 100,000" in nodes[1].view.why


def test_a_switched_pool_known_nowhere_fails_the_member(tmp_path: Path) -> None:
    nodes, fakes = rotated(tmp_path, None)
    outcome, _ = run(nodes, fakes)
    assert outcome is Outcome.ROLLED_BACK
    assert "its KV pool is unknown" in nodes[1].view.why
