"""The laptop's reading of an agent's event stream: a line that is not an event is shown, never dropped."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from agent.inventory import load_host
from agent.protocol.events import Event, Stage
from agent.remote.client import AgentClient, base_request
from agent.remote.transport import LocalTransport, Source, Stream

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "units"


class ScriptedTransport(LocalTransport):
    """A local transport whose streamed command prints the given stdout and exits 0."""

    def __init__(self, stdout: bytes) -> None:
        super().__init__()
        self.stdout = stdout

    def stream(self, argv: Sequence[str], input: bytes | None = None) -> Stream:
        def source() -> Source:
            yield self.stdout
            return 0, b""

        return Stream(argv, source())


def test_a_line_that_is_not_an_event_becomes_a_warning() -> None:
    good = Event(
        "20261203T000000Z-abcdef", 1, "t", Stage.DONE.value, "outcome", "done", {"outcome": "applied"}
    )
    stdout = b"Traceback (most recent call last): boom\n" + good.to_json().encode() + b"\n"
    host = load_host("ct200-sim", UNITS)
    client = AgentClient(ScriptedTransport(stdout), host)
    events = list(client.events(base_request(host, "recover")))
    assert [e.kind for e in events] == ["warning", "outcome"]
    assert "unreadable line from the agent: Traceback (most recent call last): boom" in events[0].message
    assert events[1] == good


class RecordingTransport(LocalTransport):
    """Records what the laptop did in order: the question sent, the answer read."""

    def __init__(self, answer: bytes, log: list[str]) -> None:
        super().__init__()
        self.answer, self.log = answer, log

    def converse(self, argv: Sequence[str], first: bytes, timeout: float | None = None) -> Stream:
        self.log.append(f"sent {json.loads(first)['verb']}")

        def source() -> Source:
            self.log.append("read")
            yield self.answer
            return 0, b""

        return Stream(argv, source(), Swallow())


class Swallow:
    def send(self, data: bytes) -> None:
        pass

    def end(self) -> None:
        pass


def test_the_question_goes_out_before_the_caller_waits_for_the_answer() -> None:
    host = load_host("ct200-sim", UNITS)
    log: list[str] = []
    client = AgentClient(RecordingTransport(b'{"unit_text": "x"}\n', log), host)
    with client.converse(base_request(host, "facts")) as talk:
        log.append("caller works")  # apply loads the planner here
        assert talk.answer == {"unit_text": "x"}
    assert log == ["sent facts", "caller works", "read"]


def test_the_planner_is_not_loaded_before_apply_asks_for_facts() -> None:
    code = (
        "import sys, agent.cli.main, agent.deploy, agent.remote.ssh.transport; "
        "heavy = ('agent.plan.choose', 'agent.render', 'agent.report', 'jinja2'); "
        "print([m for m in heavy if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "[]"  # so the host gathers its facts while they load
