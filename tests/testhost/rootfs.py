"""Build and keep the test host's Debian 12 root filesystem, rebuilt only when the recipe changes."""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STATE_DIR = Path("/var/tmp/deployctl-testhost")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",
    "python3",
    "python3-venv",
    "procps",
    "iproute2",
    "prometheus-node-exporter",  # the metrics test scrapes the real one
)
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
# The file every complete build ends with: a folder without it is never used.
DONE_MARK = "etc/deployctl-testhost-recipe"


class TestHostUnavailable(RuntimeError):
    """This machine cannot build or boot the test host; the message names what is missing."""

    __test__ = False  # an exception, not a test class for pytest to collect


def missing_prerequisites() -> list[str]:
    """What this machine lacks to build and boot the test host (empty when nothing)."""
    missing = [] if os.geteuid() == 0 else ["root privileges"]
    tools = ["systemd-nspawn", "ssh", "ssh-keygen", "mount", "umount"]
    if not (rootfs_path() / DONE_MARK).exists():
        tools.append("debootstrap")  # only needed to build; a built tree for this recipe is reused
    missing += [f"the {tool} command" for tool in tools if shutil.which(tool) is None]
    return missing


def configure(rootfs: Path) -> None:
    """Offline set-up of a fresh debootstrap tree before its first boot."""
    # Each instance binds its own host keys in; the ones made at install time would be shared.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (rootfs / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    (rootfs / "etc/hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    # Persistent journal, so lines survive a container restart as they would a reboot.
    (rootfs / "var/log/journal").mkdir(parents=True, exist_ok=True)
    # An empty machine-id makes systemd create one on the first boot of each instance.
    (rootfs / "etc/machine-id").write_text("")
    # node_exporter runs only where a test starts it (on a port of its own): many hosts share one network.
    for wants in (rootfs / "etc/systemd/system").rglob("prometheus-node-exporter*"):
        if wants.is_symlink():
            wants.unlink()
    # Mount points for the per-instance binds, created here so the lower layer already has them.
    for mount_point in ("etc/ssh/deployctl", "opt/deployctl/agent", "opt/deployctl/jeepney"):
        (rootfs / mount_point).mkdir(parents=True, exist_ok=True)
    certs = sorted(HOST_CA_DIR.glob("*.crt"))
    if certs:
        # HTTPS egress here is intercepted with these CAs; without them pip inside fails to verify.
        target = rootfs / "usr/local/share/ca-certificates"
        target.mkdir(parents=True, exist_ok=True)
        for cert in certs:
            shutil.copy(cert, target / cert.name)
        subprocess.run(["chroot", str(rootfs), "update-ca-certificates"], check=True, capture_output=True)


def recipe_hash() -> str:
    """A short digest of everything that decides the tree's contents."""
    recipe = "\n".join([SUITE, MIRROR, *PACKAGES, inspect.getsource(configure)])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def rootfs_path() -> Path:
    """Where the tree for the current recipe lives once built."""
    return STATE_DIR / recipe_hash() / "rootfs"


@contextmanager
def _build_lock() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_rootfs(log: bool = True) -> Path:
    """Return the tree for the current recipe, building it first if needed (safe to call concurrently)."""
    missing = missing_prerequisites()
    if missing:
        raise TestHostUnavailable("cannot build the test host: missing " + ", ".join(missing))
    final = rootfs_path()
    if (final / DONE_MARK).exists():
        return final
    with _build_lock():
        if (final / DONE_MARK).exists():  # another process built it while we waited
            return final
        _build(final, log)
    return final


def _build(final: Path, log: bool) -> None:
    partial = final.parent / f"rootfs.partial.{os.getpid()}"
    for stale in final.parent.glob("rootfs.partial.*"):  # left by an interrupted build
        shutil.rmtree(stale, ignore_errors=True)
    if final.exists():
        shutil.rmtree(final)
    partial.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if log:
        print(f"building the test host root filesystem in {final} (about a minute) ...", flush=True)
    argv = [
        "debootstrap",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        SUITE,
        str(partial),
        MIRROR,
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        tail = "\n".join(done.stdout.splitlines()[-5:] + done.stderr.splitlines()[-5:])
        raise TestHostUnavailable(f"debootstrap failed (rc {done.returncode}):\n{tail}")
    configure(partial)
    (partial / DONE_MARK).write_text(recipe_hash() + "\n")
    partial.rename(final)
    if log:
        print(f"built in {time.monotonic() - started:.0f} s", flush=True)
