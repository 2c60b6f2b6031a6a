"""A real 1P1D on a test host's CPU from deployctl's own units: the real SGLang 0.5.23 as a prefill and a
decode moving KV with Mooncake over TCP, sglang-router 0.3.2 in PD mode in front
(shared/sglang/PD-AND-HICACHE-ON-CPU.md).

`inventory()` is the [pd] file of that pair: the real tier's CPU flags, each unit's `environment` with the
switches the CPU needs, `mooncake_tcp`. `deployctl render` turns it into the three units this host installs.
The PD add-on (`make real-sglang`: tests/realsglang/build-pd.sh) is bind-mounted read-only at HOST_PD, next
to the venv, the model and the stand-ins of tests/realhost.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests import realhost
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, free_ports

TARGET = "real-pd"
SERVICE = "tiny-pd"
PREFILL, DECODE, ROUTER = (f"{SERVICE}-{role}.service" for role in ("prefill-0", "decode-0", "router"))
HOST_PD = "/opt/deployctl-real-pd"
CONTEXT = "4096"
# Every switch the CPU pair needs beyond the one-server recipe, with the SGLang line that needs it.
SHARED_ENV = {
    **realhost.ENVIRONMENT,
    "OMP_NUM_THREADS": "1",  # two servers on two cores
    # the KV manager, the bootstrap registration and Mooncake's RPC bind it (srt/utils/network.py:417)
    "SGLANG_HOST_IP": "127.0.0.1",
    "PYTHONPATH": f"{realhost.HOST_SITE}:{HOST_PD}/site",  # the stand-ins first, then mooncake
    "LD_LIBRARY_PATH": f"{HOST_PD}/lib",  # mooncake's engine.so links libibverbs.so.1 even over TCP
}
PREFILL_ENV = {
    # the CPU wheel has no pinned memory nor torch.cuda.Event (srt/disaggregation/prefill.py:1746-1761)
    "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1",
    # a cached prefix sent early records a torch.cuda.Event (srt/disaggregation/prefill.py:1494-1497)
    "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0",
}
# Router health checks every 5 s (60 s by default): a decode restart is seen within the test.
ROUTER_FLAGS = {
    "policy": "round_robin",
    "health-check-interval-secs": 5,
    "health-failure-threshold": 2,
    "health-success-threshold": 1,
}


def addon_dir() -> Path:
    default = realhost.CACHE / "real-sglang-pd-0.5.23"
    return Path(os.environ.get("DEPLOYCTL_REAL_SGLANG_PD") or default)


def missing() -> str | None:
    """Why the real 1P1D cannot run here (None when it can)."""
    if not (addon_dir() / ".pd-stamp").is_file():
        return f"no PD add-on at {addon_dir()} (make real-sglang)"
    return realhost.missing()


@dataclass(frozen=True)
class Ports:
    prefill: int
    bootstrap: int
    decode: int
    router: int


def _toml(value: object) -> str:
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # strings, numbers, booleans and lists are JSON's spelling in TOML too


def inventory(
    ports: Ports,
    decode_flags: Mapping[str, object] | None = None,
    decode_env: Mapping[str, str] | None = None,
) -> str:
    """The [pd] file of the real pair; decode_flags are added to the decode's own flags, decode_env to its
    own environment."""
    python = f"{realhost.venv_dir()}/bin/python"
    decode = {
        "max-running-requests": 2,
        # decode's default retraction backup builds a HiCache host pool, which needs CUDA
        # (srt/mem_cache/kv_cache_builder.py:227-240)
        "disaggregation-decode-retraction-backup": "cpu_tensor",
        **(decode_flags or {}),
    }
    return f"""# The real 1P1D on the test host's CPU (tests/realpd.py); the two "GPUs" keep the units apart.
[ssh]
target = "{TARGET}"

[gpus]
indices = [0, 1]
memory_gib = 16
name = "CPU"

[model]
path = "{realhost.HOST_MODEL}"
served_name = "{realhost.SERVED}"
attention = "gqa"
layers = 2
kv_heads = 2
head_dim = 32
dtype_bytes = 2
weights_gib_per_gpu = 0.01
max_context = {CONTEXT}

[unit]
name = "{SERVICE}.service"
description = "SGLang on CPU (PD)"
environment = {_toml(SHARED_ENV)}

[sglang]
executable = {_toml([python, "-m", "sglang.launch_server"])}
version = "0.5.23"
host = "127.0.0.1"
port = {ports.router}

[sglang.flags]
device = "cpu"
load-format = "dummy"
attention-backend = "torch_native"
max-total-tokens = {realhost.POOL}
page-size = 1

[smoke]
random_weights = true  # the routed check: any answer, once usage shows the prompt whole

[pd]
transfer_backend = "mooncake_tcp"

[[pd.prefill]]
gpus = [0]
port = {ports.prefill}
bootstrap_port = {ports.bootstrap}
flags = {{ enable-metrics = true }}
environment = {_toml(PREFILL_ENV)}

[[pd.decode]]
gpus = [1]
port = {ports.decode}
flags = {_toml(decode)}
{f"environment = {_toml(decode_env)}" if decode_env else ""}

[pd.router]
port = {ports.router}
host = "127.0.0.1"
executable = {_toml([python, "-m", "sglang_router.launch_router"])}
flags = {_toml(ROUTER_FLAGS)}
environment = {_toml({"PYTHONPATH": f"{HOST_PD}/site"})}
"""


def binds() -> dict[str, str]:
    return {**realhost.binds(), str(addon_dir()): HOST_PD}


def http(port: int, path: str, body: object = None, timeout: float = 60) -> tuple[int, object]:
    """(status, JSON or text) of a GET, or a POST of a JSON body; an HTTP error is a status too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    return status, json.loads(text) if text.strip().startswith(("{", "[")) else text


def healthy(port: int) -> bool:
    try:
        return http(port, "/health", timeout=5)[0] == 200
    except (OSError, ValueError):
        return False


@dataclass
class PdHost:
    host: TestHost
    work: Path
    ports: Ports

    @property
    def units_dir(self) -> Path:
        return self.work / "units"

    def deployctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The real CLI against this host (through its SSH config), as cron would run it."""
        env = {
            **os.environ,
            "DEPLOYCTL_UNITS": str(self.units_dir),
            "DEPLOYCTL_SSH_CONFIG": str(self.work / "ssh_config"),
        }
        return subprocess.run(
            [realhost.DEPLOYCTL, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def write_inventory(
        self, decode_flags: Mapping[str, object] | None = None, decode_env: Mapping[str, str] | None = None
    ) -> None:
        (self.units_dir / f"{SERVICE}.toml").write_text(inventory(self.ports, decode_flags, decode_env))

    def render(self) -> dict[str, str]:
        """`deployctl render` of the [pd] file: unit name -> text; each on this host."""
        r = self.deployctl("render", SERVICE, "--context", CONTEXT, "--json")
        if r.returncode != 0:
            raise AssertionError(f"deployctl render exited {r.returncode}: {r.stderr}")
        units = json.loads(r.stdout)["units"]
        assert {u["target"] for u in units} == {TARGET}
        return {u["unit_name"]: u["unit"] for u in units}

    def install(self, units: Mapping[str, str]) -> None:
        for name, text in units.items():
            self.host.put(f"/etc/systemd/system/{name}", text.encode())
        self.systemctl("daemon-reload")

    def systemctl(self, *args: str) -> str:
        done = self.host.ssh(["systemctl", *args])
        if done.returncode != 0 and args[0] not in ("is-active", "show"):
            raise RuntimeError(f"systemctl {' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout.decode().strip()

    def invocation(self, unit: str) -> str:
        return self.systemctl("show", "-p", "InvocationID", "--value", unit)

    def journal(self, unit: str, invocation: str | None = None) -> str:
        argv = ["journalctl", "--no-pager", "-o", "cat"]
        argv += [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", unit]
        return self.host.ssh(argv).stdout.decode(errors="replace")

    def wait_ready(self, unit: str, port: int, timeout: float = realhost.START_TIMEOUT_S) -> float:
        """Seconds until the unit's /health answers 200 (a real server answers once it is fired up)."""
        started = time.monotonic()
        while not healthy(port):
            died = self.systemctl("show", "-p", "NRestarts", "--value", unit) not in ("", "0")
            if died or time.monotonic() - started > timeout:
                tail = "\n".join(self.journal(unit).splitlines()[-30:])
                raise AssertionError(f"{unit} not ready after {time.monotonic() - started:.0f} s:\n{tail}")
            time.sleep(0.5)
        return time.monotonic() - started

    def wait_routed(self, timeout: float = 60) -> float:
        """Seconds until the router counts the prefill and the decode healthy (GET /workers)."""
        started = time.monotonic()
        while True:
            try:
                status, doc = http(self.ports.router, "/workers", timeout=5)
            except (OSError, ValueError):  # not listening yet
                status, doc = 0, None
            if status == 200 and healthy_workers(doc) == {"prefill", "decode"}:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"the router's workers after {timeout:.0f} s: {doc}")
            time.sleep(0.5)


def healthy_workers(doc: object) -> set[str]:
    """The worker types the router's GET /workers counts healthy."""
    workers = doc.get("workers") if isinstance(doc, dict) else doc
    if not isinstance(workers, list):
        return set()
    return {str(w.get("worker_type")) for w in workers if isinstance(w, dict) and w.get("is_healthy")}


def _imports(host: TestHost) -> None:
    """What SGLang imports at its first transfer, and the router, with the units' own paths on the host: a
    library the host lacks is named in a second, not after a start's 300 s wait."""
    env = [f"{k}={v}" for k, v in SHARED_ENV.items() if k in ("PYTHONPATH", "LD_LIBRARY_PATH")]
    code = "from mooncake.engine import TransferEngine; import sglang_router.launch_router"
    done = host.ssh(["env", *env, f"{realhost.venv_dir()}/bin/python", "-c", code])
    if done.returncode != 0:
        raise AssertionError(f"the PD add-on does not import on the test host: {done.stderr.decode()[-600:]}")


@contextmanager
def booted() -> Iterator[PdHost]:
    """A test host with the real-SGLang venv, model, stand-ins and PD add-on bound in; nothing started."""
    why = missing()
    if why:
        raise TestHostUnavailable(why)
    work = Path(tempfile.mkdtemp(prefix="deployctl-realpd-"))
    (work / "units").mkdir()
    try:
        host = TestHost.create(HostSetup(mount_agent=False, binds_ro=binds()))
        try:
            _imports(host)
            (work / "ssh_config").write_text(host.ssh_config_entry(TARGET))
            yield PdHost(host, work, Ports(*free_ports(4)))
        finally:
            # a server draining a held request would make the poweroff wait out its 30 s: nothing to keep
            host.ssh(["systemctl", "kill", "--signal=SIGKILL", PREFILL, DECODE, ROUTER])
            host.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
