"""Another process on the service's GPU: the facts read per-process GPU memory (nvidia-smi
--query-compute-apps, each process's systemd unit from /proc/PID/cgroup), and a cold plan subtracts what
processes outside this service hold, naming them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.host.watch.gpu_procs import by_card, parse_compute_apps, unit_of_cgroup
from agent.plan.facts import parse_facts
from agent.plan.predict import pool_model
from tests.pure.test_facts_plan import H100, facts

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
LLAMA: dict[str, Any] = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
JUPYTER = {"pid": 4242, "name": "python3", "used_mib": 4096.0, "unit": "jupyter.service", "service": False}
OWN = {"pid": 17, "name": "python3", "used_mib": 70000.0, "unit": "sglang.service", "service": True}


def cold(processes: list[dict[str, Any]]) -> Any:
    doc = facts(LLAMA, H100, 1, weights=16 * 10**9, flags={"tp-size": 1, "mem-fraction-static": 0.85})
    doc["gpus"][0]["processes"] = processes
    return pool_model(parse_facts(doc), 32_768)


def test_a_cold_plan_subtracts_what_processes_outside_the_service_hold_and_names_them() -> None:
    clean, shared = cold([]), cold([JUPYTER, OWN])
    assert clean.pool.pre_gib - shared.pool.pre_gib == 4.0  # the service's own 70 GB goes with its restart
    assert clean.pool.post_gib - shared.pool.post_gib == 4.0
    assert shared.pool.pool(0.85) < clean.pool.pool(0.85)
    assert any("pid 4242 python3 (jupyter.service): 4.00 GiB" in n for n in shared.notes), shared.notes
    assert cold([OWN]).pool.pre_gib == clean.pool.pre_gib


def test_the_facts_read_each_process_and_its_unit() -> None:
    apps = parse_compute_apps("GPU-aaa, 4242, python3, 4096\nGPU-bbb, 17, python3, 70000\nbad line\n")
    assert apps == [("GPU-aaa", 4242, "python3", 4096.0), ("GPU-bbb", 17, "python3", 70000.0)]
    assert unit_of_cgroup("0::/system.slice/sglang.service\n") == "sglang.service"
    assert unit_of_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") == "session-3.scope"
    assert unit_of_cgroup("") is None
    units = {4242: "jupyter.service", 17: "sglang.service"}
    got = by_card({"GPU-aaa": 0, "GPU-bbb": 1}, apps, units.get, "sglang.service")
    assert got == {0: [JUPYTER], 1: [OWN]}
