"""`deployctl facts` on a real host over SSH, and plans made from what it read (online and offline)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from tests.integration.conftest import cli, wait_pool
from tests.pure import facts_fixtures as cfg

pytestmark = pytest.mark.integration


def shard(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    header = {name: {"dtype": d, "shape": s, "data_offsets": [0, 0]} for name, (d, s) in tensors.items()}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw  # the header alone: the reader never needs the data


def test_facts_are_read_on_the_host_and_plan_online_and_offline(sim, tmp_path: Path) -> None:
    wait_pool(sim)
    # The test host's /models is a read-only mount of zero-filled shards: a writable copy with a config.json
    # and a real safetensors header, named by the unit file (the service itself is not restarted).
    sim.host.put("/srv/models/Kimi-K2.6/config.json", json.dumps(cfg.KIMI_K26).encode())
    sim.host.put("/srv/models/Kimi-K2.6/model-00001.safetensors", shard({"w": ("BF16", [7168, 7168])}))
    unit = "/etc/systemd/system/sglang.service"
    sim.host.put(unit, sim.unit_text().replace("--model-path /models/", "--model-path /srv/models/").encode())
    r = cli(sim, "facts", sim.name, "--json")
    assert r.returncode == ExitCode.OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == "deployctl-facts/1"
    assert doc["model"]["config"]["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert doc["model"]["weights_bytes"] == 7168 * 7168 * 2
    assert doc["flags"]["tp-size"] == "8" and "Load weight begin" in doc["last_start"]
    assert len(doc["gpus"]) == 8  # the test host has no nvidia-smi: the inventory's cards
    human = cli(sim, "facts", sim.name)
    assert human.returncode == ExitCode.OK and "KimiK25ForConditionalGeneration" in human.stdout

    online = cli(sim, "plan", sim.name, "--context", "200k", "--json")
    assert online.returncode == ExitCode.OK, online.stderr
    plan = json.loads(online.stdout)
    assert plan["feasible"] and plan["basis"] == "calibrated", "\n".join(plan["notes"] + plan["warnings"])
    assert any("(host facts)" in n for n in plan["notes"])

    path = tmp_path / "ct200.json"
    path.write_text(r.stdout)
    offline = cli(sim, "plan", "--facts", str(path), "--context", "200k", "--json")
    assert offline.returncode == ExitCode.OK, offline.stderr
    assert json.loads(offline.stdout)["mem_fraction_static"] == plan["mem_fraction_static"]

    # apply plans from the same facts: its dry run proposes the same fraction.
    dry = cli(sim, "apply", sim.name, "--context", "200k", "--dry-run", "--yes")
    assert dry.returncode == ExitCode.OK, dry.stderr
    assert f"mem-fraction-static {plan['mem_fraction_static']}" in dry.stdout + dry.stderr
