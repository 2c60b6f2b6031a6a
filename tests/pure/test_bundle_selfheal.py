"""The bundle and its writer run here, on this machine's python3: no host needed.

The bundle's entry point unpacks itself once and must notice a damaged or half-made folder; the writer
installs the bundle as root and must trust no name, folder or byte it did not make or check itself.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.remote import bundle

NOBODY = 65534


def run_bundle(pyz: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # No verb: the agent answers with its usage (exit 2) once everything it needs imported.
    return subprocess.run(
        [sys.executable, "-I", str(pyz), *args], capture_output=True, text=True, timeout=60, cwd="/"
    )


def assert_usage(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "usage:" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def pyz(tmp_path: Path) -> tuple[Path, str]:
    data, sha = bundle.build()
    path = tmp_path / "bin" / bundle.remote_name(sha)
    path.parent.mkdir(mode=0o755)
    path.write_bytes(data)
    return path, sha


def test_the_unpacked_folder_records_its_bundle(pyz: tuple[Path, str]) -> None:
    path, sha = pyz
    assert_usage(run_bundle(path, "--sha256", sha))
    assert (path.parent / f"{path.name}.d" / bundle.MARK).read_text() == sha
    assert [p.name for p in path.parent.iterdir()] != []
    assert not list(path.parent.glob(".unpack-*"))
    bad = run_bundle(path, "--sha256", "0" * 64)
    assert bad.returncode == bundle.BAD_BUNDLE


@pytest.mark.parametrize(
    ("rel", "how"),
    [
        ("agent/host/verbs.py", "delete"),
        ("agent/host/verbs.py", "truncate"),
        ("agent/host/__main__.py", "delete"),
        ("agent/protocol/requests.py", "truncate"),
        ("agent/__init__.py", "delete"),
        ("requests/models.py", "truncate"),  # imported only once a verb needs it: the sizes find it
        ("agent/host/verbs.py", "garble"),  # the same size: only importing it finds it
        (bundle.MARK, "delete"),
        (bundle.MARK, "other"),
    ],
)
def test_a_damaged_unpacked_folder_is_unpacked_again(pyz: tuple[Path, str], rel: str, how: str) -> None:
    path, sha = pyz
    assert_usage(run_bundle(path, "--sha256", sha))
    unpacked = path.parent / f"{path.name}.d"
    target = unpacked / rel
    if how == "delete":
        target.unlink()
    elif how == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif how == "garble":
        target.write_bytes(b"(" * target.stat().st_size)
        later = time.time() + 5  # a new mtime: Python would trust its cached bytecode otherwise
        os.utime(target, (later, later))
    else:
        target.write_text("0" * 64)
    assert_usage(run_bundle(path))  # without --sha256 too: the bundle hashes itself then
    if rel != bundle.MARK:
        assert target.read_bytes() == zipfile.ZipFile(path).read(rel)
    assert (unpacked / bundle.MARK).read_text() == sha
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, unpacked.name]


def test_old_leftovers_of_killed_unpacks_are_swept_and_young_ones_kept(pyz: tuple[Path, str]) -> None:
    path, sha = pyz
    killed, busy = path.parent / ".unpack-killed", path.parent / ".unpack-busy"
    (killed / "agent").mkdir(parents=True)
    (killed / "agent/x.py").write_text("")
    old = time.time() - 3600
    os.utime(killed, (old, old))
    busy.mkdir()
    assert_usage(run_bundle(path, "--sha256", sha))
    assert not killed.exists() and busy.is_dir()


def test_runs_racing_to_mend_the_same_folder_all_succeed(pyz: tuple[Path, str]) -> None:
    path, sha = pyz
    assert_usage(run_bundle(path, "--sha256", sha))
    unpacked = path.parent / f"{path.name}.d"
    (unpacked / "agent/host/verbs.py").unlink()
    argv = [sys.executable, "-I", str(path), "--sha256", sha]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == ExitCode.USAGE and "Traceback" not in err, err
    assert (unpacked / "agent/host/verbs.py").is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, unpacked.name]


# -- the writer -----------------------------------------------------------------------------------
def write(target: Path, data: bytes, sha: str | None = None) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-I", "-c", bundle.WRITER, str(target), sha or hashlib.sha256(data).hexdigest()]
    return subprocess.run(argv, input=data, capture_output=True, timeout=60, cwd="/")


def test_the_writer_installs_the_bytes_it_was_sent(tmp_path: Path) -> None:
    data, _ = bundle.build()
    target = tmp_path / "state" / "bin" / "agent.pyz"
    done = write(target, data)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == data and target.stat().st_mode & 0o7777 == 0o644
    assert target.parent.stat().st_mode & 0o7777 == 0o755
    assert os.listdir(target.parent) == ["agent.pyz"]
    again = write(target, data)  # the same bundle again: replaced in place
    assert again.returncode == 0 and os.listdir(target.parent) == ["agent.pyz"]


def test_the_writer_keeps_nothing_that_does_not_match(tmp_path: Path) -> None:
    target = tmp_path / "agent.pyz"
    done = write(target, b"truncated", sha="0" * 64)
    assert done.returncode != 0 and b"checksum" in done.stderr
    assert os.listdir(tmp_path) == []


def test_the_writer_replaces_a_link_at_the_target_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    target = tmp_path / "agent.pyz"
    target.symlink_to(victim)
    assert write(target, b"bundle").returncode == 0
    assert victim.read_bytes() == b"keep me\n"
    assert not target.is_symlink() and target.read_bytes() == b"bundle"


def test_the_writer_refuses_a_folder_others_can_write(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    folder.chmod(0o777)
    done = write(folder / "agent.pyz", b"bundle")
    assert done.returncode != 0 and b"another user" in done.stderr
    assert os.listdir(folder) == []


def test_the_writer_refuses_a_linked_folder(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "bin").symlink_to(real)
    # The link itself is resolved once, then the folder is opened without following links: the
    # checks and the write see the same folder. Here that is fine (both are ours).
    assert write(tmp_path / "bin" / "agent.pyz", b"bundle").returncode == 0
    assert (real / "agent.pyz").read_bytes() == b"bundle"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_the_writer_refuses_a_folder_another_user_owns(tmp_path: Path) -> None:
    parent = tmp_path / "state"
    parent.mkdir(mode=0o755)
    os.chown(parent, NOBODY, NOBODY)  # its owner could swap bin for anything
    done = write(parent / "bin" / "agent.pyz", b"bundle")
    assert done.returncode != 0 and b"another user" in done.stderr
