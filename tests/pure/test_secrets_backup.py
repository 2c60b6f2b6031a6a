"""A secrets backup that fails (disk full, I/O error, read-only) never touches the live secrets."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from agent.host.change.transaction import Transaction
from agent.host.events import EventLog
from agent.host.systemd import UnitState
from agent.host.units import UnitFiles, UnitWriteError
from agent.protocol.events import Outcome
from agent.protocol.requests import Request

OLD = "[Service]\nExecStart=/bin/true --context-length 100000\n"
NEW = "[Service]\nExecStart=/bin/true --context-length 200000\n"


class FakeSystemd:
    """The running service as systemd would report it; a restart or reload here fails the test."""

    def unit_state(self, unit: str) -> UnitState:
        return UnitState(unit, "loaded", "active", "running", "ab12", False, 0, 0, 0, "", 0)


def a_transaction(tmp_path: Path) -> Transaction:
    req = Request(
        verb="apply",
        unit_dir=str(tmp_path / "units"),
        state_dir=str(tmp_path / "state"),
        secrets_dir=str(tmp_path / "secrets"),
        unit_text=NEW,
        target_context=200000,
        secret_env={"HF_TOKEN": "new-token"},
        secret_flags={"api-key": "new-key"},
        prewarm=False,
    )
    return Transaction(req, "t1", systemd=FakeSystemd(), journal=None, log=EventLog("t1", None))  # type: ignore[arg-type]


def failing_copies(monkeypatch: pytest.MonkeyPatch, secrets_dir: Path, code: int, after: int) -> None:
    """Writes of secret copies (`<unit>.bak.*.<kind>`) fail with `code` after `after` of them succeeded."""
    real = UnitFiles.write
    done = [0]

    def write(self: UnitFiles, unit: str, text: str, *args: object, **kw: object) -> None:
        if self.dir == secrets_dir and ".bak." in unit:
            if done[0] >= after:
                raise UnitWriteError(code, f"cannot write {self.dir / unit}: {errno.errorcode[code]}")
            done[0] += 1
        real(self, unit, text, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(UnitFiles, "write", write)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EROFS])
@pytest.mark.parametrize("after", [0, 1])  # no copy made, or the env copy made and the flags one not
def test_a_failed_secrets_backup_keeps_the_live_secrets_and_leaves_no_partial_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, after: int
) -> None:
    t = a_transaction(tmp_path)
    t.files.dir.mkdir()
    t.files.write("sglang.service", OLD)
    t.secrets.write(t.secrets.wanted({"HF_TOKEN": "old-token"}, {"api-key": "old-key"}))
    live = t.secrets.current()
    failing_copies(monkeypatch, tmp_path / "secrets", code, after)

    result = t.apply()

    assert result.outcome is Outcome.ERROR
    assert "left as it was" in result.message
    assert t.secrets.current() == live  # the live secrets, byte for byte: none deleted, none replaced
    assert t.files.read("sglang.service") == OLD
    # no backup without its secrets: restoring it later would delete them
    assert t.files.backups("sglang.service") == []
    assert sorted(p.name for p in (tmp_path / "secrets").iterdir()) == [
        "sglang.service.env",
        "sglang.service.flags.yaml",
    ]
    assert t.state.load_record("sglang.service") is None


def test_a_failed_secrets_write_after_a_good_backup_puts_the_live_secrets_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = a_transaction(tmp_path)
    t.files.dir.mkdir()
    t.files.write("sglang.service", OLD)
    t.secrets.write(t.secrets.wanted({"HF_TOKEN": "old-token"}, {"api-key": "old-key"}))
    live = t.secrets.current()
    real = UnitFiles.write

    def write(self: UnitFiles, unit: str, text: str, *args: object, **kw: object) -> None:
        if unit == "sglang.service.flags.yaml" and "new-key" in text:  # the env file is already new
            raise UnitWriteError(errno.ENOSPC, "cannot write the flags: no space left on the device")
        real(self, unit, text, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(UnitFiles, "write", write)
    result = t.apply()
    assert result.outcome is Outcome.ERROR and "left as it was" in result.message
    assert t.secrets.current() == live
    assert t.files.read("sglang.service") == OLD
    assert t.state.load_record("sglang.service") is None
