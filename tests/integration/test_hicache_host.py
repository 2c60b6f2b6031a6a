"""Two HiCache services on one test host whose SGLang defaults would overcommit it: planned, rendered with an
explicit --hicache-size per rank and a matching MemoryMax=, applied at once and started one after another
(the host's memory lock), each start passing the simulated SGLang's own host-pool check (its sizing and
lines are SGLang 0.5.23's: tests/sim/sglang/hicache.py, tests/pure/test_sim_hicache.py). Nothing is refused,
nothing killed.

The host's RAM is simulated: a meminfo file bound over the host's /proc/meminfo (what the facts and the sim
read), which the sim's pinned pools leave as a real host's MemAvailable does; the test host's systemd applies
no memory controller, so the sim reads its unit's MemoryMax= from systemd."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.exitcodes import ExitCode
from agent.inventory import load_service
from agent.plan.hostplan import memory_max_of
from agent.plan.hostpool import GIB, HiCacheFlags, HostMemory, RankPool, plan_host_pool
from agent.render import render_unit, template_dir
from tests.integration.conftest import DEPLOYCTL
from tests.sim.sglang import hicache as hc
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, missing_prerequisites
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration

TARGET = "hicache-host"
CONTEXT = "128k"
TOTAL, AVAILABLE = 256 * GIB, 120 * GIB  # the simulated host: each default pool fits it alone, not both
MLA_BYTES_PER_TOKEN = 576 * 2 * 61  # Kimi K2.6's host pool per token and rank (pool_host/mla.py:195-197)
RANKS = 4
# A model folder with a config.json (the test host's /models has only zero-filled shards): the facts read it,
# so the plan is made from the host's facts (its memory among them); the sim's own Kimi K2.6 config, so the
# sim's device pool is the one SGLang's code answered for the other tests (tests/oracle/cache)
MODEL = "/srv/models/Kimi-K2.6"


@dataclass
class Host:
    host: TestHost
    work: Path
    ram: Path  # the simulated meminfo's folder, the same path inside the host
    units: Path
    env: dict[str, str]
    ports: dict[str, int]

    def popen(self, *args: str) -> subprocess.Popen[str]:
        env = {**os.environ, **self.env}
        return subprocess.Popen(
            [DEPLOYCTL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        return subprocess.run([DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=600)

    def show(self, name: str, prop: str) -> str:
        out = self.host.ssh(["systemctl", "show", "-p", prop, "--value", f"sglang-{name}.service"])
        return out.stdout.decode().strip()

    def unit(self, name: str) -> str:
        return self.host.read(f"/etc/systemd/system/sglang-{name}.service").decode()

    def journal(self, name: str) -> str:
        out = self.host.ssh(["journalctl", "--no-pager", "-o", "cat", "-u", f"sglang-{name}.service"])
        return out.stdout.decode(errors="replace")

    def wait_serving(self, name: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                url = f"http://127.0.0.1:{self.ports[name]}/server_info"
                with urllib.request.urlopen(url, timeout=5) as r:
                    json.load(r)
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def available(self) -> int:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", (self.ram / "meminfo").read_text(), re.M)
        assert found
        return int(found.group(1)) * 1024


def service_toml(name: str, indices: str, port: int, hicache: bool) -> str:
    """ct200-sim as a 4-GPU slice, without its speculative draft (HiCache with a draft is not planned)."""
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r"(?ms)^\[draft\]\n.*?\n\n", "", text)
    text = re.sub(r"(?ms)^\[gpus\]\n.*?\n\n", f"[gpus]\nindices = {indices}\nmemory_gib = 95.6\n\n", text)
    text = re.sub(r'(?m)^target = "ct200-sim".*$', f'target = "{TARGET}"', text)
    text = re.sub(r'(?m)^name = "sglang.service"$', f'name = "sglang-{name}.service"', text)
    text = re.sub(r"(?m)^port = \d+$", f"port = {port}", text)
    text = re.sub(r"(?m)^tp-size = \d+$", f"tp-size = {RANKS}", text)
    text = text.replace('path = "/models/Kimi-K2.6"', f'path = "{MODEL}"')
    return (
        text.replace("[sglang.flags]\n", "[sglang.flags]\nenable-hierarchical-cache = true\n")
        if hicache
        else text
    )


def _boot(work: Path) -> Host:
    units, ram = work / "units", Path(tempfile.mkdtemp(prefix="deployctl-hostram-", dir="/var/tmp"))
    units.mkdir()
    ram.chmod(0o777)
    meminfo = ram / "meminfo"
    meminfo.write_text(
        f"MemTotal:       {TOTAL // 1024} kB\nMemFree:        {AVAILABLE // 1024} kB\n"
        f"MemAvailable:   {AVAILABLE // 1024} kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n"
    )
    meminfo.chmod(0o666)
    ports = dict(zip("ab", free_ports(2), strict=True))
    sim = {**FAST_SIM, "SGLANG_SIM_GPUS": "4", "SGLANG_SIM_MEMINFO": str(meminfo)}
    dropin = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in sim.items())
    header = json.dumps({"w": {"dtype": "BF16", "shape": [7168, 7168], "data_offsets": [0, 0]}}).encode()
    files: dict[str, tuple[bytes, int]] = {
        f"{MODEL}/config.json": ((REPO / "tests/sim/sglang/data/kimi-k2.6.json").read_bytes(), 0o644),
        f"{MODEL}/model-00001.safetensors": (struct.pack("<Q", len(header)) + header, 0o644),
    }
    for name, indices in (("a", "[0, 1, 2, 3]"), ("b", "[4, 5, 6, 7]")):
        # the running units: no HiCache yet (they pin nothing); the inventories then turn it on
        (units / f"{name}.toml").write_text(service_toml(name, indices, ports[name], hicache=False))
        unit = render_unit(load_service(name, units), {}, template_dir())
        files[f"/etc/systemd/system/sglang-{name}.service"] = (unit.encode(), 0o644)
        files[f"/etc/systemd/system/sglang-{name}.service.d/sim.conf"] = (dropin.encode(), 0o644)
        (units / f"{name}.toml").write_text(service_toml(name, indices, ports[name], hicache=True))
    setup = HostSetup(
        files, ["sglang-a.service", "sglang-b.service"], mount_agent=False,
        binds_ro={str(meminfo): "/proc/meminfo"}, binds_rw={str(ram): str(ram)},
    )  # fmt: skip
    try:
        host = TestHost.create(setup)
    except BaseException:
        shutil.rmtree(ram, ignore_errors=True)
        raise
    ssh_config = work / "ssh_config"
    ssh_config.write_text(host.ssh_config_entry(TARGET))
    env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
    return Host(host, work, ram, units, env, ports)


@pytest.fixture(scope="module")
def shared() -> Iterator[Host]:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    work = Path(tempfile.mkdtemp(prefix="deployctl-hicache-host-"))
    try:
        try:
            host = _boot(work)
        except TestHostUnavailable as exc:
            pytest.skip(f"test host unavailable: {exc}")
        try:
            for name in "ab":
                host.wait_serving(name)  # both up, pinning nothing: the facts are the host at rest
            yield host
        finally:
            host.host.stop()
            shutil.rmtree(host.ram, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _plan(shared: Host, name: str) -> dict[str, Any]:
    r = shared.run("plan", name, "--context", CONTEXT, "--json")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    plan: dict[str, Any] = json.loads(r.stdout)
    return plan


def _events(shared: Host) -> dict[str, list[dict[str, Any]]]:
    """Each unit's last transaction's events (the tool's own log on the host)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted((shared.host.root / "var/lib/deployctl/txn").iterdir()):
        if (folder / "request.json").is_file() and (folder / "events.jsonl").is_file():
            unit = json.loads((folder / "request.json").read_text()).get("unit")
            found[unit] = [json.loads(x) for x in (folder / "events.jsonl").read_text().splitlines()]
    return found


def _first(events: list[dict[str, Any]], stage: str) -> str:
    return str(next(e["ts"] for e in events if e["stage"] == stage))


def test_two_services_whose_defaults_overcommit_are_planned_sized_and_started_in_order(shared: Host) -> None:
    plans = {name: _plan(shared, name) for name in "ab"}
    for name, plan in plans.items():
        pool = plan["host_pool"]
        assert pool["checked"] is True and pool["ranks"] == RANKS, pool
        assert pool["bytes_per_token"] == MLA_BYTES_PER_TOKEN
        assert pool["as_given"]["mode"] == "auto" and plan["flags"]["hicache-size"] >= 1, (name, pool)
    # SGLang's default (the auto size) takes what each start sees as its own: the two started at once
    # would pin more than the host has
    given = [p["host_pool"]["as_given"]["gb"] * 1e9 * RANKS for p in plans.values()]
    assert max(given) < AVAILABLE < sum(given), given
    # and the simulated SGLang says the same: started at once, both read the host at rest, both pass its
    # check, and together they pin more than the host has
    at_once = [
        hc.size_pool(
            p["predicted_pool_tokens"],
            MLA_BYTES_PER_TOKEN,
            1,
            hc.Flags(2.0, 0, 0.8),
            hc.Host(AVAILABLE),
            RANKS,
        )
        for p in plans.values()
    ]
    assert [(x.error, x.tokens) for x in at_once] == [
        (None, p["host_pool"]["as_given"]["tokens"]) for p in plans.values()
    ]
    assert sum(x.bytes * RANKS for x in at_once) > AVAILABLE
    # applied at once: the host's memory lock starts one, then the other
    runs = {name: shared.popen("apply", name, "--context", CONTEXT, "--yes") for name in "ab"}
    outs = {name: p.communicate(timeout=900) for name, p in runs.items()}
    for name, p in runs.items():
        assert p.returncode == ExitCode.OK, outs[name]
    pinned = 0
    for name in "ab":
        unit = shared.unit(name)
        size = int(re.findall(r"--hicache-size[ =](\d+)", unit)[-1])
        assert "--hicache-ratio" not in unit and "--hicache-host-memory-fraction" not in unit
        flags = {"enable-hierarchical-cache": True, "tp-size": RANKS, "hicache-size": size}
        limit = memory_max_of(flags)
        assert limit is not None and f"MemoryMax={limit // 2**20}M" in unit
        assert shared.show(name, "MemoryMax") == str(limit // 2**20 * 2**20)
        # the sim's line is the plan's pool to the token (an explicit size: what SGLang builds of it)
        planned = plan_host_pool(
            RankPool(1, MLA_BYTES_PER_TOKEN), HiCacheFlags(size_gb=size), HostMemory(10**15), 4
        )
        log = shared.journal(name)
        said = re.findall(r"Allocating kv hierarchical KV host pool: (\d+) tokens", log)
        assert said == [str(planned.tokens)] * RANKS, (name, said, planned)
        assert "Not enough host memory" not in log and "No host memory is left" not in log
        assert shared.show(name, "ActiveState") == "active" and shared.show(name, "NRestarts") == "0"
        # nothing killed for memory: no OOM kill in the unit's whole journal, and no kill in the start the
        # apply made (the stop of the start before may SIGKILL the sim's scheduler child if it outlives the
        # main process by a moment: KillMode=mixed's final kill, the rendered unit's design)
        assert "oom-kill" not in log and "OOM killer" not in log, log
        this_start = log.rsplit(f"Started sglang-{name}.service", 1)[-1]
        assert "SIGKILL" not in this_start and "Killed" not in this_start, this_start
        pinned += planned.bytes * RANKS
    # the pools left the simulated host's MemAvailable (whole kB, as meminfo says it), and it held them
    assert abs(shared.available() - (AVAILABLE - pinned)) < 2 * 1024, (shared.available(), pinned)
    assert pinned < AVAILABLE
    # one start after the other: the second restarts after the first was ready, which it was under the
    # host's memory lock (the tool's own event log on the host)
    events = _events(shared)
    first, second = sorted(
        ("sglang-a.service", "sglang-b.service"), key=lambda u: _first(events[u], "restart")
    )
    ready = max(e["ts"] for e in events[first] if e["stage"] == "ready")
    assert ready < _first(events[second], "restart"), events
    assert any(e["stage"] == "lock" and "holding" in e["message"] for e in events[second]), events[second]
