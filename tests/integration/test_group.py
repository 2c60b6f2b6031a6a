"""One simulated SGLang service over two test hosts (--nnodes 2): raised in one restart of both ranks, a
failure on rank 1 rolls both back, and status names a dead rank while rank 0 still answers /health."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import load_host
from agent.sglang.flags import parse_unit_flags
from tests import grouphosts
from tests.grouphosts import Group
from tests.helpers import wait_until
from tests.integration.conftest import DEPLOYCTL

pytestmark = pytest.mark.integration
CRASH_AT_200K = {"SGLANG_SIM_FAULT": "crash_loading", "SGLANG_SIM_FAULT_WHEN_CONTEXT": "200000"}


@pytest.fixture(scope="module")
def group() -> Iterator[Group]:
    from tests import testhost

    missing = testhost.missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    try:
        g = grouphosts.boot(2)
    except testhost.TestHostUnavailable as exc:
        pytest.skip(f"test host unavailable: {exc}")
    try:
        wait_for_group(g)
        yield g
    finally:
        g.stop()


def health(g: Group) -> int:
    port = load_host(grouphosts.NAME, g.units_dir).sglang.port
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return int(r.status)
    except OSError:
        return 0


def wait_for_group(g: Group) -> None:
    """Both ranks running and rank 0 serving (rank 0 starts once rank 1 joined its rendezvous)."""

    def up() -> bool:
        active = [g.systemctl(r, "is-active", "sglang.service") for r in range(len(g.nodes))]
        return health(g) == 200 and active == ["active"] * len(g.nodes)

    wait_until(up, timeout=240, interval=1)


def deployctl(g: Group, *args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [DEPLOYCTL, *args], env={**os.environ, **g.env}, capture_output=True, text=True, timeout=900
    )
    return proc.returncode, proc.stdout + proc.stderr


def apply_json(g: Group, context: str) -> tuple[int, dict[str, Any], str]:
    rc, text = deployctl(g, "apply", grouphosts.NAME, "--context", context, "--yes", "--json")
    lines = [json.loads(line) for line in text.splitlines() if line.startswith('{"host"')]
    return rc, (lines[-1] if lines else {}), text


def context_of(g: Group, rank: int) -> int:
    return int(parse_unit_flags(g.unit(rank))["context-length"])


def test_each_node_runs_in_a_control_group_of_its_own(group: Group) -> None:
    """As on real hosts: a shared group let one node's systemd stop the other's server (219/CGROUP)."""
    groups = [Path(f"/proc/{node.leader_pid}/cgroup").read_text() for node in group.nodes]
    assert groups[0] != groups[1], groups


def test_a_two_node_service_is_raised_in_one_restart_of_both_ranks(group: Group) -> None:
    before = [group.invocation(r) for r in range(2)]
    rc, report, text = apply_json(group, "150000")
    assert rc == 0 and report.get("outcome") == "applied", text + group.journals()
    after = [group.invocation(r) for r in range(2)]
    assert all(a != b for a, b in zip(after, before, strict=True))  # each rank restarted...
    assert [len(group.backups(r)) for r in range(2)] == [1, 1]  # ...once, with its own backup
    for rank in range(2):
        flags = parse_unit_flags(group.unit(rank))
        assert (flags["node-rank"], flags["nnodes"], flags["context-length"]) == (str(rank), "2", "150000")
    pools = [r["data"].get("summary", {}).get("kv_tokens") for r in report["ranks"]]
    assert all(p and p >= 150_000 for p in pools), pools  # every rank logged its own pool
    assert health(group) == 200


def test_a_failure_on_rank_1_rolls_both_ranks_back_and_says_so(group: Group) -> None:
    old = [group.unit(r) for r in range(2)]
    group.set_sim_env(1, CRASH_AT_200K)
    try:
        rc, report, text = apply_json(group, "200000")
    finally:
        group.set_sim_env(1, {})
    assert rc != 0 and report.get("outcome") == "rolled_back", text + group.journals()
    assert [group.unit(r) for r in range(2)] == old  # both units back as they were
    ranks = report["ranks"]
    assert [r["outcome"] for r in ranks] == ["rolled_back", "rolled_back"], ranks
    assert report["reason"].startswith("rank 1 (k2-b) failed"), report  # the cause, not rank 0's lost peer
    wait_for_group(group)  # the old service serves again


def test_rank_0_dying_before_its_rendezvous_rolls_both_ranks_back_in_time(group: Group) -> None:
    """Rank 0's new process dies before its first line: rank 1, waiting at a rendezvous no one will open,
    stops on the group's abort (not after its own silence bound), so rank 0 gets its go-back and both old
    units start again (before: rank 1 waited 210 s, rank 0 gave up at 120 s and the group stayed down)."""
    old = [group.unit(r) for r in range(2)]
    group.set_sim_env(0, {"SGLANG_SIM_FAULT": "exit_at_start", "SGLANG_SIM_FAULT_WHEN_CONTEXT": "180000"})
    try:
        rc, report, text = apply_json(group, "180000")
    finally:
        group.set_sim_env(0, {})
    assert rc != 0 and report.get("outcome") == "rolled_back", text + group.journals()
    assert [group.unit(r) for r in range(2)] == old
    ranks = report["ranks"]
    assert [r["outcome"] for r in ranks] == ["rolled_back", "rolled_back"], ranks
    assert "exit status 1" in ranks[0]["data"]["reason"], group.journals()  # how it ended, from systemd
    assert ranks[1]["data"]["failure_kind"] == "abandoned", ranks[1]
    assert report["reason"].startswith("rank 0 (k2-a) failed"), report
    wait_for_group(group)


def test_status_names_a_dead_rank_while_rank_0_still_answers(group: Group) -> None:
    group.systemctl(1, "kill", "-s", "KILL", "sglang.service")
    try:
        wait_until(lambda: group.systemctl(1, "is-active", "sglang.service") != "active", timeout=30)
        assert health(group) == 200  # no cross-node heartbeat: rank 0 does not notice
        rc, text = deployctl(group, "status", grouphosts.NAME)
        assert rc == 0 and "WARNING: rank 1 (k2-b) not running while rank 0 runs" in text, text
    finally:
        group.systemctl(0, "restart", "--no-block", "sglang.service")
        group.systemctl(1, "restart", "--no-block", "sglang.service")
        wait_for_group(group)
