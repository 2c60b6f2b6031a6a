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
def at_the_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(ROOT)  # ./units: the shipped inventory
    monkeypatch.delenv("DEPLOYCTL_UNITS", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # what deployctl saw: none yet


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


OLD, NEW = "sglang.service.bak.20261201T100000Z", "sglang.service.bak.20261203T093000Z"


class _Client:
    def __init__(self, rows: list[dict[str, object]]) -> None:
        self.rows = rows

    def call(self, request: object) -> dict[str, object]:
        return {"backups": self.rows}


def seen_on(host_name: str, *names: str) -> None:
    """`deployctl backups HOST` (and rollback, which lists them first) as run against a host with these."""
    from agent import deploy
    from agent.inventory import load_service, units_dir
    from agent.orchestrate.session import Session

    host = load_service(host_name, units_dir(str(ROOT / "units")))
    rows: list[dict[str, object]] = [{"name": n, "changes": []} for n in names]
    deploy.backup_listing(Session(host, _Client(rows)))  # type: ignore[arg-type]


def test_backup_names_deployctl_last_saw_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    seen_on("ct200", OLD, NEW)
    assert complete("deployctl rollback ct200 --to ", monkeypatch) == [NEW, OLD]  # newest first
    assert complete("deployctl rollback ct200 --to sglang.service.bak.20261203", monkeypatch) == [NEW]
    assert complete("deployctl rollback ct200-sim --to ", monkeypatch) == []  # another host's


def test_a_listing_replaces_what_was_seen_before(monkeypatch: pytest.MonkeyPatch) -> None:
    seen_on("ct200", OLD, NEW)
    seen_on("ct200", NEW)  # retention removed the old one
    assert complete("deployctl rollback ct200 --to ", monkeypatch) == [NEW]


def test_a_backup_an_apply_made_is_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.orchestrate import backup_names

    backup_names.remember("ct200", [OLD], every=True)
    backup_names.remember("ct200", [NEW])
    assert complete("deployctl rollback ct200 --to ", monkeypatch) == [NEW, OLD]


@pytest.mark.parametrize("state", ["a file, not a folder", "garbage", "unreadable"])
def test_a_completer_that_fails_offers_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, state: str
) -> None:
    where = tmp_path / "broken"
    if state == "a file, not a folder":
        where.write_text("x", encoding="utf-8")
    else:
        (where / "deployctl" / "backups").mkdir(parents=True)
        names = where / "deployctl" / "backups" / "ct200"
        names.write_bytes(b"\xff\xfe\x00junk\n../../etc/passwd\n" if state == "garbage" else b"")
        if state == "unreadable":
            names.unlink()
            names.mkdir()  # reading a folder as the file fails
    monkeypatch.setenv("XDG_STATE_HOME", str(where))
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


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_real_bash_completes_backup_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bash itself completes `deployctl rollback ct200 --to sglang` from what deployctl last saw."""
    bindir = Path(sys.executable).parent
    if not (bindir / "deployctl").exists() or not (bindir / "register-python-argcomplete").exists():
        pytest.skip("deployctl is not installed in this environment")
    seen_on("ct200", OLD, NEW)
    line = "deployctl rollback ct200 --to sglang"
    script = (
        'eval "$(register-python-argcomplete deployctl)"\n'
        f"COMP_WORDS=({line}); COMP_CWORD=4; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n"
        "_python_argcomplete deployctl sglang --to\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.stdout.split() == [NEW, OLD], done.stderr
