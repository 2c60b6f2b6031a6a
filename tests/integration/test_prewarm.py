"""Pre-warming on the real test host: the simulated server reads real weight files, so the cache counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.host.prewarm import resident_bytes
from tests.integration.conftest import cli, wait_pool
from tests.testhost.models import evict, shard_paths

# The page cache is the machine's: another worker's test host reading the same weight files between the
# eviction and the pre-warm would warm them (CI: "already in the page cache"), so make test runs it alone.
pytestmark = [pytest.mark.integration, pytest.mark.alone]
TARGET = "/models/Kimi-K2.6"


def outcome_of(stdout: str) -> dict[str, object]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return next(e for e in events if e["kind"] == "outcome")


def resident(inside: str) -> int:
    return sum(resident_bytes(p, p.stat().st_size) for p in shard_paths(inside))


def total(inside: str) -> int:
    return sum(p.stat().st_size for p in shard_paths(inside))


def test_the_weights_are_read_before_the_stop_and_the_downtime_is_measured(sim) -> None:
    wait_pool(sim)
    evict(TARGET)
    assert resident(TARGET) < total(TARGET)
    r = cli(sim, "apply", sim.name, "--context", "64k", "--yes", "--json")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    data = outcome_of(r.stdout)["data"]
    assert isinstance(data, dict)
    # Each file that was not wholly resident is read whole; the restart then loads them from memory
    # (the kernel may drop a few pages again under the load of a busy machine: 95 %, not 100 %).
    assert data["prewarm"]["skip"] is None and data["prewarm"]["read_bytes"] >= total(TARGET) // 2
    assert resident(TARGET) >= 0.95 * total(TARGET)
    down = data["downtime"]
    assert down["seconds"] > 0 and set(down["phases"]) >= {"stop", "weights", "pool", "ready"}
    # The plain report says it too, next to the previous start's figures.
    again = cli(sim, "apply", sim.name, "--context", "72k", "--yes")
    assert again.returncode == ExitCode.OK, again.stdout + again.stderr
    assert "pre-warm:" in again.stdout  # most likely "skipped: ... already in the page cache"
    assert re.search(r"downtime: +[\d.]+ s \(stop [\d.]+, init [\d.]+, weights", again.stdout), again.stdout
    assert "previous start:" in again.stdout


def test_prewarm_off_in_the_inventory_reads_nothing(sim) -> None:
    inventory = Path(sim.units_dir) / f"{sim.name}.toml"
    inventory.write_text(inventory.read_text() + "\n[prewarm]\nenabled = false\n")
    evict(TARGET)
    r = cli(sim, "apply", sim.name, "--context", "80k", "--yes", "--json")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert '"stage": "prewarm"' not in r.stdout
    assert "prewarm" not in outcome_of(r.stdout)["data"]
