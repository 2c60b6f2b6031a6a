"""A local test host that runs the real SGLang 0.5.23 on its CPU from a hand-written unit: `real-cpu`.

The real-SGLang venv (`make real-sglang`, tests/realsglang) and the tiny model are built once per machine
and bind-mounted read-only into the nspawn host: the venv at the same path (Debian's /usr/bin/python3.11
made it and the host's rootfs has the same interpreter there), the model at /models/tiny, the import
stand-ins at /opt/deployctl-real-site (on the unit's PYTHONPATH). Every start is bounded by
--max-total-tokens: on CPU the default pool is sized from free RAM (15 GB for this model).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.testhost import HostSetup, TestHost, TestHostUnavailable, free_ports

REPO = Path(__file__).resolve().parents[1]
NAME = "real-cpu"
UNIT = "sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
CACHE = Path.home() / ".cache/deployctl"
SITE = REPO / "tests/realsglang/site"
HOST_SITE = "/opt/deployctl-real-site"
HOST_MODEL = "/models/tiny"
SERVED = "tiny"
POOL = 16384  # --max-total-tokens of the hand-written unit: 8 MiB of KV cache for the toy model
# A real start is 24-28 s on a quiet machine, 50-110 s on a 2-core one shared by several test runs (mostly
# Python imports, read from a cold page cache the first time); every wait allows about three times that.
START_TIMEOUT_S = 300.0
TRACE = "/var/tmp/sglang-standins.trace"  # inside the host: DEPLOYCTL_STANDIN_TRACE of a traced unit
DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))


def venv_dir() -> Path:
    return Path(os.environ.get("DEPLOYCTL_REAL_SGLANG_VENV") or CACHE / "real-sglang-0.5.23")


def model_dir() -> Path:
    return Path(os.environ.get("DEPLOYCTL_REAL_SGLANG_MODEL") or CACHE / "real-sglang-tiny-model")


def missing() -> str | None:
    """Why the real SGLang cannot run here (None when it can): the venv or the model is not built."""
    if not (venv_dir() / ".real-stamp").is_file():
        return f"no real-SGLang venv at {venv_dir()} (make real-sglang)"
    if not (model_dir() / ".model-stamp").is_file():
        return f"no tiny model at {model_dir()} (make real-sglang)"
    return None


ENVIRONMENT = {
    "SGLANG_USE_CPU_ENGINE": "1",  # is_cpu() (srt/utils/common.py:221) is False without it
    "OMP_NUM_THREADS": "2",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONPATH": HOST_SITE,  # sitecustomize.py: the import stand-ins, for every SGLang process
    "HF_HUB_OFFLINE": "1",  # nothing to download: the model folder is local
}


def server_flags(port: int, pool: int = POOL) -> list[str]:
    return [
        f"--model-path {HOST_MODEL}",
        f"--served-model-name {SERVED}",
        "--device cpu --load-format dummy --attention-backend torch_native",
        f"--max-total-tokens {pool}",
        f"--host 127.0.0.1 --port {port}",
    ]


def hand_unit(port: int, pool: int = POOL, env: Mapping[str, str] | None = None) -> str:
    """The real SGLang as a person would write its unit: default KillMode (control-group), niced."""
    assignments = " ".join(f"{k}={v}" for k, v in {**ENVIRONMENT, **(env or {})}.items())
    flags = " \\\n    ".join(server_flags(port, pool))
    return f"""# SGLang 0.5.23 on this host's CPU, written by hand
[Unit]
Description=SGLang (CPU) by hand
After=network-online.target
StartLimitIntervalSec=0

[Service]
Environment={assignments}
ExecStart={venv_dir()}/bin/python -m sglang.launch_server \\
    {flags}
Nice=10
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
"""


@dataclass
class RealHost:
    host: TestHost
    work: Path
    units_dir: Path
    ssh_config: Path
    hand: str
    port: int
    name: str = NAME
    env: dict[str, str] = field(default_factory=dict)
    first_start_s: float = 0.0
    adopted: str | None = None  # units/real-cpu.toml as `deployctl adopt` wrote it from the hand-written unit

    def unit_text(self) -> str:
        return self.host.read(UNIT_PATH).decode("utf-8", "surrogateescape")

    def backups(self) -> list[str]:
        return sorted(p.name for p in (self.host.root / "etc/systemd/system").glob(f"{UNIT}.bak.*"))

    def systemctl(self, *args: str) -> str:
        out = self.host.ssh(["systemctl", *args])
        return out.stdout.decode().strip()

    def invocation(self) -> str:
        return self.systemctl("show", "-p", "InvocationID", "--value", UNIT)

    def http(self, path: str, body: object = None, key: str | None = None, timeout: float = 60) -> object:
        """GET (or POST a JSON body) to the server; raises urllib's HTTPError on a non-2xx answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw.strip().startswith((b"{", b"[")) else raw.decode()

    def healthy(self) -> bool:
        return _healthy(self.port)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        """Seconds until /health answers 200 (the real server answers only once it is fired up)."""
        started = time.monotonic()
        while not self.healthy():
            state = self.systemctl("is-active", UNIT)
            if state == "failed" or time.monotonic() - started > timeout:
                tail = self.journal(lines=30)
                raise AssertionError(f"real SGLang not ready after {timeout:.0f} s ({state}):\n{tail}")
            time.sleep(0.5)
        return time.monotonic() - started

    def server_info(self) -> dict[str, object]:
        info = self.http("/server_info")
        assert isinstance(info, dict)
        return info

    def pool(self) -> int:
        return int(str(self.server_info()["max_total_num_tokens"]))

    def journal(self, lines: int = 200, invocation: str | None = None) -> str:
        """The unit's journal (this invocation's only, when given), as plain message lines."""
        argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines)]
        argv += [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", UNIT]
        return self.host.ssh(argv).stdout.decode(errors="replace")

    def install_unit(self, text: str) -> float:
        """Write a unit by hand, restart it and wait until it serves; the seconds that took."""
        self.host.put(UNIT_PATH, text.encode())
        done = self.host.ssh(["sh", "-c", f"systemctl daemon-reload && systemctl restart {UNIT}"])
        if done.returncode != 0:
            raise RuntimeError(f"restart of the hand-written unit: {done.stderr.decode().strip()}")
        return self.wait_ready()

    def ensure_hand(self) -> None:
        """The hand-written unit running and serving, with no secrets left by a test (a restart only if
        something else is installed)."""
        secrets = self.host.root / "etc/deployctl/secrets"
        if self.unit_text() == self.hand and not any(secrets.glob("*")) and self.healthy():
            return
        shutil.rmtree(secrets, ignore_errors=True)
        self.install_unit(self.hand)

    def deployctl(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """The real CLI against this host, as cron would run it (no terminal)."""
        env = {**os.environ, **self.env}
        return subprocess.run(
            [DEPLOYCTL, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def adopt(self) -> Path:
        """`deployctl adopt` of the running unit into units/real-cpu.toml (replacing an earlier one)."""
        r = self.deployctl("adopt", self.name, "--ssh", self.name, "--force")
        if r.returncode != 0:
            raise AssertionError(f"deployctl adopt exited {r.returncode}: {r.stderr}")
        path = self.units_dir / f"{self.name}.toml"
        if self.unit_text() == self.hand:
            self.adopted = path.read_text()
        return path

    def inventory(self, flags: str = "", **sections: str) -> Path:
        """units/real-cpu.toml: the hand-written unit's adoption (adopted once), plus TOML lines for
        [sglang.flags] and more sections (name -> body). Its smoke test expects no word: random weights."""
        if self.adopted is None:
            self.ensure_hand()
            self.adopt()
        assert self.adopted is not None
        text = self.adopted.replace(
            "[sglang.flags]\n", f"[sglang.flags]\n{flags}\n" if flags else "[sglang.flags]\n"
        )
        sections = {
            "smoke": "random_weights = true  # any answer, once usage shows the prompt whole",
            **sections,
        }
        text += "".join(f"\n[{name}]\n{body}\n" for name, body in sections.items())
        path = self.units_dir / f"{self.name}.toml"
        path.write_text(text)
        return path

    def stop(self) -> None:
        self.host.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def binds() -> dict[str, str]:
    """The venv (same path inside), the model, and the stand-ins, all read-only."""
    venv = str(venv_dir())
    return {venv: venv, str(model_dir()): HOST_MODEL, str(SITE): HOST_SITE}


def _start_hand(host: TestHost, pool: int, env: Mapping[str, str] | None) -> tuple[str, int]:
    """Write the hand-written unit on a port free right now and start it: (its text, its port). Ports are
    picked while other test runs start servers too; the real SGLang does not exit when its port is taken
    (uvicorn's "[Errno 98] ... address already in use", then it waits), so that line means: another port."""
    for _ in range(3):
        (port,) = free_ports(1)
        hand = hand_unit(port, pool, env)
        host.put(UNIT_PATH, hand.encode())
        host.ssh(["sh", "-c", f"systemctl daemon-reload && systemctl restart {UNIT}"])
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if _healthy(port):
                return hand, port
            inv = (
                host.ssh(["systemctl", "show", "-p", "InvocationID", "--value", UNIT]).stdout.decode().strip()
            )
            said = host.ssh(["journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={inv}"]).stdout
            if b"address already in use" in said:
                break
            time.sleep(0.5)
        else:
            tail = host.ssh(["journalctl", "--no-pager", "-o", "cat", "-n", "30", "-u", UNIT]).stdout.decode()
            raise AssertionError(f"real SGLang not ready after {START_TIMEOUT_S:.0f} s:\n{tail}")
    raise AssertionError("real SGLang found its port taken three times")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):
        return False


def boot(pool: int = POOL, trace: bool = False) -> RealHost:
    """Boot a test host whose hand-written real unit is enabled; return once the server serves.
    trace: the unit traces every use of an import stand-in to TRACE."""
    why = missing()
    if why:
        raise TestHostUnavailable(why)
    work = Path(tempfile.mkdtemp(prefix="deployctl-real-"))
    host: TestHost | None = None
    try:
        host = TestHost.create(HostSetup(enable_units=[UNIT], mount_agent=False, binds_ro=binds()))
        started = time.monotonic()
        hand, port = _start_hand(host, pool, {"DEPLOYCTL_STANDIN_TRACE": TRACE} if trace else None)
        units = work / "units"
        units.mkdir()
        ssh_config = work / "ssh_config"
        ssh_config.write_text(host.ssh_config_entry(NAME))
        env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(ssh_config)}
        real = RealHost(host, work, units, ssh_config, hand, port, env=env)
        real.first_start_s = time.monotonic() - started
        return real
    except BaseException:
        if host is not None:
            host.stop()
        shutil.rmtree(work, ignore_errors=True)
        raise


@contextmanager
def booted(pool: int = POOL, trace: bool = False) -> Iterator[RealHost]:
    real = boot(pool, trace)
    try:
        yield real
    finally:
        real.stop()
