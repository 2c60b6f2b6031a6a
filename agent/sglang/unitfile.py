"""A hand-written SGLang unit read as systemd reads it: what the template models, and the rest verbatim.

Stdlib only: the host agent reads the unit (secret values never leave the host), the laptop turns the result
into an inventory. Pure: text in, data out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.sglang.flags import FlagsError, split_words, unit_lines
from agent.sglang.redact import SECRET_ENV, SECRET_FLAG  # the one rule for secret-looking names

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A `$NAME` or `${NAME}` that systemd expands when it runs ExecStart=; `$$` is a literal dollar.
_VARIABLE = re.compile(r"\$(?:\$|\{|[A-Za-z_])")
# What the template writes itself in an adopted unit; every other directive is kept as written.
MODELED = {("Unit", "Description"), ("Service", "User"), ("Service", "Environment"), ("Service", "ExecStart")}


class AdoptError(ValueError):
    """A unit deployctl cannot take over as it is; the text says why, in one line."""


@dataclass(frozen=True)
class Directive:
    section: str
    key: str
    value: str

    @property
    def line(self) -> str:
        return f"{self.key}={self.value}"


@dataclass
class HandUnit:
    """The modeled parts of a hand-written unit file, and its other directives in their order."""

    description: str | None = None
    user: str | None = None
    environment: dict[str, str] = field(default_factory=dict)  # public values, in order
    secret_environment: list[str] = field(default_factory=list)  # names only: values stay on the host
    exec_start: list[str] = field(default_factory=list)  # the raw ExecStart= values, as written
    other: list[Directive] = field(default_factory=list)


def is_secret_env(name: str) -> bool:
    return bool(SECRET_ENV.search(name))


def split_environment(value: str) -> list[tuple[str, str]]:
    """An Environment= value -> (name, value) pairs, unquoted as systemd does (no $ expansion there)."""
    pairs = []
    for word in split_words(value, dollars=False):
        name, eq, val = word.partition("=")
        if not eq or not ENV_NAME.fullmatch(name):
            raise AdoptError(f"Environment=: {word!r} is not NAME=VALUE")
        pairs.append((name, val))
    return pairs


def read_unit(text: str) -> HandUnit:
    """Read a unit's [Unit]/[Service]/[Install] directives (continuations joined, comments dropped)."""
    unit = HandUnit()
    try:
        lines = list(unit_lines(text))
    except FlagsError as exc:
        raise AdoptError(str(exc)) from None
    for section, key, value in lines:
        if (section, key) not in MODELED:
            unit.other.append(Directive(section, key, value))
        elif key == "Description":
            unit.description = value.replace("%%", "%")  # the inventory holds text; the renderer escapes it
        elif key == "User":
            unit.user = value.replace("%%", "%") or None
        elif key == "ExecStart":
            unit.exec_start = [*unit.exec_start, value] if value else []  # empty: resets the list
        else:
            _read_environment(unit, value)
    return unit


def _read_environment(unit: HandUnit, value: str) -> None:
    """One Environment= line: NAME=VALUE words, secret names kept apart; an empty one resets them all."""
    if not value:
        unit.environment.clear()
        unit.secret_environment.clear()
    for name, val in split_environment(value) if value else []:
        if is_secret_env(name):
            unit.environment.pop(name, None)
            if name not in unit.secret_environment:
                unit.secret_environment.append(name)
        else:
            unit.environment[name] = val


def runs_sglang(argv: Sequence[str]) -> bool:
    """ExecStart runs SGLang's server: `python -m sglang.launch_server` or `sglang serve`."""
    words = list(argv)
    for i, word in enumerate(words[:-1]):
        if word == "-m" and words[i + 1] == "sglang.launch_server":
            return True
        if (word == "sglang" or word.endswith("/sglang")) and words[i + 1] == "serve":
            return True
    return False


def command_words(argv: Sequence[str]) -> list[str]:
    """systemd's argv (D-Bus) -> the words the process receives: `$$` is one dollar; a `$VAR` is refused,
    because an inventory writes every word literally and could not keep the reference."""
    words = []
    for word in argv:
        for m in _VARIABLE.finditer(word):
            if m.group() != "$$":
                raise AdoptError(
                    f"ExecStart: {word!r} refers to an environment variable, which deployctl writes out "
                    "literally; put the value in the command line instead"
                )
        words.append(word.replace("$$", "$"))
    return words


def redact_secret_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(argv with the values of secret flags replaced by ***, the names of those flags): what may leave
    the host. `--api-key K` and `--api-key=K` both."""
    out, names, hide_next = [], [], False
    for word in argv:
        if hide_next and not word.startswith("--"):
            out.append("***")
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        if name and SECRET_FLAG.search(name):
            names.append(name)
            out.append(f"--{name}=***" if eq else word)
            hide_next = not eq
            continue
        out.append(word)
    return out, names
