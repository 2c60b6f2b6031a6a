"""[nodes]: one service over several hosts, read into one inventory per node; and what status says."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import InventoryError
from agent.group.nodes import node_hosts
from agent.group.status import down_ranks, warning
from agent.inventory import load_service
from agent.protocol.answers import UnitStateData

BASE = """
[ssh]
target = "k2-a"
[gpus]
count = 8
memory_gib = 80
[model]
path = "/models/Kimi-K2"
[sglang]
port = 30000
[sglang.flags]
tp-size = 16
"""
NODES = """
[nodes]
others = ["k2-b", "k2-c"]
dist_init_addr = "10.0.0.1:20000"
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / f"{name}.toml").write_text(text)
    return tmp_path


def test_each_node_gets_the_same_flags_with_its_own_rank_and_only_rank_0_is_checked_over_http(
    tmp_path: Path,
) -> None:
    host = load_service("k2", write(tmp_path, "k2", BASE + NODES))
    nodes = node_hosts(host)
    assert [n.ssh.target for n in nodes] == ["k2-a", "k2-b", "k2-c"]
    for rank, node in enumerate(nodes):
        assert node.sglang.flags == {
            "tp-size": 16, "nnodes": 3, "node-rank": rank, "dist-init-addr": "10.0.0.1:20000"
        }  # fmt: skip
        assert node.smoke.enabled is (rank == 0) and node.drain.enabled is (rank == 0)
        assert node.drain.timeout_s == host.drain.timeout_s  # the same TimeoutStopSec on every node


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ('[nodes]\nothers = ["k2-a"]\ndist_init_addr = "10.0.0.1:20000"\n', "which is node rank 0"),
        ('[nodes]\nothers = ["b", "b"]\ndist_init_addr = "10.0.0.1:20000"\n', "names a node twice"),
        ('[nodes]\nothers = ["b"]\ndist_init_addr = "10.0.0.1"\n', "HOST:PORT"),
        ('[nodes]\nothers = ["b"]\ndist_init_addr = "10.0.0.1:70000"\n', "HOST:PORT"),
        ('[nodes]\nothers = []\ndist_init_addr = "10.0.0.1:2"\n', "others"),
        ('[nodes]\nothers = ["b"]\nports = [1, 2]\ndist_init_addr = "h:2"\n', "2 given for 1 nodes"),
    ],
)
def test_a_bad_nodes_section_is_refused_in_one_line(tmp_path: Path, extra: str, said: str) -> None:
    with pytest.raises(InventoryError, match=said):
        load_service("k2", write(tmp_path, "k2", BASE + extra))


def test_node_flags_written_by_hand_are_refused(tmp_path: Path) -> None:
    text = BASE.replace("tp-size = 16", "tp-size = 16\nnode-rank = 0") + NODES
    with pytest.raises(InventoryError, match=r"sglang\.flags\.node-rank: \[nodes\] sets it"):
        load_service("k2", write(tmp_path, "k2", text))


def test_a_service_on_a_node_of_a_group_clashes_with_it(tmp_path: Path) -> None:
    write(tmp_path, "k2", BASE + NODES)
    other = BASE.replace('target = "k2-a"', 'target = "k2-c"').replace(
        "[sglang.flags]", '[unit]\nname = "x.service"\n[sglang.flags]'
    )
    write(tmp_path, "small", other)
    with pytest.raises(InventoryError, match="both listen on port 30000 on host 'k2-c'"):
        load_service("small", tmp_path)


def state(active: str, sub: str) -> UnitStateData:
    return {"active_state": active, "sub_state": sub}  # type: ignore[typeddict-item]


def test_status_names_a_dead_rank_while_rank_0_runs(tmp_path: Path) -> None:
    host = load_service("k2", write(tmp_path, "k2", BASE + NODES))
    states = [state("active", "running"), state("failed", "failed"), state("active", "running")]
    assert down_ranks(states) == [1]
    said = warning(host, states)
    assert said is not None and said.startswith("rank 1 (k2-b) not running while rank 0 runs")
    assert warning(host, [state("active", "running")] * 3) is None
    assert down_ranks([state("inactive", "dead"), state("active", "running")]) == []  # all down: no group


def test_the_weight_cache_in_a_group_is_refused_up_front_in_one_line(tmp_path: Path) -> None:
    """A group's change runs no daemon on its nodes: refused before any host is reached, exit 2."""
    from tests.pure.test_first_hour import run_cli

    units = write(tmp_path, "k2", BASE + NODES + "[weight_cache]\nenabled = true\n")
    with pytest.raises(InventoryError, match=r"weight_cache\.enabled: not with \[nodes\]"):
        load_service("k2", units)
    for argv in (("apply", "k2", "--context", "100k", "--yes"), ("plan", "k2", "--context", "100k")):
        code, _out, err = run_cli(*argv, units=units)
        assert code == 2 and "weight_cache.enabled: not with [nodes]" in err, err
        assert len([line for line in err.splitlines() if ": error: " in line]) == 1, err
    assert load_service("k2", write(tmp_path, "k2", BASE + NODES)).nodes is not None  # without it: read
