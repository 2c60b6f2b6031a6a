"""The agent bundle on a real host: installed without a predictable staging name another user could
plant something at, and an unpacked folder that was damaged, or an unpack that was killed, put right."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.remote import bundle
from tests import simhost
from tests.integration.conftest import DEPLOYCTL

pytestmark = pytest.mark.integration

BIN = "var/lib/deployctl/bin"
NOBODY = 65534
VICTIM = "/etc/dctl-victim"
SUDO_LOG = "/run/dctl-sudo.log"
# The test host has no sudo (tests/testhost/rootfs.py installs none) and logs in as root: this stand-in
# records each call and runs the command as `sudo -n -- ARGV` would, so the sudo code path is the one taken.
SUDO_SHIM = f"""#!/usr/bin/python3
import os, sys
args = sys.argv[1:]
if args[:2] != ["-n", "--"] or len(args) < 3:
    sys.exit("sudo stand-in: unexpected arguments " + repr(args))
with open("{SUDO_LOG}", "a") as log:
    log.write(args[2] + "\\n")
os.execvp(args[2], args[2:])
"""


def current_bundle() -> tuple[str, str]:
    _, sha = bundle.build.__wrapped__()
    return bundle.remote_name(sha), sha


def status(sim: simhost.SimHost, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **sim.env, **(env or {})}
    return subprocess.run(
        [DEPLOYCTL, "status", sim.name],
        env=full, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sudo_env(sim: simhost.SimHost) -> dict[str, str]:
    """An inventory for the same host with ssh.sudo on, and the sudo stand-in installed there."""
    sim.host.put("/usr/local/bin/sudo", SUDO_SHIM.encode(), 0o755)
    units = sim.work / "units-sudo"
    units.mkdir()
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    assert "sudo = false" in text
    (units / f"{sim.name}.toml").write_text(text.replace("sudo = false", "sudo = true"))
    return {"DEPLOYCTL_UNITS": str(units)}


def _fingerprint(path: Path) -> tuple[int, int, int, int, bytes]:
    st = os.lstat(path)
    body = os.readlink(path).encode() if path.is_symlink() else path.read_bytes() if path.is_file() else b""
    return st.st_ino, st.st_mode, st.st_uid, st.st_size, body


# -- the upload -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "planted"),
    [("sudo", "symlink"), ("sudo", "file"), ("sudo", "directory"), ("plain", "symlink")],
)
def test_the_upload_ignores_what_another_user_planted_in_tmp(
    sim: simhost.SimHost, sudo_env: dict[str, str], mode: str, planted: str
) -> None:
    root = sim.host.root
    shutil.rmtree(root / BIN, ignore_errors=True)  # a host without the bundle: the next call uploads it
    sim.host.put(VICTIM, b"root:x:0:0:root:/root:/bin/bash\n")
    victim = _fingerprint(root / VICTIM.lstrip("/"))
    name, sha = current_bundle()
    spot = root / "tmp" / name  # the staging name the sudo upload used to write through
    if planted == "symlink":
        spot.symlink_to(VICTIM)
    elif planted == "file":
        spot.write_bytes(b"planted by another user\n")
    else:
        spot.mkdir()
    os.lchown(spot, NOBODY, NOBODY)
    before = _fingerprint(spot)
    (root / SUDO_LOG.lstrip("/")).unlink(missing_ok=True)
    try:
        r = status(sim, sudo_env if mode == "sudo" else None)
        assert r.returncode == ExitCode.OK, r.stderr
        installed = root / BIN / name
        assert hashlib.sha256(installed.read_bytes()).hexdigest() == sha
        assert installed.stat().st_uid == 0 and installed.stat().st_mode & 0o7777 == 0o644
        assert _fingerprint(root / VICTIM.lstrip("/")) == victim
        assert _fingerprint(spot) == before  # left exactly as planted: /tmp is never used
        assert [p.name for p in (root / "tmp").glob("*agent-*")] == [name]
        assert [p.name for p in (root / BIN).iterdir() if p.name.startswith(".")] == []  # no temp left
        if mode == "sudo":  # the bundle went in through sudo, by the writer (python3, not the bundle)
            calls = (root / SUDO_LOG.lstrip("/")).read_text().split()
            assert "/usr/bin/python3" in calls
    finally:
        if spot.is_dir() and not spot.is_symlink():
            spot.rmdir()
        else:
            spot.unlink(missing_ok=True)


def test_the_upload_refuses_a_bin_folder_another_user_can_change(sim: simhost.SimHost) -> None:
    root = sim.host.root
    shutil.rmtree(root / BIN, ignore_errors=True)
    (root / BIN).mkdir(parents=True)
    os.chown(root / BIN, NOBODY, NOBODY)
    try:
        r = status(sim)
        assert r.returncode != ExitCode.OK
        assert "/var/lib/deployctl/bin" in r.stderr and "another user" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert list((root / BIN).iterdir()) == []
    finally:
        shutil.rmtree(root / BIN, ignore_errors=True)
    assert status(sim).returncode == ExitCode.OK  # a fresh folder is made root's own


# -- the unpacked folder --------------------------------------------------------------------------
def test_a_damaged_unpacked_folder_is_unpacked_again(sim: simhost.SimHost) -> None:
    first = status(sim)
    assert first.returncode == ExitCode.OK, first.stderr
    name, sha = current_bundle()
    pyz = sim.host.root / BIN / name
    unpacked = pyz.with_name(f"{name}.d")
    shipped = zipfile.ZipFile(pyz)

    def damage(rel: str, how: str) -> None:
        target = unpacked / rel
        if how == "delete":
            target.unlink()
        elif how == "truncate":
            target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
        else:  # the same size, a new mtime: only importing it finds the damage
            target.write_bytes(b"(" * target.stat().st_size)
            later = time.time() + 5
            os.utime(target, (later, later))

    for rel, how in [
        ("agent/host/verbs.py", "delete"),
        ("agent/host/verbs.py", "truncate"),
        ("agent/protocol/requests.py", "truncate"),
        ("agent/host/__main__.py", "delete"),
        ("jeepney/__init__.py", "delete"),
        ("requests/models.py", "truncate"),
        ("agent/host/state.py", "garble"),
    ]:
        damage(rel, how)
        r = status(sim)
        assert r.returncode == ExitCode.OK, (rel, how, r.stderr)
        assert (unpacked / rel).read_bytes() == shipped.read(rel), (rel, how)
    assert (unpacked / bundle.MARK).read_text() == sha  # the unpacked folder names the bundle it came from

    # a folder without its record (or with another bundle's) is not trusted: it is unpacked afresh
    for record in (None, "0" * 64):
        inode = unpacked.stat().st_ino
        if record is None:
            (unpacked / bundle.MARK).unlink()
        else:
            (unpacked / bundle.MARK).write_text(record)
        r = status(sim)
        assert r.returncode == ExitCode.OK, r.stderr
        assert unpacked.stat().st_ino != inode
        assert (unpacked / bundle.MARK).read_text() == sha
    assert sorted(p.name for p in pyz.parent.iterdir() if p.name.startswith(".")) == []


def test_leftovers_of_a_killed_unpack_are_swept(sim: simhost.SimHost) -> None:
    assert status(sim).returncode == ExitCode.OK
    bin_dir = sim.host.root / BIN
    killed = bin_dir / ".unpack-killed1"
    (killed / "agent/host").mkdir(parents=True)
    (killed / "agent/host/verbs.py").write_text("# half written")
    hour_ago = time.time() - 3600
    os.utime(killed, (hour_ago, hour_ago))
    busy = bin_dir / ".unpack-busy1"  # young: another run may be unpacking there right now
    busy.mkdir()
    try:
        r = status(sim)
        assert r.returncode == ExitCode.OK, r.stderr
        assert not killed.exists()
        assert busy.is_dir()
    finally:
        shutil.rmtree(killed, ignore_errors=True)
        shutil.rmtree(busy, ignore_errors=True)
