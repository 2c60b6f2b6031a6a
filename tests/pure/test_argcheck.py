"""Validate before install: the host's own SGLang parser reads the rendered flags, never as root."""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest

from agent.host import argcheck
from agent.host.argcheck import ArgCheck, CheckCommand, Verdict, check_unit, command_for, run_check

# A stand-in for sglang/srt/server_args.py: the same entry point, a small parser.
FAKE_SERVER_ARGS = """\
import argparse, time, os
if os.environ.get("SLOW"):
    time.sleep(30)
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", required=True)
        parser.add_argument("--tp-size", type=int, default=1)
        parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e4m3"])
"""


def unit(user: str | None, exec_start: str, env: str = "") -> str:
    lines = [
        "[Unit]",
        "Description=x",
        "[Service]",
        f"User={user}" if user else "",
        env,
        f"ExecStart={exec_start}",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(FAKE_SERVER_ARGS)
    return tmp_path / "site"


def check(site: Path, *flags: str, env: dict[str, str] | None = None, timeout: float = 60) -> ArgCheck:
    """The parser's answers as this test's own account: these tests are about what it says, not as whom it
    runs (the uid-0 refusal has its own tests), and the pure tier may run as root."""
    cmd = CheckCommand(sys.executable, flags, getpass.getuser(), {"PYTHONPATH": str(site), **(env or {})})
    with mock.patch.object(argcheck, "account", lambda user: pwd.getpwuid(os.geteuid())):
        return run_check(cmd, timeout)


def test_good_flags_are_accepted(fake_sglang: Path) -> None:
    assert check(fake_sglang, "--model-path", "/m", "--tp-size", "8").verdict is Verdict.ACCEPTED


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--model-path", "/m", "--tp-size", "one"), "invalid int value: 'one'"),
        (("--model-path", "/m", "--kv-cache-dtype", "fp9"), "invalid choice: 'fp9'"),
        (("--model-path", "/m", "--context-lenght", "1"), "unrecognized arguments: --context-lenght 1"),
    ],
)
def test_sglangs_refusal_is_its_own_line(fake_sglang: Path, flags: tuple[str, ...], said: str) -> None:
    result = check(fake_sglang, *flags)
    assert result.verdict is Verdict.REFUSED and said in result.detail, result


def test_a_slow_import_is_skipped_with_a_note(fake_sglang: Path) -> None:
    result = check(fake_sglang, "--model-path", "/m", env={"SLOW": "1"}, timeout=2)
    assert result.verdict is Verdict.SKIPPED and "within 2 s" in result.detail


def test_no_sglang_is_skipped_with_a_note(tmp_path: Path) -> None:
    result = check(tmp_path, "--model-path", "/m")
    assert result.verdict is Verdict.SKIPPED and "did not import" in result.detail


@pytest.mark.parametrize("user", [None, "root", "0"])
def test_never_run_as_root(user: str | None) -> None:
    """A security review forbids running the service venv's code as root: no User= means no check."""
    text = unit(user, "/opt/venv/bin/python -m sglang.launch_server --model-path /m")
    assert "never run as root" in str(command_for(text))
    assert check_unit(text).verdict is Verdict.SKIPPED


def test_the_command_runs_as_the_units_user_with_its_environment() -> None:
    text = unit(
        "sglang",
        '/opt/venv/bin/python -m sglang.launch_server --model-path "/m x" --tp-size 8 --tag a$$b',
        'Environment="HF_HOME=/data/hf cache"',
    )
    cmd = command_for(text)
    assert isinstance(cmd, CheckCommand)
    assert (cmd.interpreter, cmd.user) == ("/opt/venv/bin/python", "sglang")
    assert cmd.flags == ("--model-path", "/m x", "--tp-size", "8", "--tag", "a$b")
    assert cmd.environment["HF_HOME"] == "/data/hf cache"


def test_sglang_serve_uses_the_venvs_python(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    cmd = command_for(unit("sglang", f"{tmp_path}/bin/sglang serve --model-path /m"))
    assert isinstance(cmd, CheckCommand) and cmd.interpreter == f"{tmp_path}/bin/python"
    assert "no Python interpreter" in str(command_for(unit("sglang", "/usr/bin/numactl -N0 sglang serve")))


def test_an_unknown_user_is_skipped() -> None:
    cmd = CheckCommand(sys.executable, ("--model-path", "/m"), "no-such-user-here", {})
    assert run_check(cmd).verdict is Verdict.SKIPPED


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root")
def test_as_root_the_parser_runs_as_the_service_user(tmp_path: Path) -> None:
    """The agent runs as root; SGLang's code runs as the unit's User= (here nobody), never as root."""
    site = Path(tempfile.mkdtemp(prefix="argcheck-"))
    try:
        (site / "sglang" / "srt").mkdir(parents=True)
        (site / "sglang" / "__init__.py").write_text("")
        (site / "sglang" / "srt" / "__init__.py").write_text("")
        (site / "sglang" / "srt" / "server_args.py").write_text(
            "import os\nraise SystemExit(f'uid={os.getuid()} gid={os.getgid()} groups={os.getgroups()}')\n"
        )
        for path in [site, *site.rglob("*")]:
            path.chmod(0o755)
        nobody = pwd.getpwnam("nobody")
        python = "/usr/bin/python3"  # the venv of this checkout may sit where nobody cannot read
        cmd = CheckCommand(python, ("--model-path", "/m"), "nobody", {"PYTHONPATH": str(site)})
        said = run_check(cmd).detail
        groups = sorted(os.getgrouplist("nobody", nobody.pw_gid))  # initgroups, as systemd does
        assert f"uid={nobody.pw_uid} gid={nobody.pw_gid} groups={groups}" in said, said
    finally:
        shutil.rmtree(site)


@pytest.mark.parametrize("user", ["root", "0", "toor", "00"])
def test_no_uid_0_account_runs_the_python_under_any_name(monkeypatch: pytest.MonkeyPatch, user: str) -> None:
    """User= resolved as systemd does (a name or a numeric uid): any uid 0 is root's powers, never used."""
    toor = pwd.struct_passwd((user, "x", 0, 0, "", "/root", "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: toor)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: toor)
    ran: list[object] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: ran.append(kw))
    said = argcheck.run_as_user(CheckCommand("/usr/bin/python3", (), user, {}), ["-c", "pass"], 1.0)
    assert ran == [] and "uid 0" in str(said)


def test_an_unknown_user_is_not_checked_and_says_why() -> None:
    said = argcheck.run_as_user(
        CheckCommand("/usr/bin/python3", (), "no-such-user-x9", {}), ["-c", "pass"], 1.0
    )
    assert said == "no user 'no-such-user-x9' on this host: not checked"
    said = argcheck.run_as_user(CheckCommand("/usr/bin/python3", (), "4000000000", {}), ["-c", "pass"], 1.0)
    assert "not checked" in str(said)


def test_the_python_gets_the_users_supplementary_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """systemd's initgroups: a user whose engine libraries are readable by a group it is in imports them."""
    svc = pwd.struct_passwd(("svc", "x", 1234, 1234, "", "/", "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: svc)
    monkeypatch.setattr(os, "getgrouplist", lambda name, gid: [gid, 44, 107] if name == "svc" else [])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    ran: list[dict[str, object]] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: ran.append(kw))
    argcheck.run_as_user(CheckCommand("/usr/bin/python3", (), "svc", {}), ["-c", "pass"], 1.0)
    assert ran[0]["user"] == 1234 and ran[0]["group"] == 1234 and ran[0]["extra_groups"] == [1234, 44, 107]
