"""A real OpenSSH server on a free 127.0.0.1 port, with per-run host and client keys."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it; the distro's unit creates it


def skip_unless_sshd() -> None:
    """Skip the calling test module unless a real sshd can be started here."""
    if not SSHD.exists():
        pytest.skip(
            "needs OpenSSH's /usr/sbin/sshd (apt-get install openssh-server)", allow_module_level=True
        )
    if os.geteuid() != 0:
        pytest.skip("needs root: sshd must run as root to log users in", allow_module_level=True)
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs ssh-keygen to make per-run keys", allow_module_level=True)


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A fresh unencrypted key pair at path (and path.pub)."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


def fingerprint_of(pub: Path) -> str:
    """OpenSSH's own SHA256 fingerprint for a public key file."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], capture_output=True, check=True
    )
    return out.stdout.decode().split()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Sshd:
    """One running sshd: where it listens, its keys and its log."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    host_key: Path
    client_key: Path

    @property
    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    def known_hosts_line(self) -> str:
        kind, blob = (self.host_key.with_suffix(".pub")).read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}\n"

    def kill_sessions(self) -> int:
        """SIGKILL every sshd process serving a connection (not the listener); returns how many."""
        victims = [pid for pid in _descendants(self.proc.pid) if _comm(pid) == "sshd"]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        return len(victims)

    def stop(self) -> None:
        self.kill_sessions()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_sshd(root: Path, client_key: Path, port: int | None = None) -> Sshd:
    """Start sshd -D on port (else a free one), authorising client_key for root; wait until it greets."""
    root.mkdir(parents=True, exist_ok=True)
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host_key = keygen(root / "ssh_host_ed25519_key")
    authorized = root / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    for _ in range(5):  # another process may grab the free port between probe and bind
        listen = port or free_port()
        conf = root / "sshd_config"
        conf.write_text(_config(root, listen, host_key, authorized))
        # -E, not -e: with -e the session's own stderr picks up sshd's debug lines.
        log = str(root / "sshd.log")
        proc = subprocess.Popen([str(SSHD), "-D", "-E", log, "-f", str(conf)], stdin=subprocess.DEVNULL)
        if _wait_for_banner(listen, proc):
            return Sshd(root, listen, proc, host_key, client_key)
        proc.kill()
        proc.wait()
    raise RuntimeError(f"sshd did not start; log:\n{(root / 'sshd.log').read_text()}")


def _config(root: Path, port: int, host_key: Path, authorized: Path) -> str:
    return "\n".join(
        [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {host_key}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {authorized}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the temp dir is not owned the way sshd insists on for ~/.ssh
            "UseDNS no",
            "AllowTcpForwarding yes",
            "MaxStartups 100",
            "MaxSessions 50",
            "Subsystem sftp internal-sftp",
            "LogLevel DEBUG1",  # the ProxyJump test reads the direct-tcpip lines
            "",
        ]
    )


def _wait_for_banner(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                if probe.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            time.sleep(0.02)
    return False


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for child in _children(pid):
        found.append(child)
        found.extend(_descendants(child))
    return found


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
