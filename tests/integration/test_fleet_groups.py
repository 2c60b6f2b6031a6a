"""deployctl fleet with a multi-node service among one-host services: the group is one host of the rollout.

Needs multi-node test hosts from tests/grouphosts.py: `boot_mixed_fleet()` returning an object with
`env` (DEPLOYCTL_UNITS and the SSH config for the CLI), `unit(target) -> bytes` (the installed
sglang.service of a node or host) and `set_sim_env(target, values)` (the simulated server's environment on
that node), whose units folder holds, in group "mixed": `pair.toml`, a two-node service on targets
"pair-0" (rank 0) and "pair-1", and `solo.toml`, a one-host service on target "solo", all at context
32768 and started. Skipped until that module provides it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from agent.sglang.flags import parse_unit_flags
from tests import testhost
from tests.integration.conftest import DEPLOYCTL

pytestmark = pytest.mark.integration
CRASH_AT_200K = {"SGLANG_SIM_FAULT": "crash_loading", "SGLANG_SIM_FAULT_WHEN_CONTEXT": "200000"}


@pytest.fixture(scope="module")
def mixed() -> Iterator[Any]:
    grouphosts = pytest.importorskip("tests.grouphosts")
    boot = getattr(grouphosts, "boot_mixed_fleet", None)
    if boot is None:
        pytest.skip("tests.grouphosts has no boot_mixed_fleet() yet")
    missing = testhost.missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    f = boot()
    try:
        yield f
    finally:
        f.stop()


def fleet_cli(f: Any, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [DEPLOYCTL, "fleet", *args, "--json"], env={**os.environ, **f.env}, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    report = next((e for e in lines if e.get("kind") == "report" or "hosts" in e), {})
    return proc.returncode, report, proc.stdout + proc.stderr


def context_of(f: Any, target: str) -> object:
    return dict(parse_unit_flags(f.unit(target).decode())).get("context-length")


def test_a_failing_rank_of_the_canary_group_halts_before_the_other_service(mixed: Any) -> None:
    mixed.set_sim_env("pair-1", CRASH_AT_200K)
    solo_before = mixed.unit("solo")
    try:
        rc, report, output = fleet_cli(mixed, "apply", "mixed", "--context", "200k", "--canary", "1", "--yes")
    finally:
        mixed.set_sim_env("pair-1", {})
    assert rc == 4, output
    (pair,) = report["hosts"]  # the canary is the whole pair; solo was never touched
    assert pair["host"] == "pair" and pair["outcome"] == "rolled_back" and pair["failed_rank"] == 1, output
    assert [r["outcome"] for r in pair["ranks"]] == ["rolled_back", "rolled_back"]
    assert report["untouched"] == ["solo"] and mixed.unit("solo") == solo_before
    assert context_of(mixed, "pair-0") == context_of(mixed, "pair-1") == "32768"


def test_the_group_rolls_as_one_host_then_status_is_one_row(mixed: Any) -> None:
    rc, report, output = fleet_cli(mixed, "apply", "mixed", "--context", "200k", "--batch", "1", "--yes")
    assert rc == 0, output
    rows = {h["host"]: h for h in report["hosts"]}
    assert sorted(rows) == ["pair", "solo"], output  # two services, not three hosts
    assert [r["outcome"] for r in rows["pair"]["ranks"]] == ["applied", "applied"]
    assert rows["pair"]["revert"] == "deployctl apply pair --context 32768"
    for rank, target in enumerate(("pair-0", "pair-1")):
        flags = dict(parse_unit_flags(mixed.unit(target).decode()))
        assert (flags["context-length"], flags["node-rank"]) == ("200000", str(rank))
    rc, status, output = fleet_cli(mixed, "status", "mixed")
    assert rc == 0, output
    by_host = {r["host"]: r for r in status["hosts"]}
    assert by_host["pair"]["nodes"] == 2 and not by_host["pair"]["drift"] and "warning" not in by_host["pair"]
