"""The command line's manners: closed pipes, empty logs, unit spellings, help text and examples, hints."""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.cli.main import build_parser, main
from agent.exitcodes import ExitCode
from agent.orchestrate.asked import ArgError, parse_context
from agent.output import Output

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "units"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(UNITS), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def _closed_pipe_run(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run deployctl with stdout on a pipe whose reader is already gone (`... | head -0`, every time)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "agent", "--units", str(UNITS), *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "ct200-sim", "--context", "200k", "--offline"),
        ("render", "ct200-sim", "--context", "200k", "--mem-fraction-static", "0.93"),
        ("--help",),
    ],
    ids=["plan", "render", "help"],
)
def test_a_closed_pipe_is_not_an_error(argv: tuple[str, ...]) -> None:
    result = _closed_pipe_run(*argv)
    assert result.stderr == "", result.stderr
    assert result.returncode == 0


class _ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_plan_keeps_its_exit_code_when_the_reader_goes() -> None:
    """The plan's verdict is still the exit code when nobody reads its text (`plan ... | head -1`)."""
    out = Output(stdout=_ClosedPipe(), stderr=io.StringIO())
    code = main(["--units", str(UNITS), "plan", "ct200-sim", "--context", "400k", "--offline"], out)
    assert isinstance(out.stderr, io.StringIO)
    assert out.stderr.getvalue() == ""
    assert code == run_cli("plan", "ct200-sim", "--context", "400k", "--offline")[0]


def test_parse_log_without_a_start_says_so(tmp_path: Path) -> None:
    path = tmp_path / "syslog"
    path.write_text("Dec 03 10:00:00 host cron[12]: job started\nanother line\n", encoding="utf-8")
    code, stdout, stderr = run_cli("parse-log", str(path))
    assert code == ExitCode.USAGE
    assert stdout == ""
    assert "no SGLang line" in stderr.splitlines()[0]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("1m", 1_000_000), ("1M", 1_000_000), ("128ki", 131_072), ("128Ki", 131_072), ("128KI", 131_072),
     ("2mi", 2 * 1024**2), ("200k", 200_000)],
)  # fmt: skip
def test_context_units_in_either_case(text: str, tokens: int) -> None:
    assert parse_context(text) == tokens


@given(
    st.integers(0, 9999),
    st.integers(1, 999),
    st.sampled_from([("k", 1000), ("K", 1000), ("ki", 1024), ("m", 1000**2), ("Mi", 1024**2)]),
)
def test_a_decimal_context_with_a_unit_is_exact_or_refused(
    whole: int, frac: int, unit: tuple[str, int]
) -> None:
    """'0.5M' and '1.5k' are the spellings people write: whole tokens are taken exactly (no float
    rounding), a decimal that is no whole number of tokens is refused in one line, never rounded."""
    text = f"{whole}.{frac}{unit[0]}"
    exact = Fraction(f"{whole}.{frac}") * unit[1]
    if exact.denominator == 1 and 0 < exact <= 10_000_000:
        assert parse_context(text) == exact
    else:
        with pytest.raises(ArgError) as err:
            parse_context(text)
        assert "\n" not in str(err.value)


@given(st.integers(0, 10_000_000), st.integers(0, 999))
def test_a_decimal_context_without_a_unit_is_refused(whole: int, frac: int) -> None:
    """'1.0' or '131072.5' is no token count the docs allow: a decimal needs a unit (docs/commands.md)."""
    with pytest.raises(ArgError) as err:
        parse_context(f"{whole}.{frac}")
    assert "\n" not in str(err.value) and "unit" in str(err.value)


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under `deployctl`: the commands, and the actions of fleet."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from _parsers(child)


def _commands() -> list[argparse.ArgumentParser]:
    """The parsers that run something (fleet itself only chooses an action)."""
    leaves = []
    for p in _parsers(build_parser()):
        if p.prog != "deployctl" and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
            leaves.append(p)
    return leaves


@pytest.mark.parametrize("parser", _commands(), ids=lambda p: p.prog)
def test_every_option_has_help(parser: argparse.ArgumentParser) -> None:
    missing = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())
    ]
    assert missing == [], f"{parser.prog}: no help text for {missing}"


@pytest.mark.parametrize("parser", _commands(), ids=lambda p: p.prog)
def test_every_command_shows_an_example_that_parses(parser: argparse.ArgumentParser) -> None:
    examples = [
        line.split("example:", 1)[1].strip()
        for line in (parser.epilog or "").splitlines()
        if "example:" in line
    ]
    assert examples, f"{parser.prog} --help shows no example"
    for example in examples:
        words = shlex.split(example.split("   (")[0].split(" | ")[0].split(" > ")[0])
        assert " ".join(words[: len(parser.prog.split())]) == parser.prog, example
        build_parser().parse_args(words[1:])  # raises on an example the parser would refuse


def test_examples_show_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--help"]) == 0
    assert "example: deployctl plan" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (("render", "ct200-sim", "--context", "abc"), "render"),
        (("plan", "ct200-sim", "--context", "200k", "--mem-fraction-static", "2"), "plan"),
        (("fleet", "apply", "all", "--context", "x"), "fleet apply"),
        (("render", "no-such-host", "--context", "200k"), "render"),
    ],
)
def test_an_error_hint_names_the_commands_help(argv: tuple[str, ...], command: str) -> None:
    code, _, stderr = run_cli(*argv)
    assert code == ExitCode.USAGE
    assert f"deployctl {command} --help" in stderr, stderr


def test_rollback_help_names_the_real_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollback", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "newest backup that differs from the installed unit" in shown


def test_render_says_the_context_alone_does_not_grow_the_pool() -> None:
    """The seed's trap: `render --context 200k` kept 0.85 without a word."""
    code, stdout, stderr = run_cli("render", "ct200-sim", "--context", "200k")
    assert code == 0 and "--context-length 200000" in stdout
    assert "does not grow the KV pool" in stderr and "--mem-fraction-static 0.85" in stderr
    assert "deployctl plan ct200-sim --context 200000" in stderr
    _, _, quiet = run_cli("render", "ct200-sim", "--context", "200k", "--mem-fraction-static", "0.93")
    assert quiet == ""


def test_plan_takes_set_and_plans_with_it() -> None:
    """The alternative the plan suggests is one command: --set kv-cache-dtype=fp8_e4m3 halves the cell."""
    base = run_cli("plan", "ct200-sim", "--context", "250k", "--offline", "--json")
    fp8 = run_cli(
        "plan", "ct200-sim", "--context", "250k", "--offline", "--json", "--set", "kv-cache-dtype=fp8_e4m3"
    )
    assert (base[0], fp8[0]) == (8, 0)  # not feasible, then feasible: the exit status says which
    before, after = json.loads(base[1]), json.loads(fp8[1])
    assert not before["feasible"] and after["feasible"]
    assert after["predicted_pool_tokens"] >= 250_000


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--set", "kv-cache-dtype=fp8"), ("--set kv-cache-dtype", "fp8_e4m3")),
        (("--set", "context-lenght=5"), ("did you mean --context-length",)),
        (("--set", "context-length=5"), ("--context",)),
        (("--set", "mem-fraction-static=0.9", "--mem-fraction-static", "0.9"), ("both given",)),
    ],
)
def test_plan_and_apply_check_set_as_render_does(argv: tuple[str, ...], words: tuple[str, ...]) -> None:
    for command in (("plan", "ct200-sim", "--offline"), ("apply", "ct200-sim", "--dry-run")):
        code, stdout, stderr = run_cli(*command, "--context", "200k", *argv)
        assert (code, stdout) == (ExitCode.USAGE, ""), stderr
        for word in words:
            assert word in stderr.splitlines()[0], stderr


def test_set_fraction_is_the_fraction_option() -> None:
    one = run_cli(
        "plan", "ct200-sim", "--context", "200k", "--offline", "--json", "--set", "mem-fraction-static=0.9"
    )
    two = run_cli(
        "plan", "ct200-sim", "--context", "200k", "--offline", "--json", "--mem-fraction-static", "0.9"
    )
    assert one == two and json.loads(one[1])["mem_fraction_static"] == 0.9
