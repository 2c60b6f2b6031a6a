"""One simulated SGLang service over several test hosts (--nnodes): one inventory file with [nodes].

The test hosts share this machine's network, as the nodes of a real service share theirs: node 0's
rendezvous (--dist-init-addr) is 127.0.0.1:PORT, and each node gets its own HTTP port ([nodes] ports),
since two nodes cannot both listen on one port of one machine.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.group.nodes import node_hosts
from agent.inventory import load_host
from agent.render import render_unit, template_dir
from tests.helpers import wait_until
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost
from tests.testhost.instance import free_ports

UNIT = "/etc/systemd/system/sglang.service"
DROPIN = "/etc/systemd/system/sglang.service.d/sim.conf"
NAME = "k2"


@dataclass
class Group:
    work: Path
    units_dir: Path
    ssh_config: Path
    nodes: list[TestHost]  # by rank
    targets: list[str]
    env: dict[str, str]

    def unit(self, rank: int) -> str:
        return self.nodes[rank].read(UNIT).decode("utf-8", "surrogateescape")

    def set_sim_env(self, rank: int, values: Mapping[str, str]) -> None:
        body = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in {**FAST_SIM, **values}.items())
        self.nodes[rank].put(DROPIN, body.encode())

    def systemctl(self, rank: int, *args: str) -> str:
        return self.nodes[rank].ssh(["systemctl", *args]).stdout.decode().strip()

    def invocation(self, rank: int) -> str:
        return self.systemctl(rank, "show", "-p", "InvocationID", "--value", "sglang.service")

    def journals(self, lines: int = 60) -> str:
        """Every node's last journal lines about its service, systemd's own included: what a failed
        assertion shows, so a rare failure in CI says why."""
        out = []
        for rank, node in enumerate(self.nodes):
            args = [
                "journalctl",
                "-u",
                "sglang.service",
                "-n",
                str(lines),
                "--no-pager",
                "-o",
                "short-precise",
            ]
            done = node.ssh(args)
            text = (done.stdout + done.stderr).decode(errors="replace")
            out.append(f"\n--- rank {rank} journal ---\n{text}")
        return "".join(out)

    def backups(self, rank: int) -> list[str]:
        folder = self.nodes[rank].root / "etc/systemd/system"
        return sorted(p.name for p in folder.glob("sglang.service.bak.*"))

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _inventory(
    targets: Sequence[str], ports: Sequence[int], rendezvous: int, groups: Sequence[str] = ()
) -> str:
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r"(?m)^port = \d+$", f"port = {ports[0]}", text)
    text = re.sub(r'(?m)^target = "ct200-sim"', f'target = "{targets[0]}"', text)
    if groups:
        text = "groups = [" + ", ".join(f'"{g}"' for g in groups) + "]\n" + text
    if len(targets) == 1:
        return text
    others = ", ".join(f'"{t}"' for t in targets[1:])
    more = ", ".join(str(p) for p in ports[1:])
    return (
        f"{text}\n[nodes]\nothers = [{others}]\nports = [{more}]\n"
        f'dist_init_addr = "127.0.0.1:{rendezvous}"\nwait_s = 120\n'
    )


def _start(service: str, units: Path, sim_env: Sequence[Mapping[str, str]]) -> list[TestHost]:
    """Boot one test host per node of units/<service>.toml, each running its node's unit."""
    started: list[TestHost] = []
    for rank, node in enumerate(node_hosts(load_host(service, units))):
        env = {**FAST_SIM, **(sim_env[rank] if rank < len(sim_env) else {})}
        dropin = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in env.items())
        unit = render_unit(node, {}, template_dir())
        files = {UNIT: (unit.encode(), 0o644), DROPIN: (dropin.encode(), 0o644)}
        started.append(TestHost.create(HostSetup(files, ["sglang.service"], mount_agent=False)))
    return started


def _ssh_entry(target: str, host: TestHost) -> str:
    return (
        f"Host {target}\n  HostName 127.0.0.1\n  Port {host.ssh_port}\n  User root\n"
        f"  IdentityFile {host.ssh_key_path}\n  UserKnownHostsFile {host.known_hosts_path}\n"
        "  IdentitiesOnly yes\n"
    )


def boot(count: int, sim_env: Sequence[Mapping[str, str]] = ()) -> Group:
    """`count` test hosts running one service at the baseline (32k context), every node started."""
    work = Path(tempfile.mkdtemp(prefix="deployctl-group-"))
    units = work / "units"
    units.mkdir()
    targets = [f"{NAME}-{chr(ord('a') + n)}" for n in range(count)]
    *ports, rendezvous = free_ports(count + 1)
    (units / f"{NAME}.toml").write_text(_inventory(targets, ports, rendezvous))
    group = Group(work, units, work / "ssh_config", [], targets, {})
    try:
        group.nodes.extend(_start(NAME, units, sim_env))
        group.ssh_config.write_text(
            "".join(_ssh_entry(t, h) for t, h in zip(targets, group.nodes, strict=True))
        )
        group.env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(group.ssh_config)}
        return group
    except BaseException:
        group.stop()
        raise


@dataclass
class Mixed:
    """Test hosts by SSH target, one units folder: services of one node and of several."""

    work: Path
    hosts: dict[str, TestHost]
    env: dict[str, str]

    def unit(self, target: str) -> bytes:
        return self.hosts[target].read(UNIT)

    def set_sim_env(self, target: str, values: Mapping[str, str]) -> None:
        body = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in {**FAST_SIM, **values}.items())
        self.hosts[target].put(DROPIN, body.encode())

    def stop(self) -> None:
        for host in self.hosts.values():
            host.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return int(r.status) == 200
    except OSError:
        return False


def boot_mixed_fleet() -> Mixed:
    """Group "mixed": pair.toml, a two-node service on pair-0 (rank 0) and pair-1, and solo.toml, a
    one-host service on solo; all at the baseline and started."""
    work = Path(tempfile.mkdtemp(prefix="deployctl-mixed-"))
    units = work / "units"
    units.mkdir()
    p0, p1, rendezvous, solo = free_ports(4)
    (units / "pair.toml").write_text(_inventory(["pair-0", "pair-1"], [p0, p1], rendezvous, ["mixed"]))
    (units / "solo.toml").write_text(_inventory(["solo"], [solo], 0, ["mixed"]))
    mixed = Mixed(work, {}, {})
    try:
        mixed.hosts.update(zip(["pair-0", "pair-1"], _start("pair", units, ()), strict=True))
        mixed.hosts["solo"] = _start("solo", units, ())[0]
        ssh_config = work / "ssh_config"
        ssh_config.write_text("".join(_ssh_entry(t, h) for t, h in mixed.hosts.items()))
        mixed.env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
        wait_until(lambda: all(_healthy(port) for port in (p0, solo)), timeout=240, interval=1)
        return mixed
    except BaseException:
        mixed.stop()
        raise
