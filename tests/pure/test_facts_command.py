"""`deployctl facts HOST --json` of a one-host service: the facts document the agent read, as read
(in-process, a fake session: the CLI's own code from the arguments to the document)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agent.orchestrate.session as session_module
from agent.cli.commands import facts as facts_command
from agent.inventory import load_service

UNITS = Path(__file__).resolve().parents[2] / "units"


def test_facts_json_prints_the_agents_document(monkeypatch: pytest.MonkeyPatch) -> None:
    host = load_service("ct200", UNITS)
    doc: dict[str, Any] = {"format": "deployctl-facts/1", "gpus": [], "model": {"path": "/models/m"}}

    class Client:
        def call(self, _req: Any) -> dict[str, Any]:
            return {"model_facts": doc}

    class Session:
        client, host = Client(), None

    Session.host = host  # type: ignore[assignment]

    @contextlib.contextmanager
    def fake(_conn: Any) -> Iterator[Session]:
        yield Session()

    monkeypatch.setattr(session_module, "session", fake)
    args = argparse.Namespace(host="ct200", units=str(UNITS), json=True)
    monkeypatch.setattr("agent.cli.options.connection_of", lambda _a: None)
    got = facts_command.host_facts(args)
    assert got["format"] == "deployctl-facts/1" and got["model"]["path"] == "/models/m"
