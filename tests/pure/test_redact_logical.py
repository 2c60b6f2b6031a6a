"""Redaction on logical lines: systemd joins a line ending in a backslash with the next one (comment lines
in between are skipped) and accepts spaces around the `=` after a directive's name, so a secret may sit
on a later physical line, or after `Environment =`. Whatever the layout, no secret value is printed, in a
unit's text or in a diff of two units, and every other line keeps its place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.render import redact, unit_diff

# Secret values are drawn from letters no other part of these units uses: none may be left anywhere.
SECRET_CHARS = "αβγδεζηθλμξπστφψω"
LEAK = re.compile(f"[{SECRET_CHARS}]")
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- the holes, one case each ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('Environment = "API_TOKEN=secret"', 'Environment = "API_TOKEN=***"'),
        ("Environment =API_KEY=abc OTHER=1", "Environment =API_KEY=*** OTHER=1"),
        ("Environment\t=\tHF_TOKEN=abc", "Environment\t=\tHF_TOKEN=***"),
        (
            'Environment="A=1" \\\n    "API_TOKEN=secret"\nUser=x',
            'Environment="A=1" \\\n    "API_TOKEN=***"\nUser=x',
        ),
        (
            'Environment="A=1" \\\n# a comment, skipped by systemd\n; and another\n  HF_TOKEN=secret B=2',
            'Environment="A=1" \\\n# a comment, skipped by systemd\n; and another\n  HF_TOKEN=*** B=2',
        ),
        (  # a quoted value cut by a continuation: both halves go
            'Environment="API_TOKEN=sec \\\nret" B=2',
            'Environment="API_TOKEN=*** \\\n***" B=2',
        ),
        (  # the name on one line, its value on the next
            "Environment=DB_PASSWORD=\\\n  hunter2",
            "Environment=DB_PASSWORD=\\\n  ***",
        ),
        (  # inline credential data is a secret whatever its name
            "SetCredential=token:abc def",
            "SetCredential=token:***",
        ),
    ],
)
def test_environment_layouts(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "ExecStart=/bin/python -m sglang.launch_server \\\n    --port 30000 \\\n"
            "    --api-key sk-live \\\n    --tp-size 8",
            "ExecStart=/bin/python -m sglang.launch_server \\\n    --port 30000 \\\n"
            "    --api-key *** \\\n    --tp-size 8",
        ),
        (
            "ExecStart=/bin/x --api-key \\\n    sk-live --tp 8",
            "ExecStart=/bin/x --api-key \\\n    *** --tp 8",
        ),
        (
            "ExecStart=/bin/x --api-key \\\n# comment\n    sk-live --tp 8",
            "ExecStart=/bin/x --api-key \\\n# comment\n    *** --tp 8",
        ),
        ("ExecStart=/bin/x --api-key=\\\n    sk-live", "ExecStart=/bin/x --api-key=\\\n    ***"),
        ('ExecStart=/bin/x --api-key="sk live"', "ExecStart=/bin/x --api-key=***"),
        # A flag without a value right before: the secret flag is still seen.
        (
            "ExecStart=/x --trust-remote-code --api-key sk-live",
            "ExecStart=/x --trust-remote-code --api-key ***",
        ),
        # Not a secret flag, nor an environment assignment: left alone.
        ("ExecStart=/bin/x --max-total-tokens=5 --tp 8", "ExecStart=/bin/x --max-total-tokens=5 --tp 8"),
    ],
)
def test_exec_start_layouts(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_an_escaped_backslash_ends_the_line() -> None:
    """`\\\\` at the end is a backslash, no continuation (as systemd reads it): the next line is its own."""
    text = 'Description=a\\\\\nEnvironment="API_TOKEN=x"'
    assert redact(text) == 'Description=a\\\\\nEnvironment="API_TOKEN=***"'


def test_a_diff_hunk_that_starts_inside_a_continued_environment() -> None:
    names = [f"VAR{i}=v{i}" for i in range(8)]
    old = "[Service]\nEnvironment=" + " \\\n    ".join([*names, "HF_TOKEN=old-value"]) + "\nUser=a\n"
    new = old.replace("User=a", "User=b").replace("old-value", "new-value")
    shown = redact(unit_diff(old, new, "sglang.service"))
    assert "old-value" not in shown and "new-value" not in shown
    assert "-    HF_TOKEN=*** \\" not in shown  # the line ended the directive: no backslash was added
    assert "-    HF_TOKEN=***" in shown and "+    HF_TOKEN=***" in shown
    assert "    VAR7=v7 \\" in shown  # other values stay readable


@pytest.mark.parametrize(
    ("before", "tail"),
    [
        # The hunk starts inside a quoted value: up to its closing quote, it is a secret's.
        ('Environment="HF_TOKEN=aaaa \\\n', ' zzzz zzzz"  "B=1"'),
        # The hunk starts at a secret flag's value.
        ("ExecStart=/x --api-key \\\n", "    zzzz \\\n    --tp-size 8"),
    ],
)
def test_a_diff_hunk_that_starts_at_the_tail_of_a_secret(before: str, tail: str) -> None:
    pad = "".join(f"Nice={i}\n" for i in range(3 - tail.count("\n") - 1))  # the hunk starts at the tail
    old = f"[Service]\nDescription=x\nType=simple\n{before}{tail}\n{pad}User=a\n"
    diff = unit_diff(old, old.replace("User=a", "User=b"), "sglang.service")
    assert diff.split("\n")[3] == " " + tail.split("\n")[0]
    shown = redact(diff)
    assert "zzzz" not in shown and "aaaa" not in shown


# --- properties --------------------------------------------------------------------------------------------

ENV_NAMES = st.sampled_from(["API_TOKEN", "HF_TOKEN", "DB_PASSWORD", "OPENAI_API_KEY", "MY_SECRET", "PLAIN"])
PLAIN_VALUES = st.text(alphabet="abcXYZ019_./:-", min_size=1, max_size=8)
SECRETS = st.text(alphabet=SECRET_CHARS, min_size=1, max_size=12)
QUOTABLE = st.lists(
    st.one_of(SECRETS, st.sampled_from([" ", "=", "'", '\\"', "\\\\", "  "])), min_size=1, max_size=6
).map("".join)
SPACES = st.sampled_from(["", " ", "  ", "\t"])
INDENT = st.sampled_from(["", " ", "    ", "\t"])
COMMENTS = st.lists(st.sampled_from(["# note", "; note", "  # indented note", "#"]), max_size=2)
FLAGS = st.sampled_from(["api-key", "admin-api-key", "hf-token", "api_key"])


@dataclass(frozen=True)
class Unit:
    text: str
    secret_names: tuple[str, ...]
    plain: tuple[str, ...]  # NAME=VALUE words that must stay readable


@st.composite
def env_word(draw: st.DrawFn, secret_names: tuple[str, ...]) -> tuple[str, bool]:
    """One NAME=VALUE word as Environment= takes it; True when its value must not be printed."""
    name = draw(ENV_NAMES)
    secret = name != "PLAIN" or name in secret_names
    if not secret:
        return (f"{name}={draw(PLAIN_VALUES)}", False)
    style = draw(st.sampled_from(["bare", "double", "single", "inner"]))
    if style == "bare":
        return (f"{name}={draw(SECRETS)}", True)
    value = draw(QUOTABLE)
    if style == "single":
        value = value.replace("\\", "").replace("'", "")
    if " " in value and draw(st.booleans()):  # a continuation inside the quotes
        value = value.replace(" ", " \\\n", 1)
    if style == "single":
        return (f"'{name}={value}'", True)
    if style == "inner":
        return (f'{name}="{value}"', True)
    return (f'"{name}={value}"', True)


@st.composite
def continued(draw: st.DrawFn, head: str, words: list[str]) -> str:
    """head + words, each gap either spaces or a continuation (maybe with comment lines after it)."""
    out = head
    for i, word in enumerate(words):
        if i and draw(st.booleans()):
            out += draw(SPACES) + "\\\n" + "".join(c + "\n" for c in draw(COMMENTS)) + draw(INDENT)
        elif i:
            out += " " + draw(SPACES)
        out += word
    return out


@st.composite
def units(draw: st.DrawFn) -> Unit:
    secret_names = ("PLAIN",) if draw(st.booleans()) else ()
    lines = ["[Service]"]
    plain: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        words = draw(st.lists(env_word(secret_names), min_size=1, max_size=5))
        plain += [w for w, secret in words if not secret]
        head = f"Environment{draw(SPACES)}={draw(SPACES)}"
        lines.append(draw(continued(head, [w for w, _ in words])))
        lines += draw(st.lists(st.sampled_from(["User=sglang", "# comment", "", "Restart=on-failure"])))
    args = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--tp-size", "8"]
    for _ in range(draw(st.integers(0, 3))):
        flag, secret = draw(FLAGS), draw(SECRETS)
        args += ["--trust-remote-code"] if draw(st.booleans()) else []
        if draw(st.booleans()):
            args += [f"--{flag}={secret}"]
        else:
            args += [f"--{flag}", secret if draw(st.booleans()) else f'"{secret} {secret}"']
        args += ["--context-length", "200000"]
    lines.append(draw(continued(f"ExecStart{draw(SPACES)}={draw(SPACES)}", args)))
    lines += ["TimeoutStopSec=120", "[Install]", "WantedBy=multi-user.target", ""]
    return Unit("\n".join(lines), secret_names, tuple(plain))


@PROPS
@given(units())
def test_no_secret_in_a_redacted_unit(unit: Unit) -> None:
    shown = redact(unit.text, unit.secret_names)
    assert not LEAK.search(shown), shown
    assert shown.count("\n") == unit.text.count("\n")  # the layout is kept, line for line
    for word in unit.plain:
        assert word in shown


@PROPS
@given(units(), units(), st.integers(0, 5))
def test_no_secret_in_a_redacted_diff(old: Unit, new: Unit, pad: int) -> None:
    filler = "".join(f"Filler{i}=x\n" for i in range(pad))
    shown = redact(unit_diff(filler + old.text, filler + new.text, "sglang.service"), ("PLAIN",))
    assert not LEAK.search(shown), shown
