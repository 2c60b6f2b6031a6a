"""`deployctl apply` follows its transaction through a dropped link, as the fleet does (one follower)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ConnectError
from agent.inventory import HostConfig, load_host
from agent.orchestrate import session
from agent.output import Output
from agent.protocol.events import Event
from agent.protocol.requests import Request
from agent.remote import follow as follower
from agent.remote.client import base_request
from agent.remote.transport import ConnectionLost

UNITS = Path(__file__).resolve().parents[2] / "units"


class Dropped:
    """The first connection: one step, then the link drops."""

    def __init__(self) -> None:
        self.sent: list[Request] = []

    def events(self, req: Request) -> Iterator[Event]:
        self.sent.append(req)
        yield Event(req.txn or "-", 1, "2026-12-04T10:00:00.000Z", "restart", "step", "restart job done", {})
        raise ConnectionLost("Connection reset by peer")


class Again:
    def __init__(self, status: dict[str, Any], followed: list[Event]) -> None:
        self.status, self.followed, self.asked = status, followed, list[Request]()

    def call(self, req: Request) -> dict[str, Any]:
        self.asked.append(req)
        return self.status

    def events(self, req: Request) -> Iterator[Event]:
        self.asked.append(req)
        yield from self.followed


def run(monkeypatch: pytest.MonkeyPatch, again: Again) -> tuple[Event, str, Dropped]:
    host: HostConfig = load_host("ct200-sim", UNITS)

    @contextmanager
    def connected(_host: HostConfig) -> Iterator[Again]:
        yield again

    monkeypatch.setattr(follower, "connected", connected)
    monkeypatch.setattr(follower.time, "sleep", lambda s: None)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    first = Dropped()
    req = base_request(host, "apply", unit_text="[Service]\nExecStart=/x\n", target_context=1)
    outcome = session.follow(out, session.Session(host, first), req)  # type: ignore[arg-type]
    assert isinstance(out.stderr, io.StringIO)
    return outcome, out.stderr.getvalue(), first


def test_a_dropped_link_is_re_attached_to_and_the_outcome_is_this_runs(monkeypatch) -> None:
    """It used to end with exit 3 and "re-run to re-attach", while the host went on alone."""
    done = Event("x", 9, "2026-12-04T10:01:00.000Z", "done", "outcome", "applied", {"outcome": "applied"})
    again = Again({}, [done])

    def status_for(req: Request) -> dict[str, Any]:
        again.asked.append(req)
        return {"running": {"txn": req.txn}, "last_outcome": None, "txn": {"id": req.txn, "known": True}}

    again.call = status_for  # type: ignore[method-assign]
    outcome, said, first = run(monkeypatch, again)
    assert outcome.data["outcome"] == "applied"
    assert "connection lost during apply" in said and "re-attaching" in said
    txn = first.sent[0].txn
    assert txn and [r.verb for r in again.asked] == ["status", "follow"] and again.asked[-1].txn == txn


def test_a_link_cut_before_the_host_began_is_no_outcome_but_an_error(monkeypatch) -> None:
    earlier = {"txn": "20261203T000000Z-000000", "kind": "outcome", "message": "applied",
               "data": {"outcome": "applied"}}  # fmt: skip
    again = Again({"running": None, "last_outcome": earlier, "txn": {"id": "x", "known": False}}, [])
    with pytest.raises(ConnectError) as caught:
        run(monkeypatch, again)
    assert "never started on the host" in str(caught.value)


class Interrupted:
    """The person presses Ctrl-C while the transaction's steps stream in (after `steps` of them)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def events(self, req: Request) -> Iterator[Event]:
        for n in range(self.steps):
            yield Event(
                req.txn or "-", n + 1, "2026-12-04T10:00:00.000Z", "restart", "step", "restarting", {}
            )
        raise KeyboardInterrupt


@pytest.mark.parametrize("steps", [0, 1])
def test_ctrl_c_says_the_host_goes_on_alone_and_how_to_follow_it(steps: int) -> None:
    """As the connection-lost message does: Ctrl-C stops following, not the change on the host."""
    host: HostConfig = load_host("ct200-sim", UNITS)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    req = base_request(host, "apply", unit_text="[Service]\nExecStart=/x\n", target_context=1)
    with pytest.raises(KeyboardInterrupt):
        session.follow(out, session.Session(host, Interrupted(steps)), req)  # type: ignore[arg-type]
    assert isinstance(out.stderr, io.StringIO)
    said = out.stderr.getvalue()
    assert f"deployctl status {host.name} --follow" in said and "the host goes on alone" in said, said
