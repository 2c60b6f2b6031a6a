"""Unit files on disk: backup names, retention, atomic writes (in a temporary folder, no systemd)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from agent.host.units import UnitFiles, UnitWriteError
from agent.protocol import BACKUP_NAME

NOW = datetime(2026, 12, 2, 15, 30, 5, tzinfo=timezone.utc)


@pytest.fixture
def files(tmp_path: Path) -> UnitFiles:
    (tmp_path / "sglang.service").write_text("[Service]\nExecStart=/bin/old\n")
    os.chmod(tmp_path / "sglang.service", 0o640)
    return UnitFiles(tmp_path)


def test_backup_is_named_by_utc_time_and_keeps_the_mode(files: UnitFiles) -> None:
    b = files.backup("sglang.service", NOW.astimezone(timezone(timedelta(hours=2))))
    assert b.name == "sglang.service.bak.20261202T153005Z"
    assert BACKUP_NAME.fullmatch(b.name)
    assert not b.name.endswith(".service")  # systemd never loads it
    assert (b.path.stat().st_mode & 0o777) == 0o640
    assert b.path.read_text() == "[Service]\nExecStart=/bin/old\n"


def test_two_backups_in_one_second_do_not_collide(files: UnitFiles) -> None:
    a, b = files.backup("sglang.service", NOW), files.backup("sglang.service", NOW)
    assert a.name != b.name and b.name.endswith("-1")


def test_backups_newest_first_and_prune_keeps_n_and_the_protected_one(files: UnitFiles) -> None:
    names = [files.backup("sglang.service", NOW + timedelta(minutes=i)).name for i in range(5)]
    assert [b.name for b in files.backups("sglang.service")] == names[::-1]
    removed = files.prune("sglang.service", keep=2, protect=names[0])
    assert sorted(removed) == sorted(names[1:3])
    assert {b.name for b in files.backups("sglang.service")} == {names[4], names[3], names[0]}


def test_write_is_atomic_and_keeps_mode(files: UnitFiles) -> None:
    files.write("sglang.service", "[Service]\nExecStart=/bin/new\n")
    assert files.read("sglang.service") == "[Service]\nExecStart=/bin/new\n"
    assert (files.path("sglang.service").stat().st_mode & 0o777) == 0o640
    assert [p.name for p in files.dir.iterdir()] == ["sglang.service"]  # no temporary file left


def test_a_failed_write_leaves_the_old_unit_and_no_temp_file(files: UnitFiles) -> None:
    (files.dir / "sglang.service.d").mkdir()  # rename() onto a folder fails, like a full or broken disk
    with pytest.raises(UnitWriteError, match="cannot write"):
        files.write("sglang.service.d", "x")
    assert files.read("sglang.service") == "[Service]\nExecStart=/bin/old\n"
    assert sorted(p.name for p in files.dir.iterdir()) == ["sglang.service", "sglang.service.d"]


def test_restore_puts_the_backup_back(files: UnitFiles) -> None:
    b = files.backup("sglang.service", NOW)
    files.write("sglang.service", "[Service]\nExecStart=/bin/new\n")
    files.restore("sglang.service", b.name)
    assert files.read("sglang.service") == "[Service]\nExecStart=/bin/old\n"
    assert b.path.exists()  # the backup itself stays
