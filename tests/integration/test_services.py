"""Two services on one test host: sglang-a.service on GPUs 0-3 and sglang-b.service on GPUs 4-7, each its
own inventory file with the same ssh target. An apply of one never restarts the other; an inventory whose
GPUs overlap another service's is refused before anything on the host is touched."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.inventory import load_service
from agent.render import render_unit, template_dir
from tests.integration.conftest import DEPLOYCTL
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, missing_prerequisites
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration

TARGET = "gpu-shared"
# Each service is a 4-GPU slice of the simulated host: the sim's weights are per GPU at tp = its GPUs.
SLICE = {**FAST_SIM, "SGLANG_SIM_GPUS": "4"}


@dataclass
class Shared:
    host: TestHost
    work: Path
    units: Path
    env: dict[str, str]
    ports: dict[str, int]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        return subprocess.run([DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=600)

    def show(self, name: str, prop: str) -> str:
        out = self.host.ssh(["systemctl", "show", "-p", prop, "--value", f"sglang-{name}.service"])
        return out.stdout.decode().strip()

    def process(self, name: str) -> tuple[str, str]:
        """What identifies the running start: systemd's InvocationID and the main process."""
        return self.show(name, "InvocationID"), self.show(name, "MainPID")

    def unit(self, name: str) -> bytes:
        return self.host.read(f"/etc/systemd/system/sglang-{name}.service")

    def backups(self, name: str) -> list[str]:
        return sorted(
            p.name for p in (self.host.root / "etc/systemd/system").glob(f"sglang-{name}.service.bak.*")
        )

    def txns(self) -> list[str]:
        return sorted(p.name for p in (self.host.root / "var/lib/deployctl/txn").glob("*"))

    def pool(self, name: str, timeout: float = 90) -> int:
        deadline = time.monotonic() + timeout
        while True:
            try:
                url = f"http://127.0.0.1:{self.ports[name]}/server_info"
                with urllib.request.urlopen(url, timeout=5) as r:
                    return int(json.load(r)["max_total_num_tokens"])
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def service_toml(name: str, indices: str, port: int) -> str:
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r"(?ms)^\[gpus\]\n.*?\n\n", f"[gpus]\nindices = {indices}\nmemory_gib = 95.6\n\n", text)
    text = re.sub(r'(?m)^target = "ct200-sim".*$', f'target = "{TARGET}"', text)
    text = re.sub(r'(?m)^name = "sglang.service"$', f'name = "sglang-{name}.service"', text)
    text = re.sub(r"(?m)^port = \d+$", f"port = {port}", text)
    return re.sub(r"(?m)^tp-size = \d+$", "tp-size = 4", text)


def _boot(work: Path) -> Shared:
    units = work / "units"
    units.mkdir()
    ports = dict(zip("ab", free_ports(2), strict=True))
    files: dict[str, tuple[bytes, int]] = {}
    dropin = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in SLICE.items())
    for name, indices in (("a", "[0, 1, 2, 3]"), ("b", "[4, 5, 6, 7]")):
        (units / f"{name}.toml").write_text(service_toml(name, indices, ports[name]))
        unit = render_unit(load_service(name, units), {}, template_dir())
        files[f"/etc/systemd/system/sglang-{name}.service"] = (unit.encode(), 0o644)
        files[f"/etc/systemd/system/sglang-{name}.service.d/sim.conf"] = (dropin.encode(), 0o644)
    host = TestHost.create(HostSetup(files, ["sglang-a.service", "sglang-b.service"], mount_agent=False))
    ssh_config = work / "ssh_config"
    ssh_config.write_text(host.ssh_config_entry(TARGET))
    env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
    return Shared(host, work, units, env, ports)


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    work = Path(tempfile.mkdtemp(prefix="deployctl-services-"))
    try:
        try:
            host = _boot(work)
        except TestHostUnavailable as exc:
            pytest.skip(f"test host unavailable: {exc}")
        try:
            host.pool("a"), host.pool("b")
            yield host
        finally:
            host.host.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_each_service_runs_on_its_own_gpus(shared: Shared) -> None:
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in shared.show("a", "Environment")
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in shared.show("b", "Environment")
    pid = shared.show("b", "MainPID")
    environ = shared.host.ssh(["cat", f"/proc/{pid}/environ"]).stdout.split(b"\0")
    assert b"CUDA_VISIBLE_DEVICES=4,5,6,7" in environ and b"CUDA_DEVICE_ORDER=PCI_BUS_ID" in environ


def test_overlapping_gpus_are_refused_with_nothing_touched(shared: Shared) -> None:
    before = {n: (shared.process(n), shared.unit(n), shared.backups(n)) for n in "ab"}
    txns = shared.txns()
    (shared.units / "c.toml").write_text(
        service_toml("c", "[3, 4]", 30999).replace("tp-size = 4", "tp-size = 2")
    )
    try:
        r = shared.run("apply", "c", "--context", "128k", "--yes")
    finally:
        (shared.units / "c.toml").unlink()
    assert r.returncode == ExitCode.USAGE, r.stderr
    first = r.stderr.splitlines()[0]
    assert first == (
        f"deployctl: error: {shared.units / 'a.toml'} and {shared.units / 'c.toml'}: both use GPU 3 "
        f"on host '{TARGET}'"
    ), r.stderr
    assert {n: (shared.process(n), shared.unit(n), shared.backups(n)) for n in "ab"} == before
    assert shared.txns() == txns
    assert not (shared.host.root / "etc/systemd/system/sglang-c.service").exists()


def test_an_apply_of_one_service_never_restarts_the_other(shared: Shared) -> None:
    a_before, b_before = shared.process("a"), shared.process("b")
    b_unit = shared.unit("b")
    r = shared.run("apply", "a", "--context", "128k", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert shared.pool("a") >= 128_000
    assert shared.process("a")[0] != a_before[0]  # a restarted once ...
    assert shared.process("b") == b_before  # ... b never: the same invocation, the same process
    assert shared.unit("b") == b_unit and shared.backups("b") == []
    assert len(shared.backups("a")) == 1
    # The second service then applies on its own, and the first keeps running.
    a_after = shared.process("a")
    r = shared.run("apply", "b", "--context", "128k", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert shared.pool("b") >= 128_000
    assert shared.process("b")[0] != b_before[0]
    assert shared.process("a") == a_after
    assert len(shared.backups("b")) == 1 and len(shared.backups("a")) == 1
    prom = shared.host.root / "var/lib/prometheus/node-exporter"
    assert {p.name for p in prom.glob("deployctl_*.prom")} >= {
        "deployctl_sglang-a.service.prom",
        "deployctl_sglang-b.service.prom",
    }
    status = shared.run("status", "a")
    assert status.returncode == ExitCode.OK and "sglang-a.service" in status.stdout + status.stderr


def _install(shared: Shared, name: str, indices: str) -> None:
    """Another service on the running host: its inventory file, its unit started."""
    (port,) = free_ports(1)
    shared.ports[name] = port
    (shared.units / f"{name}.toml").write_text(service_toml(name, indices, port))
    unit = render_unit(load_service(name, shared.units), {}, template_dir())
    dropin = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in SLICE.items())
    shared.host.put(f"/etc/systemd/system/sglang-{name}.service", unit.encode())
    shared.host.put(f"/etc/systemd/system/sglang-{name}.service.d/sim.conf", dropin.encode())
    started = shared.host.ssh(
        ["sh", "-c", f"systemctl daemon-reload && systemctl start sglang-{name}.service"]
    )
    assert started.returncode == 0, started.stderr
    shared.pool(name)


def _spans(shared: Shared) -> dict[str, tuple[str, str]]:
    """Each unit's last transaction: its first and last event's time."""
    spans: dict[str, tuple[str, str]] = {}
    for folder in sorted((shared.host.root / "var/lib/deployctl/txn").iterdir()):
        if not (folder / "request.json").is_file() or not (folder / "events.jsonl").is_file():
            continue
        unit = json.loads((folder / "request.json").read_text()).get("unit")
        times = [json.loads(line)["ts"] for line in (folder / "events.jsonl").read_text().splitlines()]
        if times:
            spans[unit] = (times[0], times[-1])
    return spans


def test_a_fleet_batch_may_hold_two_services_of_one_host(shared: Shared) -> None:
    """A group of three services of one host: the canary, then a batch of two at once, each under its own
    lock; every one restarts once."""
    _install(shared, "c", "[8, 9, 10, 11]")  # the simulated host has as many GPUs as it is told
    for name in "abc":
        path = shared.units / f"{name}.toml"
        path.write_text('groups = ["pool"]\n' + path.read_text())
    before = {n: shared.process(n) for n in "abc"}
    r = shared.run("fleet", "apply", "pool", "--context", "150k", "--canary", "1", "--batch", "2", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    for name in "abc":
        assert shared.process(name)[0] != before[name][0], name
        assert shared.pool(name) >= 150_000
    spans = _spans(shared)
    b, c = spans["sglang-b.service"], spans["sglang-c.service"]
    assert b[0] < c[1] and c[0] < b[1], spans  # b and c ran at once
    assert spans["sglang-a.service"][1] < min(b[0], c[0]), spans  # after the canary
