"""Shell completion, driven as bash drives it (argcomplete's own way: _ARGCOMPLETE=1, COMP_LINE and
COMP_POINT in the environment, the answer on an output stream, separated by _ARGCOMPLETE_IFS)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import completion
from agent.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
IFS = "\013"


def complete(line: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The completions bash would get for `line` with the cursor at its end."""
    monkeypatch.setenv("_ARGCOMPLETE", "1")
    monkeypatch.setenv("_ARGCOMPLETE_IFS", IFS)
    monkeypatch.setenv("COMP_LINE", line)
    monkeypatch.setenv("COMP_POINT", str(len(line)))
    monkeypatch.setenv("_ARGCOMPLETE_SHELL", "bash")
    monkeypatch.delenv("_ARGCOMPLETE_SUPPRESS_SPACE", raising=False)
    out = io.StringIO()
    exits: list[int] = []
    completion.offer(build_parser(), output_stream=out, exit_method=exits.append)
    assert exits == [0]
    return [w.strip() for w in out.getvalue().split(IFS) if w]


@pytest.fixture(autouse=True)
def at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # ./units: the shipped inventory
    monkeypatch.delenv("DEPLOYCTL_UNITS", raising=False)


def test_subcommands(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"plan", "parse-log"} <= set(complete("deployctl p", monkeypatch))
    assert set(complete("deployctl fleet ", monkeypatch)) == {"apply", "status"}


def test_options_of_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    words = complete("deployctl plan ct200 --c", monkeypatch)
    assert words == ["--context"]
    assert "--mem-fraction-static" in complete("deployctl apply ct200 --", monkeypatch)


def test_host_names_from_the_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(complete("deployctl plan ct", monkeypatch)) == {"ct200", "ct200-sim"}
    assert complete("deployctl status ct200-s", monkeypatch) == ["ct200-sim"]


def test_host_names_from_another_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpu7.toml").write_text("", encoding="utf-8")
    assert complete(f"deployctl --units {tmp_path} apply g", monkeypatch) == ["gpu7"]


def test_backup_names_are_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert complete("deployctl rollback ct200 --to ", monkeypatch) == []


def test_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "all" in complete("deployctl fleet apply ", monkeypatch)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_real_bash_completes_through_the_registered_function(tmp_path: Path) -> None:
    """bash itself, with the function register-python-argcomplete prints, completes `deployctl pl`."""
    bindir = Path(sys.executable).parent
    if not (bindir / "deployctl").exists() or not (bindir / "register-python-argcomplete").exists():
        pytest.skip("deployctl is not installed in this environment")
    script = (
        'eval "$(register-python-argcomplete deployctl)"\n'
        "COMP_WORDS=(deployctl pl); COMP_CWORD=1; COMP_LINE='deployctl pl'; COMP_POINT=${#COMP_LINE}\n"
        "_python_argcomplete deployctl pl deployctl\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.stdout.split() == ["plan"], done.stderr
