"""One throwaway test host: systemd as PID 1 in systemd-nspawn, reached over sshd on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tests.oracle import client as oracle_client
from tests.testhost import cgroups
from tests.testhost.models import ensure_models
from tests.testhost.rootfs import STATE_DIR, TestHostUnavailable, ensure_rootfs

REPO = Path(__file__).resolve().parents[2]
INSTANCES = STATE_DIR / "instances"
SIM_SGLANG = REPO / "tests/sim/sglang"
SIM_TARGET = "/usr/local/lib/python3.11/dist-packages/sglang"
SIM_MOONCAKE = REPO / "tests/sim/mooncake"  # the transfer backend a [pd] apply's facts look for
AGENT_ROOT = "/opt/deployctl"  # PYTHONPATH inside the host for the bound agent/ and jeepney/
READY_STATES = ("running", "degraded")
ORACLE_DIR = REPO / "tests/oracle"
FileSpec = tuple[bytes, int]


@dataclass(frozen=True)
class HostSetup:
    """What a new instance holds besides the root filesystem: files written into it (path -> bytes and
    mode), units enabled before boot, the agent's source mounted, and more read-only binds (source ->
    path inside)."""

    files: Mapping[str, FileSpec] = field(default_factory=dict)
    enable_units: Sequence[str] = ()
    mount_agent: bool = True
    binds_ro: Mapping[str, str] = field(default_factory=dict)
    binds_rw: Mapping[str, str] = field(default_factory=dict)  # writable binds (a simulated meminfo's folder)


class BootError(RuntimeError):
    """The test host did not come up; the message carries the tail of its console."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now, distinct from each other, below the kernel's ephemeral range.

    A port from that range (what binding port 0 gives) can be taken by any outgoing connection before the
    server binds it: real SGLang opens its own TCP connections (torch's store, gloo) during start-up and
    binds HTTP last, and a CI run once saw its HTTP port taken so ("[Errno 98] address already in use").
    """
    high = _ephemeral_low() - 1
    picked: list[int] = []
    while len(picked) < count:
        port = random.randint(max(1024, high - 12000), high)
        if port in picked:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
    return picked


def oracle_binds() -> dict[str, str]:
    """SGLang's own sizing for the simulated server: the client, and the venv where one is built."""
    binds = {str(ORACLE_DIR): "/opt/deployctl-oracle"}
    venv = oracle_client.venv_dir()
    if oracle_client.venv_ready(venv):
        binds[str(venv)] = str(oracle_client.HOST_VENV)
    return binds


def _keygen(path: Path, comment: str) -> None:
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
    subprocess.run(argv, check=True, capture_output=True)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name may hold spaces; the parent pid comes right after its closing paren.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _leader(pid: int) -> int:
    """The container's init among nspawn's children: the one running systemd."""
    for kid in _children(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{kid}/comm").read_text().strip() == "systemd":
                return kid
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


class TestHost:
    """A booted test host; writes to its / land in a per-instance overlay that survives restart()."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, name: str, ssh_port: int, sglang_port: int, root_dir: Path) -> None:
        self.name = name
        self.ssh_port = ssh_port
        self.sglang_port = sglang_port
        self.dir = root_dir
        self.pid = 0  # the systemd-nspawn process
        self.leader_pid = 0  # the container's PID 1 (systemd), as this machine sees it
        self.boot_seconds = 0.0
        self.owner_pid: int | None = os.getpid()  # None: meant to outlive its creator (`up`)
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroups: list[Path] = []
        self._binds: list[str] = []

    # -- paths and addresses ------------------------------------------------------------------
    @property
    def merged(self) -> Path:
        return self.dir / "merged"

    @property
    def ssh_key_path(self) -> Path:
        return self.dir / "client/id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "client/known_hosts"

    def ssh_config_entry(self, alias: str) -> str:
        """An ssh_config `Host` block that reaches this host as root with its own key and known host."""
        return (
            f"Host {alias}\n  HostName 127.0.0.1\n  Port {self.ssh_port}\n  User root\n"
            f"  IdentityFile {self.ssh_key_path}\n  UserKnownHostsFile {self.known_hosts_path}\n"
            "  IdentitiesOnly yes\n"
        )

    @property
    def host_key_fingerprint(self) -> str:
        out = subprocess.run(
            ["ssh-keygen", "-lf", str(self.dir / "hostkeys/ssh_host_ed25519_key.pub")],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.split()[1]

    @property
    def root(self) -> Path:
        """The running host's / as seen from this machine."""
        return Path(f"/proc/{self.leader_pid}/root")

    @property
    def bus_address(self) -> str:
        return f"unix:path={self.root}/run/dbus/system_bus_socket"

    @property
    def journal_dir(self) -> str:
        return f"{self.root}/var/log/journal"

    @property
    def log_path(self) -> Path:
        return self.dir / "console.log"

    def ssh_argv(self) -> list[str]:
        """The ssh command line (without the remote command) that reaches this host."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.ssh_key_path),
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
            "-p",
            str(self.ssh_port),
            "root@127.0.0.1",
        ]

    # -- commands and files -------------------------------------------------------------------
    def ssh(
        self, argv: list[str], input: bytes | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[bytes]:
        """Run argv on the host over ssh (quoted once for the remote shell)."""
        return subprocess.run(
            [*self.ssh_argv(), shlex.join(argv)],
            input=input,
            capture_output=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def inside(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        """Run argv in the host's namespaces without SSH (nsenter into its init): for what must work
        while its sshd is down."""
        leader = _leader(self.pid)
        if not leader:
            raise TestHostUnavailable(f"{self.name}: no init to enter")
        enter = ["nsenter", "-t", str(leader), "-m", "-u", "-i", "-p", "--"]
        return subprocess.run([*enter, *argv], capture_output=True, timeout=timeout)

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file on the running host atomically (parent folders created)."""
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.rename(target)

    def read(self, path: str) -> bytes:
        """Read a file from the running host."""
        return (self.root / path.lstrip("/")).read_bytes()

    # -- life cycle ---------------------------------------------------------------------------
    @classmethod
    def create(
        cls, setup: HostSetup = HostSetup(), name: str | None = None, outlive_creator: bool = False
    ) -> TestHost:
        """Build the root filesystem if needed, then prepare and boot a new instance."""
        rootfs = ensure_rootfs()
        sweep_stale()
        name = name or f"dctl-{os.getpid()}-{time.monotonic_ns() % 100000}"
        ssh_port, sglang_port = free_ports(2)
        host = cls(name, ssh_port, sglang_port, INSTANCES / name)
        host.owner_pid = None if outlive_creator else os.getpid()
        if host.dir.exists():
            raise TestHostUnavailable(f"a test host named {name} is already up (stop it first)")
        try:
            host._prepare(rootfs, setup)
            host.boot()
        except BaseException:
            host.stop()
            raise
        return host

    def _prepare(self, rootfs: Path, setup: HostSetup) -> None:
        # The upper folder's mode becomes the mode of the host's "/": it must be 0755, or services
        # running as other users (dbus-daemon as messagebus) cannot reach anything.
        for sub, mode in (("upper", 0o755), ("work", 0o700), ("merged", 0o755), ("client", 0o700)):
            (self.dir / sub).mkdir(parents=True, mode=mode)
        (self.dir / "hostkeys").mkdir(mode=0o755)
        self._save_state()
        # Our own overlay mount (not --volatile=overlay): its upper folder keeps /etc and /var
        # across restart(), as a real disk does across a reboot, and each instance gets its own.
        options = f"lowerdir={rootfs},upperdir={self.dir}/upper,workdir={self.dir}/work"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(self.merged)], check=True)
        self._make_keys()
        sshd = self.dir / "sshd.conf"
        sshd.write_text(
            f"Port {self.ssh_port}\nListenAddress 127.0.0.1\n"
            "HostKey /etc/ssh/deployctl/ssh_host_ed25519_key\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
        )
        binds = {
            str(self.dir / "hostkeys"): "/etc/ssh/deployctl",
            str(sshd): "/etc/ssh/sshd_config.d/deployctl.conf",
            f"{self.ssh_key_path}.pub": "/root/.ssh/authorized_keys",
        }
        if SIM_SGLANG.is_dir():
            binds[str(SIM_SGLANG)] = SIM_TARGET
            binds[str(SIM_MOONCAKE)] = SIM_TARGET.replace("/sglang", "/mooncake")
            binds.update(ensure_models())  # the weights the simulated server reads
        if setup.mount_agent:
            import jeepney

            binds[str(REPO / "agent")] = f"{AGENT_ROOT}/agent"
            binds[str(Path(jeepney.__file__).parent)] = f"{AGENT_ROOT}/jeepney"
        binds.update(oracle_binds())
        binds.update(setup.binds_ro)
        self._binds = [f"--bind={src}:{dst}" for src, dst in setup.binds_rw.items()]
        self._binds += [f"--bind-ro={src}:{dst}" for src, dst in binds.items()]
        cache = oracle_client.cache_dir()
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
            self._binds.append(f"--bind={cache}:{oracle_client.HOST_CACHE}")  # the sim adds answers
        for path, (data, mode) in setup.files.items():
            target = self.merged / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        wants = self.merged / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        for unit in setup.enable_units:
            (wants / unit).symlink_to(f"/etc/systemd/system/{unit}")

    def _make_keys(self) -> None:
        _keygen(self.ssh_key_path, f"deployctl-test@{self.name}")
        hostkey = self.dir / "hostkeys/ssh_host_ed25519_key"
        _keygen(hostkey, f"root@{self.name}")
        public = " ".join(Path(f"{hostkey}.pub").read_text().split()[:2])
        self.known_hosts_path.write_text(f"[127.0.0.1]:{self.ssh_port} {public}\n")

    def boot(self, timeout: float = 60.0) -> None:
        """Start systemd-nspawn and wait until sshd answers and systemd has finished booting."""
        argv = [
            "systemd-nspawn",
            "--quiet",
            "--register=no",  # there is no machined (nor systemd) on this machine to register with
            "--keep-unit",
            f"--machine={self.name}",
            f"--directory={self.merged}",
            "--console=read-only",
            *self._binds,
            "--boot",
        ]
        started = time.monotonic()
        self._cgroups = cgroups.make_own(f"deployctl-{self.name}")  # never a "payload" shared with a peer
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cgroups.enter_then_exec(self._cgroups, argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self._save_state()
        self._wait_ready(started + timeout)
        self.boot_seconds = time.monotonic() - started

    def _wait_ready(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise BootError(f"systemd-nspawn exited with {self._proc.returncode}:\n{self._log_tail()}")
            if not self.leader_pid:
                kids = _children(self.pid)
                self.leader_pid = kids[0] if kids else 0
            if self.leader_pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    state = self.ssh(["systemctl", "is-system-running"], timeout=5).stdout.decode().strip()
                if state in READY_STATES:
                    # nspawn's first child can be a short-lived helper; by now PID 1 inside is systemd.
                    self.leader_pid = _leader(self.pid) or self.leader_pid
                    self._save_state()
                    return
            time.sleep(0.05)
        raise BootError(f"test host {self.name} not ready (last state {state!r}):\n{self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        return ""

    def shutdown(self, timeout: float = 30.0) -> None:
        """Power the container off (SIGTERM to nspawn is a clean poweroff); keeps its disk."""
        if self.pid and _alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(self.pid) and time.monotonic() < deadline:
                if self._proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=0.05)
                else:
                    time.sleep(0.05)
            if _alive(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                if self._proc is not None:
                    self._proc.wait()
        self.pid = self.leader_pid = 0
        cgroups.remove(self._cgroups)
        # nspawn leaves these behind because /run is not a tmpfs on this machine.
        for leftover in ("propagate", "unix-export"):
            shutil.rmtree(f"/run/systemd/nspawn/{leftover}/{self.name}", ignore_errors=True)

    def restart(self, timeout: float = 60.0) -> None:
        """Power off and boot again on the same disk: files written to /etc and /var survive."""
        self.shutdown()
        self.boot(timeout)

    def stop(self) -> None:
        """Power off and remove everything this instance left on this machine."""
        self.shutdown()
        remove_instance(self.dir)

    def __enter__(self) -> TestHost:
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.stop()

    # -- state for `python -m tests.testhost` -------------------------------------------------
    def _save_state(self) -> None:
        state = {"name": self.name, "pid": self.pid, "leader_pid": self.leader_pid}
        state |= {"ssh_port": self.ssh_port, "sglang_port": self.sglang_port, "owner_pid": self.owner_pid}
        (self.dir / "state.json").write_text(json.dumps(state))

    @classmethod
    def attach(cls, name: str) -> TestHost:
        """The instance `name` started by another process."""
        state = json.loads((INSTANCES / name / "state.json").read_text())
        host = cls(name, state["ssh_port"], state["sglang_port"], INSTANCES / name)
        host.pid, host.leader_pid = state["pid"], state["leader_pid"]
        host.owner_pid = state.get("owner_pid")
        return host


def orphans() -> list[str]:
    """Running instances whose creating process is gone without stopping them (a killed test run)."""
    found = []
    for state_file in sorted(INSTANCES.glob("*/state.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = json.loads(state_file.read_text())
            owner = state.get("owner_pid")
            if owner and not _alive(owner) and state["pid"] and _alive(state["pid"]):
                found.append(str(state["name"]))
    return found


def remove_instance(path: Path) -> None:
    """Unmount and delete one instance folder."""
    merged = path / "merged"
    if os.path.ismount(merged):
        done = subprocess.run(["umount", str(merged)], capture_output=True)
        if done.returncode != 0:
            subprocess.run(["umount", "--lazy", str(merged)], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale() -> None:
    """Remove instances whose nspawn process is gone (left by a killed test run)."""
    for state_file in INSTANCES.glob("*/state.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid = json.loads(state_file.read_text())["pid"]
            if pid and not _alive(pid):
                name = state_file.parent.name
                for leftover in ("propagate", "unix-export"):
                    shutil.rmtree(f"/run/systemd/nspawn/{leftover}/{name}", ignore_errors=True)
                cgroups.remove(cgroups.named(f"deployctl-{name}"))
                remove_instance(state_file.parent)
