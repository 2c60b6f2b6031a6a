"""Validate before install: the rendered command line read by the host's own SGLang argument parser.

SGLang's parser (sglang/srt/server_args.py ServerArgs.add_cli_args) is built in the service's own Python
and handed the unit's flags, before the unit is written. The service venv's code never runs as root: it
runs as the unit's User= (dropping privileges with the interpreter's setuid/setgid), with a time limit,
from /, with the unit's own Environment= and nothing of the agent's. A unit with no User= (or User=root),
an interpreter that cannot be found, an import that fails or runs past the limit: the check is skipped,
and the transaction says so. Only the parser's own refusal (argparse's exit 2) stops the change.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from agent.sglang.flags import FlagsError, split_words, unit_lines
from agent.sglang.unitfile import split_environment

TIMEOUT_S = 60.0  # SGLang's import takes 10-30 s on a GPU host; past this the check is skipped
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NO_IMPORT = 10  # the script's exit status when SGLang's parser does not import

# Run by the service's interpreter: build SGLang's parser and let it read the flags (exit 2 on refusal).
SCRIPT = """\
import argparse, sys
try:
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="sglang")
    ServerArgs.add_cli_args(parser)
except BaseException as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(10)
parser.parse_args(sys.argv[1:])
"""


class Verdict(str, Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class ArgCheck:
    verdict: Verdict
    detail: str  # SGLang's own error line, or why the check was skipped


@dataclass(frozen=True)
class CheckCommand:
    """What to run: the service's interpreter, SGLang's flags, as whom, with which environment."""

    interpreter: str
    flags: tuple[str, ...]
    user: str
    environment: Mapping[str, str]


def command_for(unit_text: str) -> CheckCommand | str:
    """The check to run for a rendered unit, or why there is none (one line)."""
    service = {k: v for s, k, v in unit_lines(unit_text) if s == "Service" and k != "Environment"}
    user = service.get("User", "").strip()
    if not user or user in ("root", "0"):
        return "the unit has no User= other than root, and the service's Python is never run as root"
    try:
        words = split_words(service.get("ExecStart", ""))
    except FlagsError as exc:
        return f"ExecStart= does not read: {exc}"
    first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    interpreter = _interpreter([w.lstrip("-@+!:") if i == 0 else w for i, w in enumerate(words[:first])])
    if interpreter is None:
        return f"no Python interpreter in ExecStart= ({' '.join(words[:first])})"
    env = {"PATH": _PATH, "HOME": "/", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        for s, k, v in unit_lines(unit_text):
            if s == "Service" and k == "Environment":
                env.update(split_environment(v))
    except ValueError as exc:  # AdoptError: not NAME=VALUE
        return f"Environment= does not read: {exc}"
    return CheckCommand(interpreter, tuple(words[first:]), user, env)


def _interpreter(command: list[str]) -> str | None:
    """`PYTHON -m sglang.launch_server` -> PYTHON; `BIN/sglang serve` -> BIN/python when it exists."""
    if len(command) >= 3 and command[1:3] == ["-m", "sglang.launch_server"]:
        return command[0]
    if len(command) == 2 and command[0].endswith("/sglang") and command[1] == "serve":
        python = Path(command[0]).parent / "python"
        return str(python) if python.exists() else None
    return None


def account(user: str) -> pwd.struct_passwd | str:
    """User= as systemd resolves it (a name, or a numeric uid, through the passwd database), or why the
    Python is not run as it: unknown here, or uid 0 under any name (root's powers whatever it is called)."""
    try:
        who = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        return f"no user {user!r} on this host: not checked"
    if who.pw_uid == 0:
        return f"User={user} is uid 0, and the service's Python is never run as root: not checked"
    return who


def run_as_user(
    cmd: CheckCommand, argv: list[str], timeout_s: float
) -> subprocess.CompletedProcess[str] | str:
    """cmd.interpreter with `argv`, as cmd.user (never as uid 0) with its supplementary groups as systemd
    gives them (initgroups), from /, with the unit's environment only; or why it did not run or end."""
    who = account(cmd.user)
    if isinstance(who, str):
        return who
    switch = (who.pw_uid, who.pw_gid) != (os.geteuid(), os.getegid())
    try:
        return subprocess.run(
            [cmd.interpreter, *argv],
            env=dict(cmd.environment), cwd="/", capture_output=True, text=True, errors="replace",
            timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
            user=who.pw_uid if switch else None, group=who.pw_gid if switch else None,
            extra_groups=os.getgrouplist(who.pw_name, who.pw_gid) if switch else None,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"it did not end within {timeout_s:.0f} s"
    except OSError as exc:
        return f"could not run {cmd.interpreter} as {cmd.user}: {exc.strerror}"


def last_line(text: str, returncode: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {returncode}"


def run_check(cmd: CheckCommand, timeout_s: float = TIMEOUT_S) -> ArgCheck:
    """Run SGLang's parser on the flags as cmd.user; a refusal carries SGLang's own error line."""
    done = run_as_user(cmd, ["-c", SCRIPT, *cmd.flags], timeout_s)
    if isinstance(done, str):
        if done.startswith("it did not end"):
            return ArgCheck(Verdict.SKIPPED, f"SGLang's parser did not load within {timeout_s:.0f} s")
        return ArgCheck(Verdict.SKIPPED, done)
    last = last_line(done.stderr, done.returncode)
    if done.returncode == 0:
        return ArgCheck(Verdict.ACCEPTED, f"SGLang's own parser accepts the flags (run as {cmd.user})")
    if done.returncode == 2:
        return ArgCheck(Verdict.REFUSED, last)
    if done.returncode == _NO_IMPORT:
        return ArgCheck(Verdict.SKIPPED, f"SGLang's parser did not import: {last}")
    return ArgCheck(Verdict.SKIPPED, f"the check ended with status {done.returncode}: {last}")


def check_unit(unit_text: str, timeout_s: float = TIMEOUT_S) -> ArgCheck:
    """The rendered unit's flags against the host's SGLang, or why that was not asked."""
    cmd = command_for(unit_text)
    if isinstance(cmd, str):
        return ArgCheck(Verdict.SKIPPED, cmd)
    return run_check(cmd, timeout_s)
