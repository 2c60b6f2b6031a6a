"""A 1P1D service over two test hosts: the prefill and the real sglang-router 0.3.2 on one, the decode on the
other (simulated roles, the router's package the runner's own, bound read-only). Applied as one group over
both hosts: the decode, in the last wave, sends the routed check from its host to the router's reachable
address ([pd.router] url) and is drained through it (with the router beside the decode, its routed check
would go to its loopback). A decode start that fails rolls every role on both hosts and the router back;
the agent of one unit SIGKILLed mid-change (the in-host watcher of tests.faultkit stops its runner at a
step, no sleep) ends with every unit on one generation, running, a routed completion served.

The test hosts share this machine's network (tests/grouphosts.py): each is reached over SSH at 127.0.0.1
on a port of its own, and the router and the decode reach each other at this machine's own non-loopback
address, as units of two hosts on a real network do (a loopback URL across hosts is refused,
agent/pd/refusals.py)."""

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
from tests import faultkit as fk
from tests.integration.conftest import DEPLOYCTL
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, missing_prerequisites
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration

PREFILL_HOST, DECODE_HOST = "pd-p", "pd-d"  # the prefill's host runs the router too
SLICE = {**FAST_SIM, "SGLANG_SIM_GPUS": "4"}
ROUTER_SITE = "/opt/router-site"
PREFILL, DECODE, ROUTER = "sglang-prefill-0.service", "sglang-decode-0.service", "sglang-router.service"


def lan_address() -> str | None:
    """This machine's first non-loopback IPv4 address (both test hosts listen on it: they share the
    network); None where it has none."""
    r = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    found = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", r.stdout)
    return found[0] if found else None


def inventory(addr: str, ports: list[int], policy: str = "round_robin") -> str:
    prefill, bootstrap, decode, router, metrics = ports
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r'(?m)^target = "ct200-sim".*$', f'target = "{PREFILL_HOST}"', text)
    text = re.sub(r'(?m)^host = "127.0.0.1"$', 'host = "0.0.0.0"', text)  # reached from the other host
    text = re.sub(r"(?ms)^\[gpus\]\n.*?\n\n", "[gpus]\nindices = [0, 1, 2, 3]\nmemory_gib = 95.6\n\n", text)
    # each role runs TP 4 on a 96 GB card: a model of half Kimi's weights (test_pd_apply.py)
    text = re.sub(r"(?m)^weights_gib_per_gpu = .*$", "weights_gib_per_gpu = 35.24", text, count=1)
    text = re.sub(r"(?m)^port = \d+$", f"port = {router}", text)
    text = re.sub(r"(?m)^max-running-requests = \d+\n", "", text)
    return (
        text
        + f"""
[pd]
transfer_backend = "mooncake_tcp"

[[pd.prefill]]
url = "http://{addr}:{prefill}"  # the decode's host bootstraps at it: a loopback URL is refused
gpus = [0, 1, 2, 3]
port = {prefill}
bootstrap_port = {bootstrap}
flags = {{ tp-size = 4 }}

[[pd.decode]]
target = "{DECODE_HOST}"
url = "http://{addr}:{decode}"
gpus = [4, 5, 6, 7]
port = {decode}
flags = {{ tp-size = 4, max-running-requests = 2 }}

[pd.router]
port = {router}
host = "0.0.0.0"
url = "http://{addr}:{router}"
executable = ["/usr/bin/python3", "-m", "sglang_router.launch_router"]
flags = {{ policy = "{policy}", prometheus-host = "127.0.0.1", prometheus-port = {metrics} }}
"""
    )


@dataclass
class Pair:
    hosts: dict[str, TestHost]  # by unit
    work: Path
    units: Path
    env: dict[str, str]
    addr: str
    ports: list[int]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        return subprocess.run([DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=600)

    def show(self, unit: str, prop: str) -> str:
        argv = ["systemctl", "show", "-p", prop, "--value", unit]
        return self.hosts[unit].ssh(argv).stdout.decode().strip()

    def texts(self) -> dict[str, bytes]:
        return {u: h.read(f"/etc/systemd/system/{u}") for u, h in self.hosts.items()}

    def workers(self) -> dict[str, tuple[object, object]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[3]}/workers", timeout=10) as r:
            got = json.load(r)["workers"]
        return {w["url"]: (w.get("worker_type"), w.get("bootstrap_port")) for w in got}

    def routed(self, timeout: float = 120.0) -> str:
        """One completion through the router at its reachable address, retried while it starts."""
        body = {"model": "kimi-k2.6", "max_tokens": 8,
                "messages": [{"role": "user", "content": "The quick brown fox. What animal?"}]}  # fmt: skip
        url = f"http://{self.addr}:{self.ports[3]}/v1/chat/completions"
        req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return str(json.load(r)["choices"][0]["message"]["content"])
            except (OSError, urllib.error.HTTPError, KeyError) as exc:
                last = str(exc)
                time.sleep(1.0)
        raise AssertionError(f"no routed completion within {timeout:.0f} s: {last}")

    def expected_workers(self) -> dict[str, tuple[object, object]]:
        """Each unit listed with its role, at the URL the router reaches it at."""
        prefill, decode = f"http://{self.addr}:{self.ports[0]}", f"http://{self.addr}:{self.ports[2]}"
        return {prefill: ("prefill", self.ports[1]), decode: ("decode", None)}

    def evidence(self) -> str:
        """What a failed assertion shows: the router's journal and each unit's transaction events, so a
        rare failure says what removed a worker and who put it back."""
        argv = ["journalctl", "-u", ROUTER, "-n", "400", "--no-pager", "-o", "short-precise"]
        done = self.hosts[ROUTER].ssh(argv)
        out = [f"\n--- {ROUTER} journal ---\n" + (done.stdout + done.stderr).decode(errors="replace")]
        for unit in (PREFILL, DECODE):
            root = self.hosts[unit].root / "var/lib/deployctl/txn"
            for path in sorted(root.glob("*/events.jsonl"), key=lambda q: q.stat().st_mtime):
                lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
                mine = [e for e in lines if unit in json.dumps(e) or e.get("stage") == "router"]
                out.append(f"\n--- {unit}'s host, txn {path.parent.name} ---\n")
                out.extend(json.dumps(e) + "\n" for e in (mine or lines))
        return "".join(out)

    def stop(self) -> None:
        for h in {id(h): h for h in self.hosts.values()}.values():
            h.stop()


def _setup(units: list[tuple[str, str]], router_site: str | None) -> HostSetup:
    """One host's units (name, text), each with its drop-in: the simulated slice, or the router's path."""
    sim = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in SLICE.items())
    files: dict[str, tuple[bytes, int]] = {}
    for name, text in units:
        files[f"/etc/systemd/system/{name}"] = (text.encode(), 0o644)
        extra = f"[Service]\nEnvironment=PYTHONPATH={ROUTER_SITE}\n" if name == ROUTER else sim
        files[f"/etc/systemd/system/{name}.d/test.conf"] = (extra.encode(), 0o644)
    binds = {router_site: ROUTER_SITE} if router_site else {}
    return HostSetup(files, [n for n, _ in units], mount_agent=False, binds_ro=binds)


def _boot(work: Path, addr: str) -> Pair:
    import sglang_router

    from agent.group.pdapply import planned_units

    units = work / "units"
    units.mkdir()
    ports = free_ports(5)
    (units / "pd.toml").write_text(inventory(addr, ports))
    on: dict[str, list[tuple[str, str]]] = {PREFILL_HOST: [], DECODE_HOST: []}
    for unit in planned_units(load_service("pd", units), 32768):
        on[unit.host.ssh.target].append((unit.host.unit.name, unit.text))
    site = str(Path(sglang_router.__file__).resolve().parents[1])
    pair = Pair({}, work, units, {}, addr, ports)
    config = ""
    try:
        for target, router_site in ((PREFILL_HOST, site), (DECODE_HOST, None)):
            host = TestHost.create(_setup(on[target], router_site))
            pair.hosts.update({name: host for name, _ in on[target]})
            config += host.ssh_config_entry(target)
    except BaseException:
        pair.stop()
        raise
    (work / "ssh_config").write_text(config)
    pair.env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(work / "ssh_config")}
    return pair


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    addr = lan_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback address for the test hosts to reach each other at")
    work = Path(tempfile.mkdtemp(prefix="deployctl-pd2-"))
    t0 = time.monotonic()
    try:
        try:
            booted = _boot(work, addr)
        except TestHostUnavailable as exc:
            pytest.skip(f"test host unavailable: {exc}")
        try:
            booted.routed()  # the old generation serves through the router, across the hosts
            print(f"\ntwo hosts booted, the old generation serving, in {time.monotonic() - t0:.1f} s")
            yield booted
        finally:
            booted.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_1p1d_apply_over_two_hosts_commits_through_the_routers_reachable_address(pair: Pair) -> None:
    t0 = time.monotonic()
    router = pair.show(ROUTER, "InvocationID")
    r = pair.run("apply", "pd", "--context", "16k", "--yes")
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.OK, said
    assert f"wave 0: prefill[0] {PREFILL_HOST} {PREFILL}" in said, said
    assert f"wave 1: decode[0] {DECODE_HOST} {DECODE}" in said, said
    # each unit drained through the router (the decode's agent, on the other host, at the router's
    # reachable address) and put back with its role at the URL the router reaches it at
    prefill_url, decode_url = f"http://{pair.addr}:{pair.ports[0]}", f"http://{pair.addr}:{pair.ports[2]}"
    for url in (prefill_url, decode_url):
        assert f"took {url} out of the router" in said and f"put {url} back in the router" in said, said
    # the decode, the last wave, sends the routed check from its host to the router's reachable address,
    # and its own request count proves it served one
    reach = (
        f"[decode[0]] smoke: routed check: one completion through the router at {pair.addr}:{pair.ports[3]}"
    )
    assert reach in said and "[decode[0]] smoke: routed check: this unit served one" in said, said
    assert (
        pair.workers()
        == pair.expected_workers()
        == {prefill_url: ("prefill", pair.ports[1]), decode_url: ("decode", None)}
    )
    texts = pair.texts()
    assert b"--context-length 16000" in texts[PREFILL] and b"--context-length 16000" in texts[DECODE]
    assert pair.show(ROUTER, "InvocationID") == router  # its unit is unchanged: not restarted
    assert pair.routed()
    print(f"\n1P1D apply over two hosts committed in {time.monotonic() - t0:.1f} s")


def test_a_failed_decode_start_rolls_back_both_hosts_and_the_router(pair: Pair) -> None:
    t0 = time.monotonic()
    before = pair.texts()
    fault = "[Service]\nEnvironment=SGLANG_SIM_FAULT=crash_loading\n"
    fault += "Environment=SGLANG_SIM_FAULT_WHEN_CONTEXT=24000\n"  # the decode's next start only
    pair.hosts[DECODE].put(f"/etc/systemd/system/{DECODE}.d/fault.conf", fault.encode())
    (pair.units / "pd.toml").write_text(inventory(pair.addr, pair.ports, policy="random"))
    try:
        r = pair.run("apply", "pd", "--context", "24k", "--yes")
    finally:
        pair.hosts[DECODE].ssh(["rm", "-f", f"/etc/systemd/system/{DECODE}.d/fault.conf"])
        (pair.units / "pd.toml").write_text(inventory(pair.addr, pair.ports))
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.ROLLED_BACK, said
    assert "wave 2: router" in said and "decode[0] failed" in said, said
    # the router, restarted with its peers by the rollback, lists both units as the group reports (it
    # registers the workers of its command line after its /health answers: its start waits for them)
    listed = pair.workers()
    assert listed == pair.expected_workers(), f"{listed}\n{said}{pair.evidence()}"
    assert pair.texts() == before  # the prefill's host, the decode's and the router's unit: all as before
    for unit in (PREFILL, DECODE, ROUTER):
        assert pair.show(unit, "ActiveState") == "active", unit
    assert pair.routed()
    print(f"\nfailed 1P1D apply over two hosts rolled back in {time.monotonic() - t0:.1f} s")


@dataclass
class On:
    host: TestHost  # one host, for tests.faultkit's watcher and kill


# (unit, watcher step, record phase, what its host shows at the kill): the prefill's runner once its record
# says its stop is done (before its start); the decode's once it reloaded systemd on its new unit (before
# its stop: its old server still runs)
KILLS = {
    "prefill-after-its-stop": (PREFILL, "", "done=1", "inactive"),
    "decode-after-its-new-unit-is-written": (DECODE, "reload", "", "active"),
}


@pytest.mark.parametrize("at", KILLS)
def test_an_agent_killed_mid_change_leaves_one_generation_running(pair: Pair, at: str) -> None:
    """SIGKILL of one unit's runner at a step (the in-host watcher stops it there): the follower on its host
    recovers it from the recorded job list, the group aborts, and every unit on both hosts is back on the
    unit it had, running; status finds nothing left to recover."""
    unit, step, phase, state = KILLS[at]
    t0 = time.monotonic()
    pair.hosts[DECODE].ssh(["systemctl", "daemon-reload"])  # the fault's drop-in is gone
    before = pair.texts()
    router = pair.show(ROUTER, "InvocationID")
    argv = [DEPLOYCTL, "apply", "pd", "--context", "20k", "--yes"]
    with fk.Watcher(On(pair.hosts[unit]), step, phase=phase, unit=unit) as watcher:
        env = {**os.environ, **pair.env}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            hit = watcher.wait()
            assert pair.show(unit, "ActiveState") == state
            assert b"--context-length 20000" in pair.texts()[unit]  # its new unit is on disk
            fk.kill_runner(On(pair.hosts[unit]), hit.txn)
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    said = out + err
    assert proc.returncode == ExitCode.ROLLED_BACK, said
    assert "agent died" in said, said
    assert pair.texts() == before, said  # one generation: every unit on its previous text
    for name in (PREFILL, DECODE, ROUTER):
        assert pair.show(name, "ActiveState") == "active", name
    # right as the group reports: the router lists both units with their roles, and was not restarted
    # (its unit unchanged: a group rollback before left it reloaded, not reading NeedDaemonReload=yes)
    listed = pair.workers()
    assert listed == pair.expected_workers(), f"{listed}\n{said}{pair.evidence()}"
    assert pair.show(ROUTER, "InvocationID") == router, f"the router was restarted\n{said}{pair.evidence()}"
    status = pair.run("status", "pd")
    assert status.returncode == ExitCode.OK and status.stdout.count("active/running") == 3, status.stdout
    assert "recovering first" not in status.stdout + status.stderr
    assert pair.routed()
    print(f"\n{at}: killed and recovered in {time.monotonic() - t0:.1f} s")
