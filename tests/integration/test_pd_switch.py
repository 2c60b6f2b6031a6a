"""A role switch on the test host: a 2P1D service (simulated roles, each TP 2 on its own GPUs; the real
sglang-router 0.3.2 as a unit of its own) whose second prefill, started with --enable-pd-role-switch,
moves to the decodes (1P2D). The apply switches it through the simulated `POST /pd_role_switch`: its
MainPID and NRestarts do not change, its unit is written with the new role (a backup kept), the running
router lists it as a decode without a restart of its own, and a routed completion is served."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.inventory import load_service
from tests.pdhosts import ROUTER_SITE, TARGET, Pd
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, missing_prerequisites
from tests.testhost.instance import free_ports

# Its first run found that a group commit left NeedDaemonReload=yes (fixed: the commit reloads systemd)
pytestmark = pytest.mark.integration

SLICE = {**FAST_SIM, "SGLANG_SIM_GPUS": "2"}  # each role a 2-GPU slice of the simulated host
PREFILL, FLEX, DECODE, ROUTER = ("sglang-prefill-0.service", "sglang-flex.service", "sglang-decode-0.service",
                                 "sglang-router.service")  # fmt: skip
UNITS = (PREFILL, FLEX, DECODE, ROUTER)


def inventory(ports: list[int], flex_role: str) -> str:
    prefill, bootstrap, flex, flex_bootstrap, decode, router, metrics = ports
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r'(?m)^target = "ct200-sim".*$', f'target = "{TARGET}"', text)
    text = re.sub(
        r"(?ms)^\[gpus\]\n.*?\n\n", "[gpus]\nindices = [0, 1, 2, 3, 4, 5, 6, 7]\nmemory_gib = 95.6\n\n", text
    )
    # the file's figure is per GPU at its TP 8; each role runs TP 2 on a 96 GB card (a quarter of Kimi)
    text = re.sub(r"(?m)^weights_gib_per_gpu = .*$", "weights_gib_per_gpu = 17.62", text, count=1)
    text = re.sub(r"(?m)^port = \d+$", f"port = {router}", text)
    text = re.sub(r"(?m)^max-running-requests = \d+\n", "", text)
    # the same table in either role: the fraction pinned (the plan sizes each role's on its own need)
    flex_table = f"""
[[pd.{flex_role}]]
gpus = [2, 3]
port = {flex}
unit = "{FLEX}"
bootstrap_port = {flex_bootstrap}
flags = {{ tp-size = 2, max-running-requests = 1, mem-fraction-static = 0.85, enable-pd-role-switch = true }}
"""
    return (
        text
        + f"""
[pd]
transfer_backend = "mooncake_tcp"

[[pd.prefill]]
gpus = [0, 1]
port = {prefill}
bootstrap_port = {bootstrap}
flags = {{ tp-size = 2 }}

[[pd.decode]]
gpus = [4, 5]
port = {decode}
flags = {{ tp-size = 2, max-running-requests = 1 }}
{flex_table}
[pd.router]
port = {router}
host = "127.0.0.1"
executable = ["/usr/bin/python3", "-m", "sglang_router.launch_router"]
flags = {{ policy = "round_robin", prometheus-host = "127.0.0.1", prometheus-port = {metrics} }}
"""
    )


def _boot(work: Path) -> Pd:
    import sglang_router

    from agent.group.pdapply import planned_units

    units = work / "units"
    units.mkdir()
    ports = free_ports(7)
    (units / "pd.toml").write_text(inventory(ports, "prefill"))
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
    # Pd's helpers read the router's port as ports[3]
    return Pd(host, work, units, env, [ports[0], ports[1], ports[4], ports[5], ports[6], ports[2], ports[3]])


@pytest.fixture(scope="module")
def pd() -> Iterator[Pd]:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    work = Path(tempfile.mkdtemp(prefix="deployctl-pdswitch-"))
    try:
        try:
            booted = _boot(work)
        except TestHostUnavailable as exc:
            pytest.skip(f"test host unavailable: {exc}")
        try:
            booted.routed()
            yield booted
        finally:
            booted.host.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ports_of(pd: Pd) -> list[int]:
    """The inventory's ports in its own order (Pd keeps the router's at [3])."""
    p = pd.ports
    return [p[0], p[1], p[5], p[6], p[2], p[3], p[4]]


def test_a_unit_whose_role_alone_changes_is_switched_without_a_restart(pd: Pd) -> None:
    t0 = time.monotonic()
    # deployctl starts every unit once: a switch needs a running start that deployctl made of its unit
    first = pd.run("apply", "pd", "--context", "16k", "--yes")
    assert first.returncode == ExitCode.OK, first.stdout + first.stderr
    pid, restarts = pd.show(FLEX, "MainPID"), pd.show(FLEX, "NRestarts")
    router = pd.show(ROUTER, "InvocationID")
    (pd.units / "pd.toml").write_text(inventory(ports_of(pd), "decode"))
    dry = pd.run("apply", "pd", "--context", "16k", "--dry-run")
    assert "its role switches (prefill -> decode) without a restart" in dry.stdout + dry.stderr, dry.stdout
    r = pd.run("apply", "pd", "--context", "16k", "--yes")
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.OK, said
    assert "switched to decode without a restart" in said, said
    assert (pd.show(FLEX, "MainPID"), pd.show(FLEX, "NRestarts")) == (pid, restarts)
    assert pd.show(ROUTER, "InvocationID") == router  # its unit written, not restarted
    flex_url = f"http://127.0.0.1:{ports_of(pd)[2]}"
    kinds = {w["url"]: w.get("worker_type") for w in pd.workers()}
    assert kinds.get(flex_url) == "decode", kinds
    text = pd.host.read(f"/etc/systemd/system/{FLEX}").decode()
    assert (
        "--disaggregation-mode decode" in text
        and f"--disaggregation-bootstrap-port {ports_of(pd)[3]}" in text
    )
    backups = pd.host.ssh(["sh", "-c", f"ls /etc/systemd/system/ | grep -c '^{FLEX}.bak'"]).stdout.decode()
    assert int(backups.strip() or 0) >= 1
    router_text = pd.host.read(f"/etc/systemd/system/{ROUTER}").decode()
    assert f"--decode {flex_url}" in router_text
    assert pd.routed()
    print(f"\n2P1D -> 1P2D by a role switch in {time.monotonic() - t0:.1f} s (with the first apply)")
