"""The laptop-agent wire: round trips, and the agent's own validation of what it receives."""

from __future__ import annotations

import json

import pytest

from agent.protocol.common import ProtocolError
from agent.protocol.events import Event, exit_code
from agent.protocol.requests import Request, Smoke

GOOD = Request(verb="apply", unit_text="[Service]\nExecStart=/bin/true\n", target_context=200_000)


def test_request_round_trip() -> None:
    req = Request(
        verb="rollback", backup="sglang.service.bak.20261202T120000Z", smoke=Smoke(prompt_tokens=10)
    )
    assert Request.from_json(req.to_json()) == req


def test_a_recovery_of_a_change_that_sent_a_daemon_unit_is_a_valid_request() -> None:
    """The follower of a killed runner recovers with the apply's own request as verb "recover"."""
    import dataclasses

    sent = dataclasses.replace(GOOD, daemon_text="[Service]\nExecStart=/bin/true\n")
    for verb in ("apply", "recover"):
        req = dataclasses.replace(sent, verb=verb, txn=None)
        assert Request.from_json(req.to_json()) == req


def test_event_round_trip_and_outcome() -> None:
    e = Event(
        "20261202T120000Z-abcdef",
        3,
        "2026-12-02T12:00:00.000Z",
        "done",
        "outcome",
        "ok",
        {"outcome": "applied"},
    )
    assert Event.from_json(e.to_json()) == e and e.is_outcome


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"verb": "rm"},
        {"unit": "../etc/passwd.service"},
        {"unit": "a/b.service"},
        {"unit": "sglang.socket"},
        {"unit_dir": "etc/systemd/system"},
        {"unit_dir": "/etc/../root"},
        {"state_dir": "/var/lib/x\n"},
        {"unit_text": "[Service]\nExecStart=/bin/true\x00\n"},
        {"unit_text": "[Service]\nExecStart=/bin/true\x1b[2J\n"},
        {"unit_text": "[Service]\nType=simple\n"},
        {"target_context": -5},
        {"margin": 5},
        {"port": 0},
        {"backup": "../../etc/shadow"},
        {"backup": "other.service.bak.20261202T120000Z"},
        {"txn": "../x"},
        {"http_host": "a b"},
        {"expect_sha256": "not-a-hash"},
        {"smoke": {"prompt_tokens": 0}},
        {"bogus": 1},
        {"daemon_text": "[Service]\nType=simple\n"},
        {"daemon_text": "[Service]\nExecStart=/bin/true\x00\n"},
        {"daemon_text": 5},
    ],
)
def test_the_agent_refuses_bad_requests(change: dict[str, object]) -> None:
    raw = json.loads(GOOD.to_json())
    for key, value in change.items():
        if isinstance(value, dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    with pytest.raises(ProtocolError):
        Request.from_json(json.dumps(raw))


def test_not_json_is_refused_in_one_line() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        Request.from_json("{")


@pytest.mark.parametrize(
    ("outcome", "code"),
    [("applied", 0), ("up_to_date", 0), ("rolled_back", 4), ("rollback_failed", 5), ("locked", 6), ("x", 1)],
)
def test_outcomes_map_to_documented_exit_codes(outcome: str, code: int) -> None:
    assert exit_code(outcome) == code
