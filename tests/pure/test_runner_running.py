"""Who runs a change on this unit: a transaction that logged its outcome needs no question to systemd."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.host import runner
from agent.host.events import EventLog
from agent.host.state import StateDir
from agent.inventory import load_host
from agent.protocol.events import Stage
from agent.protocol.requests import Request
from agent.remote.client import base_request

UNITS = Path(__file__).resolve().parents[2] / "units"
TXN = "20261203T120000Z-abcdef"


@pytest.fixture
def asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("DEPLOYCTL_RUN_DIR", str(tmp_path / "run"))
    seen: list[str] = []

    def alive(txn: str) -> bool:
        seen.append(txn)
        return False

    monkeypatch.setattr(runner, "_runner_alive", alive)
    return seen


def _request(tmp_path: Path) -> Request:
    return replace(base_request(load_host("ct200-sim", UNITS), "facts"), state_dir=str(tmp_path / "state"))


def _log(tmp_path: Path, *kinds: str) -> None:
    state = StateDir(tmp_path / "state")
    state.set_last_txn("sglang.service", TXN)
    log = EventLog(TXN, state.events_path(TXN))
    for kind in kinds:
        log.emit(Stage.DONE if kind == "outcome" else Stage.WATCH, kind, kind, outcome="applied")
    log.close()


def test_a_transaction_with_its_outcome_is_not_running_and_systemd_is_not_asked(tmp_path, asked):
    _log(tmp_path, "step", "progress", "outcome")
    assert runner.running(_request(tmp_path)) is None
    assert asked == []


@pytest.mark.parametrize("kinds", [(), ("step", "progress")], ids=["no events yet", "no outcome yet"])
def test_a_transaction_without_its_outcome_is_checked_with_systemd(tmp_path, asked, kinds):
    _log(tmp_path, *kinds)
    assert runner.running(_request(tmp_path)) is None  # the fake systemd says its runner is gone
    assert asked == [TXN]


def test_only_the_tail_is_read_and_a_line_cut_by_it_does_not_count(tmp_path, asked):
    state = StateDir(tmp_path / "state")
    state.set_last_txn("sglang.service", TXN)
    log = EventLog(TXN, state.events_path(TXN))
    log.emit(Stage.WATCH, "log", "x" * 200_000)  # a chatty start: far more than the tail
    log.emit(Stage.DONE, "outcome", "done", outcome="applied")
    log.close()
    assert state.has_outcome(TXN)
    assert not state.has_outcome(TXN, tail=40)  # only a cut-off piece of the outcome's line is read


def test_a_runner_asked_for_but_not_locked_yet_is_checked_though_last_txn_is_another(tmp_path, asked):
    """last_txn names the last lock winner only: the runner being started is found by its own marker."""
    _log(tmp_path, "step", "outcome")  # an earlier, finished change
    starting = "20261203T120500Z-fedcba"
    StateDir(tmp_path / "state").set_starting_txn("sglang.service", starting)
    assert runner.running(_request(tmp_path)) is None  # the fake systemd says that runner is gone
    assert asked == [starting]
