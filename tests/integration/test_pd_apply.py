"""A 1P1D service on one test host (the simulated server on GPUs 0-3 and 4-7, the real sglang-router 0.3.2
in PD mode as a unit of its own), applied as one group: prefill, then decode, then the router; a decode
start that fails rolls back every role and the router's unit. The router's Python package is the test
runner's own (read-only bind): the test host has none of its own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.inventory import load_service
from tests.integration.conftest import DEPLOYCTL
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, missing_prerequisites
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration

TARGET = "pd-sim"
SLICE = {**FAST_SIM, "SGLANG_SIM_GPUS": "4"}  # each role a 4-GPU slice of the simulated host
ROUTER_SITE = "/opt/router-site"
UNITS = ("sglang-prefill-0.service", "sglang-decode-0.service", "sglang-router.service")


def inventory(ports: list[int], policy: str = "round_robin") -> str:
    prefill, bootstrap, decode, router, metrics = ports
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r'(?m)^target = "ct200-sim".*$', f'target = "{TARGET}"', text)
    text = re.sub(
        r"(?ms)^\[gpus\]\n.*?\n\n", "[gpus]\nindices = [0, 1, 2, 3, 4, 5, 6, 7]\nmemory_gib = 95.6\n\n", text
    )
    # the file's figure is per GPU at its TP 8; each role runs TP 4 on a 96 GB card: a model of half
    # Kimi's weights, so that each role holds its pool (the plan scales the weights to the role's TP)
    text = re.sub(r"(?m)^weights_gib_per_gpu = .*$", "weights_gib_per_gpu = 35.24", text, count=1)
    text = re.sub(r"(?m)^port = \d+$", f"port = {router}", text)
    text = re.sub(r"(?m)^max-running-requests = \d+\n", "", text)
    return (
        text
        + f"""
[pd]
transfer_backend = "mooncake_tcp"

[[pd.prefill]]
gpus = [0, 1, 2, 3]
port = {prefill}
bootstrap_port = {bootstrap}
flags = {{ tp-size = 4 }}

[[pd.decode]]
gpus = [4, 5, 6, 7]
port = {decode}
flags = {{ tp-size = 4, max-running-requests = 2 }}

[pd.router]
port = {router}
host = "127.0.0.1"
executable = ["/usr/bin/python3", "-m", "sglang_router.launch_router"]
flags = {{ policy = "{policy}", prometheus-host = "127.0.0.1", prometheus-port = {metrics} }}
"""
    )


@dataclass
class Pd:
    host: TestHost
    work: Path
    units: Path
    env: dict[str, str]
    ports: list[int]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        return subprocess.run([DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=600)

    def show(self, unit: str, prop: str) -> str:
        return self.host.ssh(["systemctl", "show", "-p", prop, "--value", unit]).stdout.decode().strip()

    def texts(self) -> dict[str, bytes]:
        return {u: self.host.read(f"/etc/systemd/system/{u}") for u in UNITS}

    def workers(self) -> list[dict[str, object]]:
        """The router's GET /workers list."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[3]}/workers", timeout=10) as r:
            return list(json.load(r)["workers"])

    def routed(self, timeout: float = 120.0) -> str:
        """One completion through the router (prefill, then decode), retried while the router starts."""
        body = {"model": "kimi-k2.6", "max_tokens": 8,
                "messages": [{"role": "user", "content": "The quick brown fox. What animal?"}]}  # fmt: skip
        url = f"http://127.0.0.1:{self.ports[3]}/v1/chat/completions"
        data, head = json.dumps(body).encode(), {"content-type": "application/json"}
        req = urllib.request.Request(url, data=data, headers=head)
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return str(json.load(r)["choices"][0]["message"]["content"])
            except (OSError, urllib.error.HTTPError, KeyError) as exc:
                last = str(exc)
                time.sleep(1.0)
        raise AssertionError(f"no routed completion within {timeout:.0f} s: {last}")


def _boot(work: Path) -> Pd:
    import sglang_router

    from agent.group.pdapply import planned_units

    units = work / "units"
    units.mkdir()
    ports = free_ports(5)
    (units / "pd.toml").write_text(inventory(ports))
    sim = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in SLICE.items())
    files: dict[str, tuple[bytes, int]] = {}
    for unit in planned_units(load_service("pd", units), 32768):
        name = unit.host.unit.name
        files[f"/etc/systemd/system/{name}"] = (unit.text.encode(), 0o644)
        extra = f"[Service]\nEnvironment=PYTHONPATH={ROUTER_SITE}\n" if "router" in name else sim
        files[f"/etc/systemd/system/{name}.d/test.conf"] = (extra.encode(), 0o644)
    site = str(Path(sglang_router.__file__).resolve().parents[1])
    setup = HostSetup(files, list(UNITS), mount_agent=False, binds_ro={site: ROUTER_SITE})
    host = TestHost.create(setup)
    ssh_config = work / "ssh_config"
    ssh_config.write_text(host.ssh_config_entry(TARGET))
    env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
    return Pd(host, work, units, env, ports)


@pytest.fixture(scope="module")
def pd() -> Iterator[Pd]:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    work = Path(tempfile.mkdtemp(prefix="deployctl-pd-"))
    try:
        try:
            booted = _boot(work)
        except TestHostUnavailable as exc:
            pytest.skip(f"test host unavailable: {exc}")
        try:
            booted.routed()  # the old generation serves through the router
            yield booted
        finally:
            booted.host.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_1p1d_apply_commits_prefill_then_decode_and_leaves_the_router_running(pd: Pd) -> None:
    t0 = time.monotonic()
    router = pd.show(UNITS[2], "InvocationID")
    r = pd.run("apply", "pd", "--context", "16k", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), said
    assert "routed check" in said, said
    # drained through the real sglang-router 0.3.2: each unit out before its stop, back with its role
    prefill_url, decode_url = (f"http://127.0.0.1:{port}" for port in (pd.ports[0], pd.ports[2]))
    for url in (prefill_url, decode_url):
        assert f"took {url} out of the router" in said and f"put {url} back in the router" in said, said
    assert "this unit served one" in said, said  # the decode's own request count grew
    assert "KV checksum: on in every role" in said, said
    kinds = {w["url"]: (w.get("worker_type"), w.get("bootstrap_port")) for w in pd.workers()}
    assert kinds == {prefill_url: ("prefill", pd.ports[1]), decode_url: ("decode", None)}, kinds
    texts = pd.texts()
    assert b"--context-length 16000" in texts[UNITS[0]] and b"--context-length 16000" in texts[UNITS[1]]
    assert pd.show(UNITS[2], "InvocationID") == router  # its unit is unchanged: not restarted
    assert pd.routed()
    print(f"\n1P1D apply committed in {time.monotonic() - t0:.1f} s")


def test_a_failed_decode_start_rolls_back_every_role_and_the_router(pd: Pd) -> None:
    t0 = time.monotonic()
    before = pd.texts()
    # the decode's next start (at 24,000 tokens) crashes loading; the router's flags change too
    fault = "[Service]\nEnvironment=SGLANG_SIM_FAULT=crash_loading\n"
    fault += "Environment=SGLANG_SIM_FAULT_WHEN_CONTEXT=24000\n"
    pd.host.put(f"/etc/systemd/system/{UNITS[1]}.d/fault.conf", fault.encode())
    (pd.units / "pd.toml").write_text(inventory(pd.ports, policy="random"))
    r = pd.run("apply", "pd", "--context", "24k", "--yes")
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.ROLLED_BACK, said
    assert "wave 2: router" in said and "decode[0] failed" in said, said  # the decode's start, named
    assert pd.texts() == before  # every role and the router on its previous unit
    for unit in UNITS:
        assert pd.show(unit, "ActiveState") == "active", unit
    assert pd.routed()
    print(f"\nfailed 1P1D apply rolled back in {time.monotonic() - t0:.1f} s")


def test_rollback_takes_every_role_back_to_its_previous_unit_as_one_group(pd: Pd) -> None:
    """After the rolled-back apply above, each role's newest backup that differs is its unit before the
    first apply (32k): both go back as one group, prefill first, the router's unchanged unit left alone."""
    t0 = time.monotonic()
    pd.host.ssh(["rm", "-f", f"/etc/systemd/system/{UNITS[1]}.d/fault.conf"])
    pd.host.ssh(["systemctl", "daemon-reload"])
    router = pd.show(UNITS[2], "InvocationID")
    r = pd.run("rollback", "pd", "--yes")
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.OK, said
    assert said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), said
    assert not re.search(r"wave \d: router", said), said
    texts = pd.texts()
    assert b"--context-length 32768" in texts[UNITS[0]] and b"--context-length 32768" in texts[UNITS[1]]
    assert pd.show(UNITS[2], "InvocationID") == router  # its unit has no earlier text: not restarted
    status = pd.run("status", "pd")
    assert status.returncode == ExitCode.OK and status.stdout.count("active/running") == 3, status.stdout
    assert pd.routed()
    print(f"\n1P1D rollback in {time.monotonic() - t0:.1f} s")


def test_backups_and_facts_ask_each_unit_of_the_service(pd: Pd) -> None:
    """After the applies and the rollback above: each role's backups, grouped by unit, and each role's facts
    with its transfer facts, read by the real agent over the host's one connection."""
    r = pd.run("backups", "pd")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    heads = [
        line for line in r.stdout.splitlines() if "backup(s), newest first" in line or ": no backups" in line
    ]
    assert [h.split()[0] for h in heads] == ["prefill[0]", "decode[0]", "router"], r.stdout
    assert "--context-length" in r.stdout.split("decode[0]")[1], r.stdout  # the decode's backups differ
    doc = json.loads(pd.run("backups", "pd", "--json").stdout)
    assert [u["unit"] for u in doc["units"]] == list(UNITS)
    r = pd.run("facts", "pd")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert r.stdout.count("  transfer installed: mooncake") == 2, r.stdout  # the simulated host's stand-in
    # the simulated units run as root (no User=): the venv's Python is never run as root, so not imported
    assert r.stdout.count("engine   mooncake_tcp: not checked: the unit has no User=") == 2, r.stdout
