"""The laptop's reading of an agent's event stream: a line that is not an event is shown, never dropped."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agent.inventory import load_host
from agent.protocol import Event, Stage
from agent.remote.client import AgentClient, base_request
from agent.remote.transport import LocalTransport, Source, Stream

UNITS = Path(__file__).resolve().parents[2] / "units"


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
