"""A multi-node service in a fleet rollout: one host of the rollout (canary, batches, halt), its step one
coordinated change of every node (fake transactions, as in test_group_change.py), one result row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.errors import InventoryError
from agent.exitcodes import ExitCode
from agent.fleet import grouprun, hostrun
from agent.fleet.front import check_canary
from agent.fleet.grouprun import Drive, coordinate, group_result
from agent.fleet.inventory import all_hosts, group_hosts
from agent.fleet.results import FleetReport, HostResult, PlanFigures, RankResult, render_fleet
from agent.fleet.runner import forks_for
from agent.fleet.steps import Applied
from agent.group.run import Node
from agent.inventory import HostConfig, Ssh, load_host
from agent.protocol.events import Outcome
from agent.protocol.requests import Request
from tests.pure.test_group_change import FakeNode, fake_deliver, fake_follow, nodes_for, rollback, served
from tests.pure.test_group_node import BROKEN, NEW, OLD, node_unit

UNITS = Path(__file__).resolve().parents[2] / "units"
COLLECTIONS = Path(__file__).resolve().parents[2] / "agent/fleet"
NODES = '\n[nodes]\nothers = ["k2-b"]\ndist_init_addr = "10.0.0.1:20000"\n'
PLAN = PlanFigures(0.9, 64, 204_000, True, "calibrated", ("canary a",))


def _service(name: str, target: str, groups: str = '["g"]', extra: str = "") -> str:
    text = (UNITS / "ct200-sim.toml").read_text().replace('target = "ct200-sim"', f'target = "{target}"')
    return f"groups = {groups}\n{text}{extra}"


def _units(tmp_path: Path) -> Path:
    """A two-node service k2 (k2-a, k2-b) and two one-host services, a and b, all in group g."""
    (tmp_path / "k2.toml").write_text(_service("k2", "k2-a", extra=NODES))
    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text(_service(name, name))
    return tmp_path


def test_a_group_service_is_one_host_of_the_fleet(tmp_path: Path) -> None:
    units = _units(tmp_path)
    assert [h.name for h in all_hosts(units)] == ["a", "b", "k2"]  # k2 once, not once per node
    assert [h.name for h in group_hosts(units, "g")] == ["a", "b", "k2"]
    check_canary("g", 3, 3)  # the canary and the batches count services: three, not four hosts
    with pytest.raises(Exception, match="--canary 4 is more than the 3 hosts"):
        check_canary("g", 3, 4)
    assert forks_for(3, 1, "100%") == 2


def test_the_inventory_plugin_lists_a_group_service_once(tmp_path: Path) -> None:
    (tmp_path / "units").mkdir()
    _units(tmp_path / "units")
    (tmp_path / "fleet.deployctl.yml").write_text("plugin: deployctl.sglang.units\nunits_dir: units\n")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)}
    argv = [
        str(Path(sys.executable).with_name("ansible-inventory")),
        "-i",
        str(tmp_path / "fleet.deployctl.yml"),
    ]
    proc = subprocess.run([*argv, "--list"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    assert sorted(listing["g"]["hosts"]) == ["a", "b", "k2"]
    assert "k2-b" not in json.dumps(listing["_meta"]["hostvars"])


def test_a_one_host_service_on_a_node_of_a_group_is_checked_at_that_nodes_port(tmp_path: Path) -> None:
    ports = NODES + "ports = [30001]\n"
    (tmp_path / "k2.toml").write_text(_service("k2", "k2-a", extra=ports))
    other = _service("small", "k2-b").replace('name = "sglang.service"', 'name = "small.service"')
    other = other.replace("[gpus]", "[gpus]\nindices = [0]").replace("count = 8\n", "")
    (tmp_path / "small.toml").write_text(other.replace("tp-size = 8", "tp-size = 1"))
    # k2's rank 1 listens on 30001 on k2-b: small's 30000 there is free (it was refused before)
    with pytest.raises(InventoryError, match="both use GPU 0 on host 'k2-b'"):
        all_hosts(tmp_path)  # the GPU is shared, though: the next clash is still found
    (tmp_path / "k2.toml").write_text(
        _service("k2", "k2-a", extra=ports).replace("[gpus]", "[gpus]\nindices = [1, 2, 3, 4, 5, 6, 7, 8]")
        .replace("count = 8\n", "")
    )  # fmt: skip
    assert [h.name for h in all_hosts(tmp_path)] == ["k2", "small"]
    (tmp_path / "small.toml").write_text(
        other.replace("port = 30000", "port = 30001").replace("tp-size = 8", "tp-size = 1")
    )
    with pytest.raises(InventoryError, match="both listen on port 30001 on host 'k2-b'"):
        all_hosts(tmp_path)


def _group(tmp_path: Path, contexts: list[int]) -> tuple[list[Node], list[FakeNode]]:
    """Two fake nodes whose hosts say where they are (k2-a, k2-b)."""
    nodes, fakes = nodes_for(tmp_path, contexts)
    for node in nodes:
        node.host = HostConfig.model_construct(
            name=f"k2.rank{node.rank}", ssh=Ssh(target=f"k2-{'ab'[node.rank]}")
        )
    return nodes, fakes


def _applied() -> Applied:
    before = {"context-length": OLD, "mem-fraction-static": 0.85}
    return Applied("k2", NEW, PLAN, before, {"context-length": NEW, "mem-fraction-static": 0.9})


def _drive(fakes: list[FakeNode]) -> Drive:
    return Drive(fake_follow(fakes), fake_deliver(fakes), rollback(fakes))


def test_a_healthy_group_is_one_applied_row_with_rank_0s_figures(tmp_path: Path) -> None:
    nodes, fakes = _group(tmp_path, [NEW, NEW])
    phases: list[tuple[str, str]] = []
    run = coordinate(nodes, lambda phase, message: phases.append((phase, message)), _drive(fakes))
    result = group_result(_applied(), nodes, run, {})
    assert result.outcome == "applied" and not result.failed and result.failed_rank is None
    assert [(r.rank, r.target, r.outcome) for r in result.ranks] == [
        (0, "k2-a", "applied"),
        (1, "k2-b", "applied"),
    ]
    assert result.plan == PLAN and result.measured_pool == 210_000  # rank 0's start
    assert result.after["context-length"] == NEW and result.message.startswith("all 2 nodes applied")
    # A group refuses a one-node rollback: the way back is an apply of the old context.
    assert result.revert == f"deployctl apply k2 --context {OLD}" and result.backup is None
    assert all(r.backup for r in result.ranks)
    assert {p.split()[0] + " " + p.split()[1] for p, _ in phases} == {"rank 0", "rank 1"}


def test_a_rank_that_fails_rolls_the_group_back_and_is_named(tmp_path: Path) -> None:
    nodes, fakes = _group(tmp_path, [NEW, BROKEN])
    result = group_result(_applied(), nodes, coordinate(nodes, lambda p, m: None, _drive(fakes)), {})
    assert result.outcome == "rolled_back" and result.failed and not result.changed
    assert result.failed_rank == 1 and result.message.startswith(
        "every node is back on its old unit: rank 1 failed"
    )
    assert [r.outcome for r in result.ranks] == ["rolled_back", "rolled_back"]
    assert result.after == result.before and result.revert is None
    assert served(fakes[0]) == node_unit(OLD, 0) and served(fakes[1]) == node_unit(OLD, 1)


def test_a_group_whose_link_to_rank_1_drops_after_its_vote_ends_on_the_new_units(tmp_path: Path) -> None:
    nodes, fakes = _group(tmp_path, [NEW, NEW])
    drive = _drive(fakes)
    follow = drive.follow

    def cut_rank_1(node: Node, on_event: Any) -> object:  # the link to rank 1 drops once it voted ready
        def hear(event: Any) -> None:
            on_event(event)
            if node.rank == 1 and event.data.get("vote") == "ready":
                fakes[1].link_down = True

        return follow(node, hear)

    run = coordinate(nodes, lambda p, m: None, replace(drive, follow=cut_rank_1))
    result = group_result(_applied(), nodes, run, {})
    # rank 0 took the commit first (the group's commit point); rank 1, out of reach, kept its new unit once
    # its server outlived rank 0's own deadline
    assert result.outcome == "applied", result
    assert served(fakes[0]) == node_unit(NEW, 0) and served(fakes[1]) == node_unit(NEW, 1)


def test_a_lost_rank_is_rollback_failed_and_named() -> None:
    from agent.group.decide import Rank, Vote
    from agent.protocol.events import Event

    host = HostConfig.model_construct(name="x", ssh=Ssh(target="k2-a"))
    kept = Event("t", 1, "", "done", "outcome", "applied", {"outcome": "applied", "backup": "b.1"})
    nodes = [
        Node(0, host, None, Request("apply"), Rank(Vote.READY, Outcome.APPLIED), kept),
        Node(1, host.model_copy(update={"ssh": Ssh(target="k2-b")}), None, Request("apply"),
             Rank(Vote.READY, None, lost=True, why="ssh: timed out")),
    ]  # fmt: skip
    run = grouprun.GroupRun(Outcome.ROLLBACK_FAILED, "", kept)
    result = group_result(_applied(), nodes, run, {})
    assert result.outcome == "rollback_failed" and result.failed_rank == 1
    assert "rank 1 (k2-b): unknown" in result.message and "ssh: timed out" in result.message


def _group_result(outcome: str, failed_rank: int | None = None) -> HostResult:
    ranks = (RankResult(0, "k2-a", outcome, "m0", "u.bak.1"), RankResult(1, "k2-b", outcome, "m1", "u.bak.2"))
    return HostResult("k2", outcome, "every node is back on its old unit: rank 1 failed: OOM", NEW, PLAN,
                      before={"context-length": OLD}, ranks=ranks, failed_rank=failed_rank)  # fmt: skip


def test_a_failed_group_halts_the_rollout_as_one_host() -> None:
    failed = _group_result("rolled_back", failed_rank=1)
    report = FleetReport("g", ("k2", "a", "b"), {"k2": failed})
    assert report.halted and report.untouched == ["a", "b"] and report.exit_code() is ExitCode.ROLLED_BACK
    text = render_fleet(report)
    assert "nodes: rank 0 k2-a rolled_back, rank 1 k2-b rolled_back" in text
    assert "rank 1 failed: OOM" in text and "halted: a, b not touched" in text
    assert "1 of 3 hosts run" in text


def test_a_group_result_round_trips_through_its_event() -> None:
    result = _group_result("applied")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["ranks"][1] == {
        "rank": 1,
        "target": "k2-b",
        "outcome": "applied",
        "message": "m1",
        "backup": "u.bak.2",
    }
    assert data["revert"] == f"deployctl apply k2 --context {OLD}"
    assert HostResult.from_dict(data) == result


def test_a_fleet_rollback_of_a_group_is_refused_without_touching_it(tmp_path: Path) -> None:
    host = load_host("k2", _units(tmp_path))
    result = hostrun.rollback_host(host, None, lambda p, m: None)
    assert result.outcome == "error" and result.failed
    assert "one service over 2 nodes" in result.message and "nothing was changed" in result.message


class FakeAgent:
    """An agent that answers facts and records what it was sent."""

    def __init__(self, host: HostConfig, facts: dict[str, Any]) -> None:
        self.host, self.facts = host, facts

    def call(self, req: Request) -> dict[str, Any]:
        if req.verb == "compare":  # the node's own check, under its lock (agent/host/runner.py)
            assert req.group is None and req.unit_text is not None
            ASKED.append(self.host.ssh.target)
            return self.facts.get("compare", {"up_to_date": False, "message": "changes"})
        assert req.verb == "facts"
        return self.facts


ASKED: list[str] = []


def _facts(unit: str, active: str = "active") -> dict[str, Any]:
    sub = "running" if active == "active" else "failed"
    state = {"active_state": active, "sub_state": sub}
    return {"unit_text": unit, "state": state, "last_start": {"kv_tokens": 123_456}}


def _fake_nodes(monkeypatch: pytest.MonkeyPatch, module: Any, facts: dict[str, dict[str, Any]]) -> None:
    @contextmanager
    def connected(host: HostConfig) -> Iterator[FakeAgent]:
        yield FakeAgent(host, facts[host.ssh.target])

    monkeypatch.setattr(module, "connected", connected)


def test_a_group_step_plans_from_rank_0_and_sends_each_node_its_own_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = load_host("k2", _units(tmp_path))
    _fake_nodes(monkeypatch, grouprun, {"k2-a": _facts("old 0"), "k2-b": _facts("old 1")})
    sent: list[Node] = []

    def coordinate(nodes: list[Node], emit: Any, drive: Drive | None = None) -> grouprun.GroupRun:
        sent.extend(nodes)
        for node in nodes:
            node.view = replace(node.view, outcome=Outcome.APPLIED)
        return grouprun.GroupRun(Outcome.APPLIED, "", None)

    monkeypatch.setattr(grouprun, "coordinate", coordinate)
    result = hostrun.apply_host(host, 100_000, [], lambda p, m: None)
    assert result.outcome == "applied" and [r.target for r in result.ranks] == ["k2-a", "k2-b"]
    assert len({n.request.txn for n in sent}) == 1 and [n.request.group.rank for n in sent] == [0, 1]  # type: ignore[union-attr]
    for rank, node in enumerate(sent):
        assert f"--node-rank {rank}" in (node.request.unit_text or "")
        assert "--context-length 100000" in (node.request.unit_text or "")
    assert sent[0].request.planned_pool == sent[1].request.planned_pool == result.plan.predicted_pool  # type: ignore[union-attr]
    checked = hostrun.apply_host(host, 100_000, [], lambda p, m: None, check=True)
    assert checked.outcome == "would_change" and len(sent) == 2  # check mode sends nothing


def test_fleet_status_of_a_group_is_one_row_with_a_down_rank_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = load_host("k2", _units(tmp_path))
    _fake_nodes(monkeypatch, hostrun, {"k2-a": _facts("old 0"), "k2-b": _facts("old 1", active="failed")})
    status = hostrun.host_status(host, None)
    assert status["host"] == "k2" and status["reachable"] and status["nodes"] == 2
    assert status["active"] == "active" and status["measured_pool"] == 123_456 and status["drift"]
    assert status.get("warning", "").startswith("rank 1 (k2-b) not running while rank 0 runs")


@pytest.mark.parametrize("rotated", [False, True])
def test_a_rotated_secret_on_a_group_is_decided_by_each_nodes_agent_not_the_unit_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rotated: bool
) -> None:
    """Every node runs its rendered unit, byte for byte; the secret behind it was rotated on the laptop.
    Only the node's agent sees the secret files: its answer, not the unit's hash, says "nothing to do"."""
    host = load_host("k2", _units(tmp_path))
    sent: list[Node] = []

    def coordinate(nodes: list[Node], emit: Any, drive: Drive | None = None) -> grouprun.GroupRun:
        sent.extend(nodes)
        for node in nodes:
            node.view = replace(node.view, outcome=Outcome.APPLIED)
        return grouprun.GroupRun(Outcome.APPLIED, "", None)

    monkeypatch.setattr(grouprun, "coordinate", coordinate)
    _fake_nodes(monkeypatch, grouprun, {"k2-a": _facts("old 0"), "k2-b": _facts("old 1")})
    hostrun.apply_host(host, 100_000, [], lambda p, m: None)
    rendered = [n.request.unit_text or "" for n in sent]
    sent.clear()
    ASKED.clear()
    same = {"up_to_date": True, "message": "already up to date"}
    changed = {"up_to_date": False, "message": "the secret files differ"} if rotated else same
    facts = {
        "k2-a": {**_facts(rendered[0]), "compare": same},
        "k2-b": {**_facts(rendered[1]), "compare": changed},
    }
    _fake_nodes(monkeypatch, grouprun, facts)
    result = hostrun.apply_host(host, 100_000, [], lambda p, m: None)
    assert ASKED  # each node's agent was asked
    if rotated:
        assert result.outcome == "applied" and len(sent) == 2  # every node restarts with the new secret
    else:
        assert result.outcome == "up_to_date" and sent == []
