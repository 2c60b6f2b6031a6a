"""Text from the host reaches the terminal with its control characters shown as escapes, never raw.

SGLang log lines, failure reasons, event messages, backup names and the status answer all come from the
host; an escape sequence in any of them (OSC 0 retitles the window, CSI 2J clears the screen) must be
printed as the text `\\x1b`, through every real printing path, while --json output stays valid JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.cli.commands import parse_log
from agent.cli.main import main
from agent.orchestrate.session import status_text
from agent.output import Output, terminal_text
from agent.progress import Progress
from agent.protocol.events import Event
from agent.report import ApplyReport, backups_table, render_report

HOSTILE = "\x1b]0;pwned\x07 and \x1b[2J\x1b[31mred\r\x85\x9b1;1H\x00"
SHOWN = "\\x1b]0;pwned\\x07 and \\x1b[2J\\x1b[31mred\\r\\x85\\x9b1;1H\\x00"
# What may never reach a terminal raw: C0 but \n and \t, DEL and C1.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
OUR_CLEAR_LINE = "\r\x1b[2K"  # the live status line's own control sequence, and the only one allowed


def _out(**kw: Any) -> Output:
    return Output(stdout=io.StringIO(), stderr=io.StringIO(), **kw)


def _texts(out: Output) -> tuple[str, str]:
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return out.stdout.getvalue(), out.stderr.getvalue()


def _event(kind: str, message: str, **data: Any) -> Event:
    return Event("t1", 1, "2026-10-30T12:00:00.000Z", "start", kind, message, dict(data))


def test_terminal_text_escapes_controls_but_newline_and_tab() -> None:
    assert terminal_text(HOSTILE) == SHOWN
    assert terminal_text("a\tb\nc") == "a\tb\nc"
    assert terminal_text("a\tb\nc", keep="") == "a\\tb\\nc"
    assert terminal_text("bad \udcff byte") == "bad \\udcff byte"


@given(st.text())
def test_terminal_text_leaves_nothing_raw(text: str) -> None:
    shown = terminal_text(text)
    assert not RAW_CONTROL.search(shown)
    assert terminal_text(shown) == shown  # once is enough: printing twice changes nothing
    assert terminal_text(json.dumps(text)) == json.dumps(text)  # JSON passes as it is


def test_print_and_note_show_escapes() -> None:
    out = _out()
    out.print(f"why: {HOSTILE}")
    out.note(f"note: {HOSTILE}")
    stdout, stderr = _texts(out)
    assert stdout == f"why: {SHOWN}\n"
    assert stderr == f"note: {SHOWN}\n"


@pytest.mark.parametrize("kind", ["step", "warning", "outcome"])
def test_event_lines_show_escapes(kind: str) -> None:
    out = _out()
    Progress(out, "ct200").show(_event(kind, f"health check failed: {HOSTILE}"))
    stdout, stderr = _texts(out)
    assert stdout == ""
    assert "\x1b" not in stderr and not RAW_CONTROL.search(stderr)
    assert SHOWN in stderr


def test_sglang_lines_on_a_plain_stream_show_escapes() -> None:
    out = _out()
    progress = Progress(out, "ct200")
    progress.show(_event("progress", "phase: loading_weights", phase="loading_weights"))
    progress._last_plain = -1e9  # the next line is due now
    progress.show(_event("progress", "sglang", phase="loading_weights", line=f"[TP0] {HOSTILE}"))
    _, stderr = _texts(out)
    assert "\x1b" not in stderr and not RAW_CONTROL.search(stderr)
    assert "\\x1b]0;pwned\\x07" in stderr


def test_sglang_lines_on_the_live_status_line_show_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _out(isatty=True)
    progress = Progress(out, "ct200")
    progress.show(_event("progress", "sglang", phase="load", line="[TP0] \x1b]0;pwned\x07\nfake line"))
    progress.show(_event("progress", "sglang", phase=f"load{HOSTILE}", line=f"[TP0] {HOSTILE}"))
    progress.show(_event("step", f"done {HOSTILE}"))
    progress.done()
    _, stderr = _texts(out)
    ours_removed = stderr.replace(OUR_CLEAR_LINE, "")
    assert "\x1b" not in ours_removed and not RAW_CONTROL.search(ours_removed)
    assert "\\x1b]0;pwned" in ours_removed
    assert "\\nfake line" in ours_removed  # the status line stays one line


def test_json_events_stay_valid_json_and_exact() -> None:
    out = _out(json=True)
    event = _event("progress", HOSTILE, line=HOSTILE, phase="x")
    Progress(out, "ct200").show(event)
    stdout, _ = _texts(out)
    assert not RAW_CONTROL.search(stdout)
    assert Event.from_json(stdout) == event


def test_the_report_shows_escapes() -> None:
    report = ApplyReport(
        host="ct200",
        unit="sglang.service",
        target=None,
        plan=None,
        before_flags={},
        after_flags={},
        outcome="rolled_back",
        message=f"the new unit failed: {HOSTILE}",
        data={"reason": f"SGLang said: {HOSTILE}", "backup": f"b{HOSTILE}"},
    )
    out = _out()
    out.print(render_report(report))
    out.print(backups_table("ct200", [{"name": f"b{HOSTILE}", "taken": HOSTILE, "size": 1, "changes": []}]))
    stdout, _ = _texts(out)
    assert "\x1b" not in stdout and not RAW_CONTROL.search(stdout)
    assert stdout.count(SHOWN) == 4


def test_the_status_shows_escapes() -> None:
    answer = {
        "state": {"active_state": f"active{HOSTILE}", "sub_state": "running"},
        "running": {"verb": "apply", "txn": HOSTILE, "since": "now", "pid": 1},
        "last_txn": "t0",
        "last_outcome": {"data": {"outcome": HOSTILE}, "ts": "2026", "message": f"rolled back: {HOSTILE}"},
    }
    out = _out()
    out.print(status_text("ct200", "sglang.service", answer))
    stdout, _ = _texts(out)
    assert "\x1b" not in stdout and not RAW_CONTROL.search(stdout)
    assert stdout.count(SHOWN) == 4


def test_parse_log_shows_a_hostile_failure_line_escaped(tmp_path: Path) -> None:
    log = tmp_path / "start.log"
    log.write_text(f"[2026-10-30 12:00:00 TP0] torch.OutOfMemoryError: CUDA out of memory {HOSTILE}\n")
    out = _out()
    assert main(["parse-log", str(log)], out) == 0
    stdout, stderr = _texts(out)
    assert "cuda_oom" in stdout
    assert "\x1b" not in stdout + stderr and not RAW_CONTROL.search(stdout + stderr)
    assert "\\x1b]0;pwned\\x07" in stdout
    # --json: the same line, exact once parsed back.
    out = _out()
    assert parse_log.run(argparse.Namespace(file=str(log), json=True), out) == 0
    stdout, _ = _texts(out)
    assert "\x1b]0;pwned\x07 and \x1b[2J" in json.loads(stdout)["failure"]["line"]  # log lines end at \r
