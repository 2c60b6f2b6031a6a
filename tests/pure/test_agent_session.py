"""The agent's `session`: a read-only verb answered at once, then at most one changing verb, one process."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

import pytest

from agent.exitcodes import ExitCode
from agent.host import __main__ as agent_main
from agent.inventory import load_host
from agent.protocol.requests import Request
from agent.remote.client import base_request

UNITS = Path(__file__).resolve().parents[2] / "units"


class Seen:
    def __init__(self) -> None:
        self.verbs: list[str] = []
        self.flushed_before_second: bool | None = None
        self.out: io.StringIO | None = None

    def dispatch(self, req: Request, out: TextIO) -> int:
        if self.verbs:  # the first answer must already be on its way when the second request is read
            self.flushed_before_second = getattr(out, "flushes", 0) > 0
        self.verbs.append(req.verb)
        out.write(f'{{"answered": "{req.verb}"}}\n')
        return 0


class CountingOut(io.StringIO):
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def _line(verb: str, **fields: object) -> str:
    return base_request(load_host("ct200-sim", UNITS), verb, **fields).to_json() + "\n"


def _apply_line() -> str:
    return _line(
        "apply",
        unit_text="[Service]\nExecStart=/usr/bin/true\n",
        target_context=200_000,
        expect_sha256="absent",
    )


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    s = Seen()
    monkeypatch.setattr(agent_main, "_dispatch", s.dispatch)
    return s


def test_facts_then_apply_in_one_process(seen: Seen) -> None:
    out = CountingOut()
    rc = agent_main.session(io.StringIO(_line("facts") + _apply_line()), out)
    assert rc == 0
    assert seen.verbs == ["facts", "apply"]
    assert seen.flushed_before_second is True
    assert out.getvalue().splitlines() == ['{"answered": "facts"}', '{"answered": "apply"}']


def test_eof_after_the_answer_ends_the_session(seen: Seen) -> None:
    assert agent_main.session(io.StringIO(_line("facts")), CountingOut()) == 0
    assert seen.verbs == ["facts"]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_apply_line(), id="a changing verb first"),
        pytest.param(_line("facts") + _line("status"), id="two read-only verbs"),
        pytest.param(_line("facts") + "not json\n", id="garbage second"),
    ],
)
def test_a_session_out_of_order_is_refused_before_anything_changes(
    seen: Seen, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert agent_main.main(["session"]) == int(ExitCode.USAGE)
    assert "apply" not in seen.verbs
    assert "deployctl-agent: error:" in capsys.readouterr().err
