"""A stdout that cannot be written and a stdin that is closed are the environment's, not deployctl's bugs:
each gets a documented exit code and one plain line, never "internal error" (exit 1)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PLAN = ("plan", "--facts", str(EXAMPLES / "ct200.json"), "--context", "200k", "--json")


def deployctl(*argv: str, **streams: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        **streams,
    )


def one_plain_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) in (1, 2) and lines[0].startswith("deployctl: error: "), stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_disk_on_stdout_is_output_lost_not_an_internal_error() -> None:
    with open("/dev/full", "w") as full:
        result = deployctl(*PLAN, stdout=full)
    assert result.returncode == ExitCode.OUTPUT_LOST, result.stderr
    assert "No space left on device" in one_plain_line(result.stderr)


def test_a_closed_stdout_is_output_lost() -> None:
    result = deployctl("parse-log", str(EXAMPLES / "ct200-start.log"), preexec_fn=lambda: os.close(1))
    assert result.returncode == ExitCode.OUTPUT_LOST, result.stderr
    assert "stdout is closed" in one_plain_line(result.stderr)


@pytest.mark.parametrize("argv", [("parse-log", "-"), ("plan", *PLAN[1:5], "--from-log", "-")])
def test_a_closed_stdin_is_a_usage_error(argv: tuple[str, ...]) -> None:
    result = deployctl(*argv, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(0))
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "stdin is closed" in one_plain_line(result.stderr)


class _Full(io.StringIO):
    """A stdout on a full disk after `room` characters."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(s)


@settings(max_examples=25, deadline=None)
@given(room=st.integers(0, 400), context=st.sampled_from(["32k", "200k", "2000k"]))
def test_lost_output_never_exits_0_and_a_failed_command_keeps_its_code(room: int, context: str) -> None:
    argv = ["plan", "--facts", str(EXAMPLES / "ct200.json"), "--context", context]
    whole = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(argv, whole)
    assert isinstance(whole.stdout, io.StringIO)
    out = Output(stdout=_Full(room), stderr=io.StringIO())
    got = main(argv, out)
    assert isinstance(out.stderr, io.StringIO)
    if len(whole.stdout.getvalue()) <= room:  # it all fitted: nothing lost
        assert got == code and out.stderr.getvalue() == ""
        return
    assert got == (ExitCode.OUTPUT_LOST if code == ExitCode.OK else code)
    one_plain_line(out.stderr.getvalue())
