"""Bad input on the command line and in the inventory: exit 2, one line naming the culprit, nothing kept."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from agent.cli.main import COMMANDS, main
from agent.exitcodes import ExitCode
from agent.output import Output

UNITS = Path(__file__).resolve().parents[2] / "units"


def run_cli(*argv: str, units: Path = UNITS) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(units), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


@pytest.fixture(autouse=True)
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in an empty folder, so "nothing written" can be checked."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEPLOYCTL_UNITS", raising=False)
    return tmp_path


def assert_refused(result: tuple[int, str, str], *words: str) -> str:
    """Exit 2, nothing on stdout, one error line (and at most a hint) naming the culprit."""
    code, stdout, stderr = result
    assert code == ExitCode.USAGE, stderr
    assert stdout == ""
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert lines[0].startswith("deployctl: error: ")
    assert len(lines) == 1 or lines[1].startswith("deployctl: hint: ")
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("200000", 200000),
        ("200k", 200000),
        ("200K", 200000),
        ("128Ki", 131072),
        ("200.5k", 200500),
        ("0.5M", 500000),
    ],
)
def test_context_accepted(text: str, tokens: int, empty_cwd: Path) -> None:
    code, stdout, stderr = run_cli("render", "ct200", "--context", text, "--mem-fraction-static", "0.9")
    assert (code, stderr) == (0, "")
    assert f"    --context-length {tokens} \\\n" in stdout
    assert list(empty_cwd.iterdir()) == []


@pytest.mark.parametrize("text", ["abc", "-5", "0", "1e99", "200.0005k", "1.5", "0.5.1k", "10000001", ""])
def test_context_refused(text: str, empty_cwd: Path) -> None:
    assert_refused(run_cli("render", "ct200", "--context", text), "--context")
    assert list(empty_cwd.iterdir()) == []


def test_context_is_required() -> None:
    assert_refused(run_cli("render", "ct200"), "--context")


@pytest.mark.parametrize("text", ["0", "1", "1.5", "-0.1", "nan", "abc", "inf"])
def test_fraction_refused(text: str) -> None:
    args = ("render", "ct200", "--context", "200k", f"--mem-fraction-static={text}")
    assert_refused(run_cli(*args), "--mem-fraction-static")


@pytest.mark.parametrize("text", ["0", "-1", "2.5", "x"])
def test_max_running_requests_refused(text: str) -> None:
    args = ("render", "ct200", "--context", "200k", f"--max-running-requests={text}")
    assert_refused(run_cli(*args), "--max-running-requests")


def test_options_reach_the_unit() -> None:
    code, stdout, _ = run_cli(
        "render", "ct200", "--context", "200k", "--mem-fraction-static", "0.94", "--max-running-requests", "8"
    )
    assert code == 0
    assert "--mem-fraction-static 0.94 \\\n" in stdout
    assert "--max-running-requests 8 \\\n" in stdout


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("served-model-name=a\nb", ("--set served-model-name", "control character (\\n)")),
        ("x\x1b=1", ("--set x\\x1b", "control character")),
        ("novalue", ("--set 'novalue'", "FLAG=VALUE")),
        ("Bad_Flag=1", ("--set",)),
        ("mem-fraction-static=1.5", ("--set mem-fraction-static",)),
        ("context-length=abc", ("--set context-length",)),
    ],
)
def test_bad_set_refused(value: str, words: tuple[str, ...], empty_cwd: Path) -> None:
    assert_refused(run_cli("render", "ct200", "--context", "200k", "--set", value), *words)
    assert list(empty_cwd.iterdir()) == []


def test_set_flags() -> None:
    code, stdout, _ = run_cli(
        "render", "ct200", "--context", "200k", "--set=--enable-metrics=true",
        "--set", "trust-remote-code=false", "--set", "mem-fraction-static=0.94",
    )  # fmt: skip
    assert code == 0
    assert "    --enable-metrics \\\n" in stdout
    assert "--trust-remote-code" not in stdout
    assert "--mem-fraction-static 0.94 \\\n" in stdout


def test_set_and_option_for_one_flag_conflict() -> None:
    args = ("render", "ct200", "--context", "200k", "--set", "context-length=100000")
    assert_refused(run_cli(*args), "--set context-length", "--context")


def test_diff_shows_the_flag_table_and_the_unified_diff() -> None:
    args = ("render", "ct200", "--context", "200k", "--set", "mem-fraction-static=0.94", "--diff")
    code, stdout, _ = run_cli(*args)
    assert code == 0
    assert "--context-length      | 32768  | 200000" in stdout
    assert "--mem-fraction-static | 0.85   | 0.94" in stdout
    assert "--- a/sglang.service\n+++ b/sglang.service\n" in stdout
    assert "\n-    --context-length 32768 \\\n" in stdout
    assert "\n+    --context-length 200000 \\\n" in stdout


def test_diff_of_the_baseline_says_so() -> None:
    code, stdout, _ = run_cli("render", "ct200", "--context", "32768", "--diff")
    assert (code, stdout) == (0, "sglang.service for ct200: no change from the baseline unit\n")


def test_unknown_host_suggests_close_names() -> None:
    code, _, stderr = run_cli("render", "ct20", "--context", "200k")
    assert_refused((code, "", stderr), "unknown host 'ct20'")
    assert "did you mean: ct200" in stderr.splitlines()[1]


@pytest.fixture
def bad_units(tmp_path: Path) -> Path:
    folder = tmp_path / "inventory"
    folder.mkdir()
    good = (UNITS / "ct200.toml").read_text(encoding="utf-8")
    variants = {
        "unknown-key": good.replace("[gpus]\n", "[gpus]\ncolour = 'green'\n"),
        "wrong-type": good.replace("count = 8", 'count = "eight"'),
        "newline-path": good.replace('path = "/models/Kimi-K2.6"', 'path = "/models/Kimi\\nK2.6"'),
        "not-toml": good.replace("[gpus]", "[gpus"),
    }
    for name, text in variants.items():
        (folder / f"{name}.toml").write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("unknown-key", ("unknown-key.toml", "gpus.colour", "unknown key")),
        ("wrong-type", ("wrong-type.toml", "gpus.count")),
        ("newline-path", ("newline-path.toml", "model.path", "control character")),
        ("not-toml", ("not-toml.toml", "TOML")),
    ],
)
def test_bad_inventory_file(bad_units: Path, name: str, words: tuple[str, ...]) -> None:
    assert_refused(run_cli("render", name, "--context", "200k", units=bad_units), *words)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_for_every_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    assert f"usage: deployctl {command}" in capsys.readouterr().out


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all(command in shown for command in COMMANDS)


@pytest.mark.parametrize(
    "setting", ["api-key=ab\udcffcd", "ap\udcffi=1", "served-model-name=k\udce9"], ids=["value", "name", "e9"]
)
def test_bytes_that_are_not_utf8_are_refused_at_the_edge(setting: str) -> None:
    """Python reads argv bytes that are not UTF-8 as lone surrogates: refused before anything is rendered
    (apply renders through the same checks), so no unit that cannot be written ever reaches the host."""
    err = assert_refused(run_cli("render", "ct200-sim", "--context", "200k", "--set", setting))
    assert "not valid UTF-8" in err
    err.encode("utf-8")  # the error line itself prints on any terminal
