"""Two changes at once: the one that loses the lock never hides the winner's outcome."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.exitcodes import ExitCode
from agent.host import runner, verbs
from agent.host.change.transaction import Result
from agent.host.lock import UnitLock
from agent.host.state import StateDir
from agent.inventory import load_host
from agent.protocol.events import Outcome
from agent.protocol.requests import Request
from agent.remote.client import base_request

UNITS = Path(__file__).resolve().parents[2] / "units"


class NoSystemd:
    def __enter__(self) -> NoSystemd:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_the_loser_of_two_concurrent_changes_leaves_status_to_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both asked before either locked (the race): the second runner meets the first's lock."""
    monkeypatch.setenv("DEPLOYCTL_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(runner, "running", lambda req: None)  # both passed that check at once
    monkeypatch.setattr(runner, "Systemd", NoSystemd)
    req: Request = replace(
        base_request(load_host("ct200-sim", UNITS), "rollback"),
        state_dir=str(tmp_path / "state"),
        unit_dir=str(tmp_path / "units"),
        detach=False,
    )
    loser: list[int] = []

    class Winner:
        def __init__(self, *args: Any) -> None:
            pass

        def rollback(self) -> Result:
            loser.append(runner.start(req, io.StringIO()))  # its runner runs while we hold the lock
            return Result(Outcome.APPLIED, "restored: the winner's outcome")

    monkeypatch.setattr(runner, "Transaction", Winner)
    assert runner.start(req, io.StringIO()) == ExitCode.OK
    assert loser == [ExitCode.LOCKED]
    st = verbs.status(req)
    assert st["last_outcome"]["data"]["outcome"] == "applied", st["last_outcome"]
    assert StateDir(req.state_dir).last_txn(req.unit) == st["last_outcome"]["txn"]


@pytest.mark.parametrize("decided", ["up_to_date", "secrets_differ", "locked"])
def test_the_compare_verb_answers_the_one_host_check_under_the_lock_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decided: str
) -> None:
    """A group's node is asked "nothing to do?" and answers with Transaction.compare, the one-host check."""
    import json

    monkeypatch.setenv("DEPLOYCTL_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(runner, "Systemd", NoSystemd)
    host = load_host("ct200-sim", UNITS)
    req: Request = replace(
        base_request(host, "compare", unit_text="[Service]\nExecStart=/x\n", target_context=1000),
        state_dir=str(tmp_path / "state"),
        unit_dir=str(tmp_path / "units"),
    )
    seen: list[Request] = []

    class Compared:
        def __init__(self, r: Request, *args: Any) -> None:
            seen.append(r)

        def compare(self, wait: bool = True) -> Result | dict[str, str | None]:
            assert wait is False
            if decided == "secrets_differ":
                return {"api-key": "new"}
            return Result(Outcome.UP_TO_DATE, "already up to date: nothing to do")

    monkeypatch.setattr(runner, "Transaction", Compared)
    lock = UnitLock(tmp_path / "run", req.unit)
    if decided == "locked":
        lock.acquire({"txn": "other", "pid": 1})
    out = io.StringIO()
    try:
        assert verbs.dispatch(req, out) == 0
    finally:
        if decided == "locked":
            lock.release()
    answer = json.loads(out.getvalue().splitlines()[-1])
    assert answer["up_to_date"] is (decided == "up_to_date")
    assert all(r.verb == "apply" and r.group is None for r in seen)
    assert not list((tmp_path / "state").rglob("*.json"))  # nothing recorded: no transaction ran
