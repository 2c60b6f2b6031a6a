"""A transaction's folder holds no secret value, and old folders go with the backups' retention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.host import runner
from agent.host.change import folder
from agent.host.change.record import Record
from agent.host.state import StateDir
from agent.protocol.requests import Request

SECRET_ENV = {"HF_TOKEN": "hf-secret-1"}
SECRET_FLAGS = {"api-key": "sk-secret-2"}
TXN = "20261203T100000Z-abcdef"


def request(tmp_path: Path, unit: str = "sglang.service", **extra: object) -> Request:
    return Request(
        "apply", unit=unit, state_dir=str(tmp_path / "state"), secrets_dir=str(tmp_path / "secrets"),
        unit_text="[Service]\nExecStart=/bin/true\n", target_context=1000, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def test_no_secret_value_is_written_into_the_transaction_folder(tmp_path: Path) -> None:
    req = request(tmp_path, secret_env=SECRET_ENV, secret_flags=SECRET_FLAGS)
    state = StateDir(req.state_dir)
    folder.write_request(state, req, TXN)
    folder.stage_secrets(req, TXN)
    written = b"".join(p.read_bytes() for p in state.txn_dir(TXN).rglob("*") if p.is_file())
    assert b"hf-secret-1" not in written and b"sk-secret-2" not in written
    assert b"HF_TOKEN" in written and b"api-key" in written  # named, by reference
    staged = folder.staged_path(req, TXN)
    assert staged.stat().st_mode & 0o777 == 0o600 and staged.parent.stat().st_mode & 0o777 == 0o700
    assert state.txn_dir(TXN) not in staged.parents and Path(req.secrets_dir) not in staged.parents
    # The runner gets the values back, and the staged copy is gone once it has them.
    loaded = folder.load_request(state, TXN)
    assert loaded.secret_env == SECRET_ENV and loaded.secret_flags == SECRET_FLAGS
    assert not staged.exists()
    with pytest.raises(folder.StagedSecretsError):  # taken once: a second runner gets nothing
        folder.load_request(state, TXN)


def test_staged_values_must_be_the_ones_the_request_names(tmp_path: Path) -> None:
    req = request(tmp_path, secret_env=SECRET_ENV)
    state = StateDir(req.state_dir)
    folder.write_request(state, req, TXN)
    folder.stage_secrets(request(tmp_path, secret_env={"HF_TOKEN": "another"}), TXN)
    with pytest.raises(folder.StagedSecretsError, match="not the ones"):
        folder.load_request(state, TXN)


def finished(state: StateDir, req: Request, txn: str, outcome: bool = True) -> None:
    folder.write_request(state, req, txn)
    line = {"kind": "outcome" if outcome else "step", "txn": txn}
    state.events_path(txn).write_text(json.dumps(line) + "\n")


def test_transaction_folders_are_pruned_with_the_backups_retention(tmp_path: Path) -> None:
    req, other = request(tmp_path), request(tmp_path, unit="other.service")
    state = StateDir(req.state_dir)
    ids = [f"20261203T1{i:05d}Z-abcdef" for i in range(16)]  # oldest first
    for txn in ids[:12]:
        finished(state, req, txn)
    finished(state, req, ids[12], outcome=False)  # running, or waiting for recovery
    for txn in ids[13:]:
        finished(state, other, txn)
    state.save_record(Record(ids[0], req.unit, "written", None, "0" * 64))  # recovery needs it
    (Path(req.secrets_dir)).mkdir()
    stale = folder.staged_path(req, ids[1])  # a runner that died before it took its values
    stale.parent.mkdir(mode=0o700)
    stale.write_text("{}")
    removed = folder.prune(req, keep=3)
    assert removed == ids[1:9][::-1]  # newest first; the 3 newest finished kept
    left = sorted(p.name for p in (state.root / "txn").iterdir())
    assert left == [ids[0], *ids[9:]]  # the record's, the newest 3, the unfinished, the other unit's
    assert not stale.exists()


def test_a_runner_without_its_staged_values_refuses_and_changes_nothing(tmp_path: Path) -> None:
    req = request(tmp_path, secret_env=SECRET_ENV)
    state = StateDir(req.state_dir)
    folder.write_request(state, req, TXN)  # and nothing staged: the values are gone
    assert runner.run(req.state_dir, TXN) == ExitCode.REFUSED
    outcome = json.loads(list(state.read_events(TXN))[-1])
    assert outcome["kind"] == "outcome" and outcome["data"]["outcome"] == "error"
    assert not Path(req.secrets_dir).exists()  # nothing was written
