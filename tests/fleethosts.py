"""Several simulated ct200 test hosts at once, in one inventory folder with groups, for fleet tests."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.inventory import load_host
from agent.render import render_unit, template_dir
from tests.simhost import FAST_SIM, REPO
from tests.testhost import HostSetup, TestHost
from tests.testhost.instance import free_ports

UNIT = "/etc/systemd/system/sglang.service"
DROPIN = "/etc/systemd/system/sglang.service.d/sim.conf"


@dataclass(frozen=True)
class HostSpec:
    name: str
    groups: tuple[str, ...]
    sim_env: Mapping[str, str] = field(default_factory=dict)
    started: bool = True  # False: the unit is installed but never started (no start to calibrate from)


@dataclass
class Fleet:
    work: Path
    units_dir: Path
    ssh_config: Path
    hosts: dict[str, TestHost]
    env: dict[str, str]

    def unit(self, name: str) -> bytes:
        return self.hosts[name].read(UNIT)

    def set_sim_env(self, name: str, values: Mapping[str, str]) -> None:
        body = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in {**FAST_SIM, **values}.items())
        self.hosts[name].put(DROPIN, body.encode())

    def backups(self, name: str) -> list[str]:
        return sorted(
            p.name for p in (self.hosts[name].root / "etc/systemd/system").glob("sglang.service.bak.*")
        )

    def stop(self) -> None:
        for host in self.hosts.values():
            host.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _host_file(spec: HostSpec, sglang_port: int) -> str:
    text = (REPO / "units/ct200-sim.toml").read_text()
    text = re.sub(r"(?m)^port = \d+$", f"port = {sglang_port}", text)
    text = re.sub(r'(?m)^target = "ct200-sim"', f'target = "{spec.name}"', text)
    groups = ", ".join(f'"{g}"' for g in spec.groups)
    return f"groups = [{groups}]\n{text}"


def boot(specs: Sequence[HostSpec]) -> Fleet:
    work = Path(tempfile.mkdtemp(prefix="deployctl-fleet-"))
    units = work / "units"
    units.mkdir()
    fleet = Fleet(work, units, work / "ssh_config", {}, {})
    try:
        config = []
        for spec in specs:
            (port,) = free_ports(1)
            (units / f"{spec.name}.toml").write_text(_host_file(spec, port))
            unit = render_unit(load_host(spec.name, units), {}, template_dir())
            dropin = "[Service]\n" + "".join(
                f"Environment={k}={v}\n" for k, v in {**FAST_SIM, **spec.sim_env}.items()
            )
            files = {UNIT: (unit.encode(), 0o644), DROPIN: (dropin.encode(), 0o644)}
            enabled = ["sglang.service"] if spec.started else []
            host = TestHost.create(HostSetup(files, enabled, mount_agent=False))
            fleet.hosts[spec.name] = host
            config.append(
                f"Host {spec.name}\n  HostName 127.0.0.1\n  Port {host.ssh_port}\n  User root\n"
                f"  IdentityFile {host.ssh_key_path}\n  UserKnownHostsFile {host.known_hosts_path}\n"
                "  IdentitiesOnly yes\n"
            )
        fleet.ssh_config.write_text("".join(config))
        fleet.env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(fleet.ssh_config)}
        return fleet
    except BaseException:
        fleet.stop()
        raise
