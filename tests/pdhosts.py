"""A 1P1D `[pd]` service on one test host, for tests/integration/test_pd_apply.py and `make demo`.

The simulated server runs a prefill on GPUs 0-3 and a decode on GPUs 4-7 of one simulated 8-GPU host, and
the real sglang-router 0.3.2 in PD mode runs as a unit of its own; the host boots on the units deployctl
plans for the file at 32,768 tokens. The router's Python package is the runner's own (read-only bind): the
test host has none of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from agent.inventory import load_service
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost
from tests.testhost.instance import free_ports

DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))
NAME = "pd"  # the inventory file: units/pd.toml
TARGET = "pd-sim"
SLICE = {**FAST_SIM, "SGLANG_SIM_GPUS": "4"}  # each role a 4-GPU slice of the simulated host
ROUTER_SITE = "/opt/router-site"
UNITS = ("sglang-prefill-0.service", "sglang-decode-0.service", "sglang-router.service")
FAULT = f"/etc/systemd/system/{UNITS[1]}.d/fault.conf"


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

    @property
    def path(self) -> Path:
        return self.units / f"{NAME}.toml"

    def write(self, policy: str = "round_robin") -> None:
        """Write the service's file with this router policy (a change of the router's unit)."""
        self.path.write_text(inventory(self.ports, policy))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        return subprocess.run([DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=600)

    def show(self, unit: str, prop: str) -> str:
        return self.host.ssh(["systemctl", "show", "-p", prop, "--value", unit]).stdout.decode().strip()

    def texts(self) -> dict[str, bytes]:
        return {u: self.host.read(f"/etc/systemd/system/{u}") for u in UNITS}

    def fail_decode_at(self, context: int) -> None:
        """The decode's next start at this context crashes while loading (a simulated fault, a drop-in)."""
        fault = "[Service]\nEnvironment=SGLANG_SIM_FAULT=crash_loading\n"
        self.host.put(FAULT, (fault + f"Environment=SGLANG_SIM_FAULT_WHEN_CONTEXT={context}\n").encode())

    def clear_fault(self) -> None:
        self.host.ssh(["rm", "-f", FAULT])
        self.host.ssh(["systemctl", "daemon-reload"])

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

    def stop(self) -> None:
        self.host.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _setup(units: Path) -> HostSetup:
    """The units deployctl plans at 32,768 tokens, each role's simulated slice, the router's package."""
    import sglang_router

    from agent.group.pdapply import planned_units

    sim = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in SLICE.items())
    files: dict[str, tuple[bytes, int]] = {}
    for unit in planned_units(load_service(NAME, units), 32768):
        name = unit.host.unit.name
        files[f"/etc/systemd/system/{name}"] = (unit.text.encode(), 0o644)
        extra = f"[Service]\nEnvironment=PYTHONPATH={ROUTER_SITE}\n" if "router" in name else sim
        files[f"/etc/systemd/system/{name}.d/test.conf"] = (extra.encode(), 0o644)
    site = str(Path(sglang_router.__file__).resolve().parents[1])
    return HostSetup(files, list(UNITS), mount_agent=False, binds_ro={site: ROUTER_SITE})


def boot() -> Pd:
    """Boot the test host with the 1P1D service's three units enabled and started (not waited for)."""
    work = Path(tempfile.mkdtemp(prefix="deployctl-pd-"))
    try:
        units = work / "units"
        units.mkdir()
        ports = free_ports(5)
        (units / f"{NAME}.toml").write_text(inventory(ports))
        host = TestHost.create(_setup(units))
        ssh_config = work / "ssh_config"
        ssh_config.write_text(host.ssh_config_entry(TARGET))
        env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
        return Pd(host, work, units, env, ports)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
