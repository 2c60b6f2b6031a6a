"""A local test host running the simulated ct200 at the seed's baseline, reachable as `ct200-sim`."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agent.inventory import load_host
from agent.render import render_unit, template_dir
from tests.testhost import HostSetup, TestHost

REPO = Path(__file__).resolve().parents[1]
NAME = "ct200-sim"
# Short simulated delays: a start takes a few seconds instead of the real ten minutes.
FAST_SIM = {
    "SGLANG_SIM_LOAD_SECONDS": "1.5",
    "SGLANG_SIM_STEP_SECONDS": "0.1",
    "SGLANG_SIM_WARMUP_SECONDS": "0.2",
}
# The `sglang` console script of SGLang's wheel (entry point sglang.cli.main:main): `sglang serve ...`.
SGLANG_SCRIPT = b"#!/usr/bin/python3\nimport sys\nfrom sglang.cli.main import main\nsys.exit(main())\n"


@dataclass
class SimHost:
    host: TestHost
    work: Path
    units_dir: Path
    ssh_config: Path
    name: str = NAME
    env: dict[str, str] = field(default_factory=dict)

    def set_sim_env(self, values: Mapping[str, str]) -> None:
        """Change the simulated hardware or inject a fault through a systemd drop-in (no daemon-reload)."""
        body = "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in {**FAST_SIM, **values}.items())
        self.host.put("/etc/systemd/system/sglang.service.d/sim.conf", body.encode())

    def unit_text(self) -> str:
        return self.host.read("/etc/systemd/system/sglang.service").decode("utf-8", "surrogateescape")

    def backups(self) -> list[str]:
        directory = self.host.root / "etc/systemd/system"
        return sorted(p.name for p in directory.glob("sglang.service.bak.*"))

    def stop(self) -> None:
        self.host.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _inventory(work: Path, sglang_port: int) -> Path:
    units = work / "units"
    units.mkdir()
    text = (REPO / "units" / f"{NAME}.toml").read_text()
    text = re.sub(r"(?m)^port = \d+$", f"port = {sglang_port}", text)
    (units / f"{NAME}.toml").write_text(text)
    return units


def boot(sim_env: Mapping[str, str] | None = None) -> SimHost:
    """Boot a test host with the baseline unit (32k context, 0.85, 64 requests) enabled and running."""
    work = Path(tempfile.mkdtemp(prefix="deployctl-sim-"))
    host: TestHost | None = None
    try:
        from tests.testhost.instance import free_ports

        (sglang_port,) = free_ports(1)
        units = _inventory(work, sglang_port)
        cfg = load_host(NAME, units)
        unit = render_unit(cfg, {}, template_dir())
        dropin = "[Service]\n" + "".join(
            f"Environment={k}={v}\n" for k, v in {**FAST_SIM, **(sim_env or {})}.items()
        )
        files = {
            "/etc/systemd/system/sglang.service": (unit.encode(), 0o644),
            "/etc/systemd/system/sglang.service.d/sim.conf": (dropin.encode(), 0o644),
            "/usr/local/bin/sglang": (SGLANG_SCRIPT, 0o755),
        }
        host = TestHost.create(HostSetup(files, ["sglang.service"], mount_agent=False))
        ssh_config = work / "ssh_config"
        ssh_config.write_text(host.ssh_config_entry(NAME))
        env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
        return SimHost(host, work, units, ssh_config, env=env)
    except BaseException:
        if host is not None:
            host.stop()
        shutil.rmtree(work, ignore_errors=True)
        raise


@contextmanager
def booted(sim_env: Mapping[str, str] | None = None) -> Iterator[SimHost]:
    sim = boot(sim_env)
    old = {k: os.environ.get(k) for k in sim.env}
    os.environ.update(sim.env)
    try:
        yield sim
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sim.stop()


# --- a unit written by hand, for `deployctl adopt` (the adopt test and `make demo`) ---------------------

TOKEN = "hf_'q\"$x`y"  # a secret with quotes, a dollar and a backtick, inline in the unit as people do
DROP_IN = "[Service]\nEnvironment=FROM_DROP_IN=1\nLimitCORE=0\n"


def hand_unit(port: int) -> str:
    """Written by hand: `sglang serve`, odd but valid quoting, a token inline, extra directives."""
    token = TOKEN.replace("\\", "\\\\").replace('"', '\\"')
    return f"""# SGLang on ct200, by hand
[Unit]
Description=SGLang by hand 100%%
After=network-online.target
StartLimitIntervalSec=0

[Service]
User=sglang
Group=sglang
Environment="SGLANG_LOG_MS=1" 'NOTE=two  spaces' HF_TOKEN="{token}"
ExecStartPre=/bin/sh -c 'test -d /tmp || exit 1'
ExecStart=/usr/local/bin/sglang serve --model-path /models/Kimi-K2.6 \\
    --served-model-name "kimi-k2.6" '--tp-size=8' --context-length 32768 \\
# the baseline the team agreed on
    --mem-fraction-static 0.85 --max-running-requests 64 --chunked-prefill-size 8192 \\
    --trust-remote-code --speculative-algorithm DFLASH \\
    --speculative-draft-model-path "/models/Kimi-K2.6-DFlash" --host 127.0.0.1 --port {port}
LimitNOFILE=524288
Nice=5
CPUAffinity=0
Restart=on-failure
RestartSec=7
KillMode=mixed
TimeoutStopSec=20

[Install]
WantedBy=multi-user.target
"""


def install_hand_written(sim: SimHost, text: str) -> None:
    """Replace the rendered unit by a hand-written one (plus a drop-in of its own) and restart it."""
    made = sim.host.ssh(["useradd", "--system", "--no-create-home", "--user-group", "sglang"])
    if made.returncode != 0:
        raise RuntimeError(f"useradd sglang: {made.stderr.decode().strip()}")
    sim.host.put("/etc/systemd/system/sglang.service", text.encode())
    sim.host.put("/etc/systemd/system/sglang.service.d/10-hand.conf", DROP_IN.encode())
    done = sim.host.ssh(["sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service"])
    if done.returncode != 0:
        raise RuntimeError(f"restart of the hand-written unit: {done.stderr.decode().strip()}")
