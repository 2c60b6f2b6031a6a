"""Hostile input via the CLI and the inventory: one error line and exit 2, or a unit that reads back exactly.

Every property runs the real command line in-process: a refused value must give exactly one
`deployctl: error:` line (and at most one hint), exit code 2, no traceback, no raw control character
on the terminal and no file written; an accepted value must reach the unit so that systemd's quoting
rules read back the very same argv and environment.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.apply import show_plan
from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.from_facts import plan_for_host
from agent.render import CACHE_ENV, SECRET_FLAG, is_secret_env, render_unit, template_dir
from agent.sglang import flagrules
from agent.sglang.flags import FlagValue, parse_unit, split_words, unit_lines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UNITS = Path(__file__).resolve().parents[2] / "units"
BASE: dict[str, Any] = tomllib.loads((UNITS / "ct200.toml").read_text(encoding="utf-8"))
# SGLang 0.5.23's own table, read as data: which names exist, and which take any text at all.
SGLANG: dict[str, Any] = json.loads(
    (UNITS.parent / "agent" / "sglang" / "data" / "server_args-0.5.23.json").read_text(encoding="utf-8")
)
KNOWN_FLAGS = frozenset(n for f in SGLANG["flags"] for n in f["names"])
TEXT_FLAGS = sorted(
    n
    for f in SGLANG["flags"]
    if (f["takes"], f["type"], f["choices"], f["nargs"], f.get("deprecated"))
    == ("value", "str", None, None, None)
    for n in f["names"]
    if not SECRET_FLAG.search(n)
    and n != "config"  # secrets go to the --config credential, not ExecStart=
    # deployctl's own rules (sglang/flagrules.py): an alias is written as SGLang documents it, and the flags
    # the inventory sets from its own keys or checks further are refused here (tests/pure/test_first_hour.py)
    and flagrules.canonical(n, "0.5.23") == n
    and flagrules.set_elsewhere(n) is None
    and n not in flagrules.NOT_EMPTY | flagrules.JSON_TEXT
)
EITHER = ("either", None)  # a known flag whose value only SGLang's own type decides: refused or read back

# Bounded so that `make test` stays quick: each example runs the whole CLI (argparse included, ~10 ms).
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# What may never reach a terminal: C0 (but \n), DEL and C1, which can rewrite the screen.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# What the renderer refuses in any value: C0, DEL and C1.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
NASTY = [
    " ", '"', "'", "$", "`", "%", "%n", "%%", "\\", ";", "&", "|", "<", ">", "(", ")", "{", "}", "[", "]",
    "#", "=", "*", "?", "~", "!", "/", "..", "../", "--", "-", "$(id)", "${HOME}", "`id`", "\n", "\r", "\t",
    "\x00", "\x1b[31m", "\x7f", "\x85", "\u2028", "\ufeff", "é", "✓", "日本", "\U0001f600", "9" * 30,
]  # fmt: skip
PIECES = st.one_of(st.sampled_from(NASTY), st.characters(exclude_categories=("Cs",)))
WEIRD = st.lists(PIECES, max_size=12).map("".join)
NUMBERS = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.just("9" * 5000),
)


@dataclass(frozen=True)
class Place:
    units: Path
    cwd: Path


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    """An inventory copy and an empty working folder; the module runs inside the latter."""
    root = tmp_path_factory.mktemp("hostile")
    units, cwd = root / "units", root / "cwd"
    units.mkdir()
    cwd.mkdir()
    for name in ("ct200.toml", "ct200-sim.toml"):
        shutil.copy(UNITS / name, units / name)
    before = os.getcwd()
    os.chdir(cwd)
    try:
        yield Place(units, cwd)
    finally:
        os.chdir(before)


def snapshot(*folders: Path) -> dict[str, str]:
    """Every file under the folders with the hash of its content."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str


def run_cli(place: Place, *argv: str, analyze: bool = False) -> Run:
    """deployctl in-process; asserts that it wrote no file in the inventory or the working folder.

    Without `analyze`, systemd-analyze is out of reach (as on a laptop without systemd): it costs 30 ms
    a run, and these properties are about our own checks and quoting; test_render and the property
    with analyze=True below keep systemd's own verdict in the loop.
    """
    before = snapshot(place.units, place.cwd)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.MonkeyPatch.context() as mp:
        if not analyze:
            mp.setenv("PATH", str(place.cwd / "no-such-bin"))
        code = main(["--units", str(place.units), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    assert snapshot(place.units, place.cwd) == before, "a command wrote a file"
    # render's note that the context alone does not grow the pool is not what these properties are about
    stderr = "".join(
        line for line in out.stderr.getvalue().splitlines(True) if not line.startswith("deployctl: note: ")
    )
    return Run(code, out.stdout.getvalue(), stderr)


def assert_refused(run: Run) -> None:
    """Exit 2, no report, one error line and at most one hint, nothing a terminal would interpret."""
    assert run.code == ExitCode.USAGE, run
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    assert run.stderr.endswith("\n"), run.stderr
    lines = run.stderr[:-1].split("\n")
    assert 1 <= len(lines) <= 2, run.stderr
    assert lines[0].startswith("deployctl: error: ")
    assert len(lines) == 1 or lines[1].startswith("deployctl: hint: ")
    assert not RAW_CONTROL.search(run.stderr), ascii(run.stderr)


def accepted_flags(run: Run) -> dict[str, FlagValue]:
    assert (run.code, run.stderr) == (0, ""), run
    return parse_unit(run.stdout)[1]


# --- command-line values ---------------------------------------------------------------------------------

SUFFIXES = {"": 1, "k": 1000, "ki": 1024, "m": 1000**2, "mi": 1024**2}  # in any case: 1m, 1M; 128ki, 128Ki


def expected_context(text: str) -> int | None:
    """The tokens a --context text means, or None if it must be refused (the README's rule)."""
    m = re.fullmatch(r"([0-9]+)(ki|k|mi|m)?", text.strip(), re.IGNORECASE)
    if m is None or len(m[1]) > 4000:
        return None
    tokens = int(m[1]) * SUFFIXES[(m[2] or "").lower()]
    return tokens if 0 < tokens <= 10_000_000 else None


CONTEXTS = st.one_of(
    WEIRD,
    NUMBERS,
    st.tuples(
        st.integers(-5, 20_000_000), st.sampled_from([*SUFFIXES, "K", "M", "Ki", "MI", "KB", "G", " k"])
    ).map(lambda t: f"{t[0]}{t[1]}"),
)


@MANY
@given(CONTEXTS)
def test_any_context_is_refused_in_one_line_or_reaches_the_unit(place: Place, text: str) -> None:
    run = run_cli(place, "render", "ct200", f"--context={text}")
    tokens = expected_context(text)
    if tokens is None:
        assert_refused(run)
        assert "--context" in run.stderr
    else:
        assert accepted_flags(run)["context-length"] == str(tokens)


def expected_fraction(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1 else None


@MANY
@given(st.one_of(WEIRD, NUMBERS, st.floats(-1, 2).map(repr), st.sampled_from(["nan", "-inf", "1e-400"])))
def test_any_fraction_is_refused_in_one_line_or_reaches_the_unit(place: Place, text: str) -> None:
    run = run_cli(place, "render", "ct200", "--context=200k", f"--mem-fraction-static={text}")
    value = expected_fraction(text)
    if value is None:
        assert_refused(run)
    else:
        assert float(str(accepted_flags(run)["mem-fraction-static"])) == value


MAX_REQUESTS = 1_000_000


@MANY
@given(st.one_of(WEIRD, NUMBERS, st.integers(-3, 3 * MAX_REQUESTS).map(str)))
def test_any_request_count_is_refused_in_one_line_or_reaches_the_unit(place: Place, text: str) -> None:
    run = run_cli(place, "render", "ct200", "--context=200k", f"--max-running-requests={text}")
    ok = re.fullmatch(r"[0-9]{1,4000}", text.strip()) and 0 < int(text) <= MAX_REQUESTS
    if not ok:
        assert_refused(run)
    else:
        assert accepted_flags(run)["max-running-requests"] == str(int(text))


FLAG_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
SET_NAMES = st.one_of(
    st.from_regex(r"-{0,2}[a-z0-9][a-z0-9-]{0,20}", fullmatch=True),
    st.sampled_from(["mem-fraction-static", "max-running-requests", "context-length", "model-path", "port"]),
    WEIRD,
)


def expected_set(text: str) -> tuple[str, FlagValue | None] | None:
    """(flag, value read back; None: left out) for a --set text, or None if it must be refused."""
    name, eq, value = text.partition("=")
    name = name.strip().lstrip("-")
    if not eq or not FLAG_NAME.fullmatch(name) or CONTROL.search(name + value):
        return None
    if name == "context-length":
        return None  # --context is given too
    if name == "mem-fraction-static":
        fraction = expected_fraction(value)
        return None if fraction is None else (name, repr(fraction))
    if name == "max-running-requests":
        ok = re.fullmatch(r"[0-9]{1,4000}", value.strip()) and 0 < int(value) <= MAX_REQUESTS
        return (name, str(int(value))) if ok else None
    if name not in KNOWN_FLAGS:
        return None  # SGLang has no such flag: refused with "did you mean", even as false
    read = {"true": True, "false": None}.get(value, value)
    if read is None:
        return name, None
    if name in TEXT_FLAGS:
        return None if read is True else (name, read)
    return EITHER


@MANY
@given(SET_NAMES, st.sampled_from(["=", "", "=="]), st.one_of(WEIRD, NUMBERS))
def test_any_set_flag_is_refused_in_one_line_or_reads_back(
    place: Place, name: str, eq: str, value: str
) -> None:
    text = f"{name}{eq}{value}"
    run = run_cli(place, "render", "ct200", "--context=200k", f"--set={text}")
    expected = expected_set(text)
    if expected is None or (expected == EITHER and run.code != 0):
        assert_refused(run)
        return
    if expected == EITHER:
        return
    flag, shown = expected
    flags = accepted_flags(run)
    if shown is None:
        assert flag not in flags
    else:
        assert flags[flag] == shown


HOST_NAMES = st.one_of(
    WEIRD,
    st.sampled_from(["", "/", ".", "..", "../ct200", "../../etc/passwd", "ct200/..", "ct200.toml", "-h"]),
    st.sampled_from(["ct200", "ct200-sim", "units/ct200", "/etc/passwd", "ct200\n", "ct200\x00", "ctÿ200"]),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789.-_", min_size=60, max_size=300),
)


@MANY
@given(HOST_NAMES)
def test_any_host_name_is_refused_in_one_line_unless_it_is_in_the_inventory(place: Place, name: str) -> None:
    run = run_cli(place, "render", "--context=200k", "--", name)
    if name in ("ct200", "ct200-sim"):
        assert accepted_flags(run)["context-length"] == "200000"
    else:
        assert_refused(run)


@FEW
@given(
    st.sampled_from(["apply", "rollback", "backups", "status"]),
    st.one_of(HOST_NAMES.filter(lambda n: n not in ("ct200", "ct200-sim")), st.just("nohost")),
)
def test_remote_commands_refuse_a_bad_host_before_connecting(place: Place, command: str, name: str) -> None:
    extra = ["--context=200k", "--yes"] if command == "apply" else []
    assert_refused(run_cli(place, command, *extra, "--", name))


@FEW
@given(
    st.one_of(
        CONTEXTS.filter(lambda t: expected_context(t) is None).map(lambda t: f"--context={t}"),
        st.one_of(WEIRD, NUMBERS)
        .filter(lambda t: expected_fraction(t) is None)
        .map(lambda t: f"--mem-fraction-static={t}"),
        st.one_of(WEIRD, NUMBERS)
        .filter(lambda t: expected_fraction(t) is None)
        .map(lambda t: f"--set=mem-fraction-static={t}"),  # checked as --mem-fraction-static is
    )
)
def test_apply_refuses_bad_values_before_connecting(place: Place, option: str) -> None:
    # ct200 is not reachable from here: exit 2 rather than 3 proves nothing tried to connect.
    args = ["apply", "ct200", "--yes", option]
    if not option.startswith("--context"):
        args.append("--context=200k")
    assert_refused(run_cli(place, *args))


# --- the inventory ---------------------------------------------------------------------------------------


def toml_str(text: str) -> str:
    escaped = "".join(
        "\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text
    )
    return f'"{escaped}"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_str(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_doc(data: dict[str, Any]) -> str:
    """A TOML file of sections whose values are scalars, lists or inline tables."""
    lines = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        lines += [f"{toml_str(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_host(place: Place, name: str, patch: dict[tuple[str, str], Any]) -> None:
    """Write units/<name>.toml: ct200 with the values of `patch` replaced."""
    data = {s: dict(t) for s, t in BASE.items()}
    data["ssh"]["target"] = name  # a host of its own: ct200's unit on ct200's host is ct200.toml's service
    for (section, key), value in patch.items():
        data[section][key] = value
    text = toml_doc(data)
    assert repr(tomllib.loads(text)) == repr(data)  # the file says what we meant
    (place.units / f"{name}.toml").write_text(text, encoding="utf-8")


def render_patched(place: Place, section: str, key: str, value: Any) -> Run:
    """Render ct200 with one inventory value replaced."""
    write_host(place, "hostile", {(section, key): value})
    return run_cli(place, "render", "hostile", "--context=200k")


def bad_path(path: str) -> bool:
    return not path.startswith("/") or "/../" in path + "/" or bool(CONTROL.search(path))


@FEW
@given(st.one_of(WEIRD.map(lambda t: "/models/" + t), WEIRD, st.just("/models/../../etc/shadow")))
def test_model_path_reads_back_exactly_or_is_refused(place: Place, path: str) -> None:
    run = render_patched(place, "model", "path", path)
    if bad_path(path):
        assert_refused(run)
    else:
        assert accepted_flags(run)["model-path"] == path


@FEW
@given(WEIRD)
def test_served_name_reads_back_exactly_or_is_refused(place: Place, name: str) -> None:
    run = render_patched(place, "model", "served_name", name)
    if CONTROL.search(name):
        assert_refused(run)
    elif name:
        assert accepted_flags(run)["served-model-name"] == name
    else:
        assert "served-model-name" not in accepted_flags(run)


def unit_value(text: str, wanted: str) -> str:
    """The value of Key= in [Unit], with specifiers (%% only, here) expanded as systemd does."""
    values = [v for section, key, v in unit_lines(text) if section == "Unit" and key == wanted]
    assert len(values) == 1
    return values[0].replace("%%", "%")


@FEW
@given(WEIRD)
def test_description_reads_back_exactly_or_is_refused(place: Place, description: str) -> None:
    run = render_patched(place, "unit", "description", description)
    if CONTROL.search(description) or description.strip().endswith("\\"):
        assert_refused(run)
    else:
        assert (run.code, run.stderr) == (0, ""), run
        assert unit_value(run.stdout, "Description") == description.strip()


def unit_environment(text: str) -> dict[str, str]:
    """Environment= of [Service] as systemd reads it: unquoted, specifiers expanded, never $VAR."""
    env: dict[str, str] = {}
    for section, key, value in unit_lines(text):
        if section == "Service" and key == "Environment":
            # split_words undoes ExecStart's $$ too; Environment= has no $VAR expansion, so protect $.
            for word in split_words(value.replace("$", "$$")):
                name, _, val = word.partition("=")
                env[name] = val
    return env


ENV_NAMES = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True), WEIRD)


@FEW
@given(ENV_NAMES, WEIRD)
@example("KEY", "")  # a secret-looking name, as a random draw once found
@example("PATH", "/usr/bin")
def test_environment_reads_back_exactly_or_is_refused(place: Place, name: str, value: str) -> None:
    run = render_patched(place, "unit", "environment", {name: value})
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or CONTROL.search(value):
        assert_refused(run)
    elif is_secret_env(name):  # KEY, API_TOKEN...: the value goes to a root-only EnvironmentFile=
        assert (run.code, run.stderr) == (0, ""), run
        assert name not in unit_environment(run.stdout)
        assert "EnvironmentFile=" in run.stdout
    else:
        assert (run.code, run.stderr) == (0, ""), run
        env = unit_environment(run.stdout)  # the cache folder's variables besides, unless it set one
        assert {k: v for k, v in env.items() if k not in CACHE_ENV or k == name} == {name: value}


@FEW
@given(
    st.sampled_from(TEXT_FLAGS),
    st.one_of(WEIRD, st.integers(-(10**30), 10**30), st.floats(), st.booleans()),
)
def test_baseline_flag_reads_back_exactly_or_is_refused(place: Place, name: str, value: Any) -> None:
    flags = {**BASE["sglang"]["flags"], name: value}
    run = render_patched(place, "sglang", "flags", flags)
    if (
        (isinstance(value, str) and CONTROL.search(value))
        or (isinstance(value, float) and not math.isfinite(value))
        or value is True  # these flags take a value: a bare one would stop SGLang's parser
    ):
        assert_refused(run)
        return
    read_back = accepted_flags(run)
    if value is False:
        assert name not in read_back
    elif value is True:
        assert read_back[name] is True
    else:
        assert read_back[name] == (repr(value) if isinstance(value, float) else str(value))


@FEW
@given(st.lists(WEIRD, min_size=1, max_size=3))
def test_executable_words_read_back_exactly_or_are_refused(place: Place, words: list[str]) -> None:
    executable = ["/opt/sglang/bin/python", *words]
    run = render_patched(place, "sglang", "executable", executable)
    if any(CONTROL.search(w) for w in words):
        assert_refused(run)
        return
    assert (run.code, run.stderr) == (0, ""), run
    exec_start = [v for s, k, v in unit_lines(run.stdout) if (s, k) == ("Service", "ExecStart")]
    assert split_words(exec_start[0])[: len(executable)] == executable


UNIT_FIELDS = [
    ("unit", "name"),
    ("unit", "directory"),
    ("unit", "user"),
    ("unit", "template"),
    ("ssh", "target"),
    ("ssh", "agent_dir"),
    ("sglang", "host"),
    ("gpus", "count"),
    ("sglang", "port"),
    ("unit", "start_timeout_s"),
    ("unit", "keep_backups"),
    ("planning", "margin"),
    ("unit", "secret_environment"),
]


@MANY
@given(
    st.sampled_from(UNIT_FIELDS),
    st.one_of(
        WEIRD,
        WEIRD.map(lambda t: t + ".service"),
        st.sampled_from(["../etc/passwd.service", "a/../b.service", "/etc/x.service", "..service"]),
        st.integers(-(10**30), 10**30),
        st.floats(),
        st.lists(WEIRD, max_size=2),
        st.just(""),
    ),
)
def test_any_inventory_value_renders_or_is_refused_in_one_line(
    place: Place, field: tuple[str, str], value: Any
) -> None:
    run = render_patched(place, *field, value)
    if run.code != 0:
        assert_refused(run)
        return
    assert run.stderr == "", run
    parse_unit(run.stdout)  # whatever was accepted is still one readable ExecStart
    if field == ("unit", "name"):
        assert "/" not in value and ".." not in value and value.endswith(".service")


# --- no secret in what is shown ------------------------------------------------------------------------

MARK = "ZQXJ"  # begins every secret value below, and appears nowhere else
SECRET_NAMES = ["HF_TOKEN", "OPENAI_API_KEY", "db_password", "AWS_SECRET_ACCESS_KEY", "CRED"]


def secret_host(values: dict[str, str]) -> HostConfig:
    data = {s: dict(t) for s, t in BASE.items()}
    data["unit"]["environment"] = {**data["unit"]["environment"], **values}
    data["unit"]["secret_environment"] = ["CRED"]
    return HostConfig.model_validate({**data, "name": "ct200"})


SECRET_VALUES = WEIRD.filter(lambda v: not CONTROL.search(v)).map(lambda v: MARK + v)


@FEW
@given(st.sampled_from(SECRET_NAMES), SECRET_VALUES, SECRET_VALUES)
def test_render_diff_shows_no_secret(place: Place, name: str, value: str, api_key: str) -> None:
    env = {**BASE["unit"]["environment"], name: value}
    write_host(place, "secret", {("unit", "environment"): env, ("unit", "secret_environment"): ["CRED"]})
    # A changed first flag (--tp-size) puts the Environment= lines into the diff's context.
    argv = ["render", "secret", "--context=200k", "--diff", "--set=tp-size=4"]
    run = run_cli(place, *argv, f"--set=api-key={api_key}")
    assert run.code == 0, run
    # Secret values live in root-only files the unit points at; only their names are shown.
    assert "--config /run/credentials/" in run.stdout and "EnvironmentFile=" in run.stdout
    assert name in run.stdout and "--api-key" in run.stdout
    assert MARK not in run.stdout + run.stderr


@FEW
@given(st.sampled_from(SECRET_NAMES), SECRET_VALUES, SECRET_VALUES)
def test_the_plan_shown_before_apply_has_no_secret(name: str, value: str, api_key: str) -> None:
    plain = secret_host({})
    host = secret_host({name: value})
    plan = plan_for_host(host, Target(200_000), None, dict(host.sglang.flags))
    old = render_unit(plain, {}, template_dir())
    new = render_unit(host, {**plan.flags(), "api-key": api_key}, template_dir())
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    show_plan(out, host, plan, old, new)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    shown = out.stdout.getvalue() + out.stderr.getvalue()
    assert "--api-key" in shown and name in shown  # the changes are shown ...
    assert MARK not in shown  # ... but not their values


# --- systemd's own verdict on weird but good values ----------------------------------------------------

GOOD = WEIRD.filter(lambda v: not CONTROL.search(v))


@settings(max_examples=20, deadline=None)
@given(GOOD, GOOD.filter(lambda v: not v.endswith("\\")), GOOD, GOOD)
def test_weird_but_good_values_pass_systemd_analyze_and_read_back(
    place: Place, path: str, description: str, env_value: str, flag_value: str
) -> None:
    model_path = "/models/" + path.replace("..", "_")
    patch = {
        ("model", "path"): model_path,
        ("unit", "description"): description,
        ("unit", "environment"): {"WEIRD": env_value},
        ("sglang", "flags"): {**BASE["sglang"]["flags"], "chat-template": flag_value},
    }
    write_host(place, "weird", patch)
    run = run_cli(place, "render", "weird", "--context=200k", analyze=True)
    flags = accepted_flags(run)
    assert (flags["model-path"], flags["chat-template"]) == (model_path, flag_value)
    assert unit_value(run.stdout, "Description") == description.strip()
    env = unit_environment(run.stdout)
    assert {k: v for k, v in env.items() if k not in CACHE_ENV} == {"WEIRD": env_value}
