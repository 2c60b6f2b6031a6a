"""A fleet host's link drops: the re-attach reports this run's own transaction, never another's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.fleet import steps
from agent.inventory import HostConfig, load_host
from agent.protocol.events import Event
from agent.protocol.requests import Request
from agent.remote.client import base_request
from agent.remote.transport import ConnectionLost

UNITS = Path(__file__).resolve().parents[2] / "units"
OURS, OTHER = "20261203T120000Z-abcdef", "20261202T030000Z-012345"
APPLIED = {
    "txn": OTHER,
    "kind": "outcome",
    "message": "applied",
    "data": {"outcome": "applied", "summary": {}},
}


class Dropped:
    """The session that carried the request: the link drops before any event came back."""

    def events(self, req: Request) -> Iterator[Event]:
        raise ConnectionLost("Connection reset by peer")
        yield  # a generator


class Again:
    """The host as a fresh connection finds it: its status answers, its follow streams."""

    def __init__(self, statuses: list[dict[str, Any]], followed: list[Event]) -> None:
        self.statuses, self.followed, self.asked = statuses, followed, list[Request]()

    def call(self, req: Request) -> dict[str, Any]:
        self.asked.append(req)
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def events(self, req: Request) -> Iterator[Event]:
        self.asked.append(req)
        yield from self.followed


def reattach_with(monkeypatch: pytest.MonkeyPatch, again: Again) -> tuple[str, dict[str, Any]]:
    host: HostConfig = load_host("ct200-sim", UNITS)

    @contextmanager
    def connected(_host: HostConfig) -> Iterator[Again]:
        yield again

    monkeypatch.setattr(steps, "connected", connected)
    monkeypatch.setattr(steps.time, "sleep", lambda s: None)
    req = base_request(host, "apply", txn=OURS, unit_text="[Service]\nExecStart=/x\n", target_context=1)
    return steps.follow_outcome(None, host, req, lambda phase, msg: None, Dropped())  # type: ignore[arg-type]


def status(last: dict[str, Any] | None, running: str | None = None, **ours: Any) -> dict[str, Any]:
    asked = {"id": OURS, "known": False, "outcome": None, **ours}
    return {"running": {"txn": running} if running else None, "last_outcome": last, "txn": asked}


def test_a_link_cut_before_the_transaction_started_is_not_started_not_the_last_outcome(monkeypatch) -> None:
    """The host's last outcome is an earlier run's APPLIED: an untouched canary must not look applied."""
    again = Again([status(APPLIED)], [])
    message, data = reattach_with(monkeypatch, again)
    assert data["outcome"] == "not_started" and "never started" in message
    assert all(r.txn == OURS for r in again.asked)  # asked after its own transaction


def test_the_outcome_of_this_runs_own_transaction_is_reported(monkeypatch) -> None:
    mine = {**APPLIED, "txn": OURS, "data": {"outcome": "rolled_back"}}
    again = Again([status(APPLIED, known=True, outcome=mine)], [])
    _, data = reattach_with(monkeypatch, again)
    assert data["outcome"] == "rolled_back"


def test_this_runs_transaction_still_running_is_followed(monkeypatch) -> None:
    done = Event(OURS, 9, "t", "done", "outcome", "applied", {"outcome": "applied"})
    again = Again([status(APPLIED, running=OURS, known=True)], [done])
    _, data = reattach_with(monkeypatch, again)
    assert data["outcome"] == "applied" and again.asked[-1].verb == "follow" and again.asked[-1].txn == OURS


def test_a_request_the_host_was_still_reading_is_asked_after_again(monkeypatch) -> None:
    """The first status may come before the host wrote the request down: one more look before giving up."""
    mine = {**APPLIED, "txn": OURS, "data": {"outcome": "applied"}}
    again = Again([status(APPLIED), status(mine, known=True, outcome=mine)], [])
    _, data = reattach_with(monkeypatch, again)
    assert data["outcome"] == "applied"


def test_not_started_fails_the_host() -> None:
    from agent.fleet.results import HostResult
    from agent.remote.follow import NOT_STARTED

    assert HostResult("h", "not_started", NOT_STARTED).failed
