"""Unit files on disk: backup names, retention, atomic writes (in a temporary folder, no systemd)."""

from __future__ import annotations

import errno
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.host.units import UnitFiles, UnitWriteError
from agent.protocol.common import BACKUP_NAME

NOW = datetime(2026, 12, 2, 15, 30, 5, tzinfo=timezone.utc)


@pytest.fixture
def files(tmp_path: Path) -> UnitFiles:
    (tmp_path / "sglang.service").write_text("[Service]\nExecStart=/bin/old\n")
    os.chmod(tmp_path / "sglang.service", 0o640)
    return UnitFiles(tmp_path)


def test_backup_is_named_by_utc_time_and_is_root_only(files: UnitFiles) -> None:
    b = files.backup("sglang.service", NOW.astimezone(timezone(timedelta(hours=2))))
    assert b.name == "sglang.service.bak.20261202T153005Z"
    assert BACKUP_NAME.fullmatch(b.name)
    assert not b.name.endswith(".service")  # systemd never loads it
    assert (b.path.stat().st_mode & 0o777) == 0o600  # root-only: an old unit may hold secrets inline
    assert b.path.read_text() == "[Service]\nExecStart=/bin/old\n"


def test_two_backups_in_one_second_do_not_collide(files: UnitFiles) -> None:
    a, b = files.backup("sglang.service", NOW), files.backup("sglang.service", NOW)
    assert a.name != b.name and b.name.endswith("-1")


def backups_of(files: UnitFiles, contents: list[str]) -> list[str]:
    """One backup per content, a minute apart, oldest first."""
    names = []
    for i, text in enumerate(contents):
        files.write("sglang.service", text)
        names.append(files.backup("sglang.service", NOW + timedelta(minutes=i)).name)
    return names


def test_backups_newest_first_and_prune_keeps_n_and_the_protected_one(files: UnitFiles) -> None:
    names = backups_of(files, [f"[Service]\nExecStart=/bin/v{i}\n" for i in range(5)])
    assert [b.name for b in files.backups("sglang.service")] == names[::-1]
    removed = files.prune("sglang.service", keep=2, protect=(names[0],))
    assert sorted(removed) == sorted(names[1:3])
    assert {b.name for b in files.backups("sglang.service")} == {names[4], names[3], names[0]}


def test_identical_copies_count_once_so_failing_nightly_runs_keep_the_distinct_history(
    files: UnitFiles,
) -> None:
    distinct = backups_of(files, ["[Service]\nExecStart=/bin/a\n", "[Service]\nExecStart=/bin/b\n"])
    nightly = backups_of(files, ["[Service]\nExecStart=/bin/c\n"] * 6)  # the same unit, night after night
    files.prune("sglang.service", keep=3)
    assert {b.name for b in files.backups("sglang.service")} == {*distinct, *nightly}


@given(
    contents=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=12),
    keep=st.integers(min_value=1, max_value=4),
)
@settings(max_examples=60, deadline=None)
def test_every_backup_name_stays_while_its_content_is_kept(
    tmp_path_factory: pytest.TempPathFactory, contents: list[int], keep: int
) -> None:
    """A name an apply printed (`rollback --to NAME`) is removed only with the last of its content: the
    newest `keep` distinct contents stay under every name they were backed up as."""
    folder = tmp_path_factory.mktemp("units")
    (folder / "sglang.service").write_text("[Service]\nExecStart=/bin/old\n")
    files = UnitFiles(folder)
    names = backups_of(files, [f"[Service]\nExecStart=/bin/v{c}\n" for c in contents])
    files.prune("sglang.service", keep=keep)
    newest_distinct: list[int] = []
    for c in reversed(contents):
        if c not in newest_distinct:
            newest_distinct.append(c)
    wanted = {n for n, c in zip(names, contents, strict=True) if c in newest_distinct[:keep]}
    assert {b.name for b in files.backups("sglang.service")} == wanted


def test_a_protected_copy_survives_even_when_it_is_a_duplicate(files: UnitFiles) -> None:
    names = backups_of(files, ["[Service]\nExecStart=/bin/a\n"] * 3)
    files.prune("sglang.service", keep=1, protect=(names[0], None))
    assert {b.name for b in files.backups("sglang.service")} == set(names)


def test_a_unit_with_bytes_that_are_not_utf8_is_backed_up_and_restored_byte_for_byte(
    files: UnitFiles,
) -> None:
    raw = b"[Service]\nDescription=caf\xe9 (Latin-1, edited by hand)\nExecStart=/bin/old\n"
    files.path("sglang.service").write_bytes(raw)
    b = files.backup("sglang.service", NOW)
    assert b.path.read_bytes() == raw
    files.write("sglang.service", "[Service]\nExecStart=/bin/new\n")
    files.restore("sglang.service", b.name)
    assert files.path("sglang.service").read_bytes() == raw


def test_write_is_atomic_and_keeps_mode(files: UnitFiles) -> None:
    files.write("sglang.service", "[Service]\nExecStart=/bin/new\n")
    assert files.read("sglang.service") == "[Service]\nExecStart=/bin/new\n"
    assert (files.path("sglang.service").stat().st_mode & 0o777) == 0o640
    assert [p.name for p in files.dir.iterdir()] == ["sglang.service"]  # no temporary file left


@pytest.mark.parametrize("call", ["write", "fsync", "rename"])
def test_a_failed_write_leaves_the_old_unit_and_no_temp_file(
    files: UnitFiles, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """The disk fills up while the new unit is written (or synced, or renamed into place)."""
    real = getattr(os, call)

    def full(*args: object) -> object:
        if call == "write":  # part of it lands in the temp file first
            real(args[0], b"[Service]\nExec")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, call, full)
    with pytest.raises(UnitWriteError, match=r"cannot write .*/sglang\.service: no space left on the device"):
        files.write("sglang.service", "[Service]\nExecStart=/bin/new\n")
    monkeypatch.undo()
    assert files.read("sglang.service") == "[Service]\nExecStart=/bin/old\n"
    assert sorted(p.name for p in files.dir.iterdir()) == ["sglang.service"]


def test_restore_puts_the_backup_back(files: UnitFiles) -> None:
    b = files.backup("sglang.service", NOW)
    files.write("sglang.service", "[Service]\nExecStart=/bin/new\n")
    files.restore("sglang.service", b.name)
    assert files.read("sglang.service") == "[Service]\nExecStart=/bin/old\n"
    assert b.path.exists()  # the backup itself stays
