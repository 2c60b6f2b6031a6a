"""SGLang flags <-> a unit's ExecStart line, with systemd's quoting rules; and flag-by-flag differences."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

# A flag as read from a unit: `--name value` -> "value", a bare `--name` -> True, a flag that takes several
# words (`--cuda-graph-bs 1 2 4`) -> a tuple of at least two words.
FlagValue = str | bool | tuple[str, ...]
# What may be written: numbers come from the inventory and the planner; False means "leave the flag out".
FlagInput = str | int | float | bool | tuple[str, ...]

_SEPARATORS = " \t\n\r"  # systemd's WHITESPACE: the only characters that split words
_QUOTE_TRIGGERS = set(_SEPARATORS) | {'"', "'", "\\", "$"}
_PREFIXES = "-@+!:"  # ExecStart= prefixes: ignore failure, argv0, privileged, no-sandbox...
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "s": " ",
    "\\": "\\",
    '"': '"',
    "'": "'",
    " ": " ",
    ";": ";",
}
_HEX_LENGTH = {"x": 2, "u": 4, "U": 8}


class FlagsError(ValueError):
    """An ExecStart line or unit that cannot be read as a command and its flags."""


@dataclass(frozen=True)
class FlagChange:
    """One flag that differs between two units; None on a side means the flag is absent there."""

    name: str
    before: FlagValue | None
    after: FlagValue | None

    @property
    def kind(self) -> str:
        if self.before is None:
            return "added"
        return "removed" if self.after is None else "changed"


# --- reading ---------------------------------------------------------------------------------------------


def split_words(text: str, dollars: bool = True) -> list[str]:
    """Split an ExecStart value into words as systemd does (quotes, C escapes, then `%%` and `$$`).

    dollars=False: for Environment=, where systemd expands no variable, so `$$` stays two dollars."""
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _SEPARATORS:
            i += 1
        if i >= n:
            return words
        chars: list[str] = []
        while i < n and text[i] not in _SEPARATORS:
            c = text[i]
            if c == "\\":
                i = _unescape(text, i, chars)
            elif c in "\"'":
                i = _quoted(text, i, chars)
            else:
                chars.append(c)
                i += 1
        # systemd expands specifiers after unquoting and $VAR when it runs the command: `%%` and `$$`
        # are their escapes. Other specifiers and variables are kept as written.
        word = "".join(chars).replace("%%", "%")
        words.append(word.replace("$$", "$") if dollars else word)


def _quoted(text: str, i: int, chars: list[str]) -> int:
    quote, i = text[i], i + 1
    while i < len(text):
        c = text[i]
        if c == quote:
            return i + 1
        if c == "\\":
            i = _unescape(text, i, chars)
        else:
            chars.append(c)
            i += 1
    raise FlagsError(f"unterminated {quote} quote in {text!r}")


def _unescape(text: str, i: int, chars: list[str]) -> int:
    """Decode the C escape at text[i] (a backslash) into chars; return the index after it."""
    if i + 1 >= len(text):
        raise FlagsError(f"a backslash ends {text!r}")
    c = text[i + 1]
    if c in _SIMPLE_ESCAPES:
        chars.append(_SIMPLE_ESCAPES[c])
        return i + 2
    if c in _HEX_LENGTH:
        digits = text[i + 2 : i + 2 + _HEX_LENGTH[c]]
        if len(digits) == _HEX_LENGTH[c] and all(d in "0123456789abcdefABCDEF" for d in digits):
            chars.append(chr(int(digits, 16)))
            return i + 2 + len(digits)
    if c in "01234567":
        digits = text[i + 1 : i + 4]
        if len(digits) == 3 and all(d in "01234567" for d in digits):
            chars.append(chr(int(digits, 8)))
            return i + 4
    raise FlagsError(f"invalid escape \\{c} in {text!r}")


def parse_exec_start(text: str) -> tuple[list[str], dict[str, FlagValue]]:
    """An ExecStart value -> (the command's words before the first --flag, the flags in order)."""
    words = split_words(text)
    if words:
        words[0] = words[0].lstrip(_PREFIXES)
    if not words or not words[0]:
        raise FlagsError(f"ExecStart has no command: {text!r}")
    first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    return words[:first], _parse_flags(words[first:])


def parse_flag_words(words: Sequence[str]) -> dict[str, FlagValue]:
    """argv words from the first --flag on -> the flags in order."""
    return _parse_flags(words)


def _parse_flags(words: Sequence[str]) -> dict[str, FlagValue]:
    flags: dict[str, FlagValue] = {}
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, inline = word[2:].partition("=")
        if not word.startswith("--") or not name:
            raise FlagsError(f"expected a --flag, found {word!r}")
        i += 1
        if eq:
            flags[name] = inline
            continue
        values: list[str] = []
        while i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        flags[name] = True if not values else values[0] if len(values) == 1 else tuple(values)
    return flags


def unit_lines(unit_text: str) -> Iterator[tuple[str, str, str]]:
    """(section, key, value) for each assignment, with backslash-continued lines joined as systemd does."""
    section, pending = "", ""
    for raw in unit_text.split("\n"):  # not splitlines(): systemd breaks lines on \n only
        line = raw.strip()
        if line.startswith(("#", ";")):
            continue  # comments, also inside a continuation
        line = pending + line
        if _continues(line):
            pending = line[:-1] + " "  # systemd replaces the trailing backslash with a space
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            key, _, value = line.partition("=")
            yield section, key.strip(), value.strip()
    if pending:
        raise FlagsError("the unit ends inside a continued line")


def _continues(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def parse_unit(unit_text: str) -> tuple[list[str], dict[str, FlagValue]]:
    """The command and flags of the one ExecStart= of a unit's [Service] section."""
    values: list[str] = []
    for section, key, value in unit_lines(unit_text):
        if section == "Service" and key == "ExecStart":
            values = [] if not value else [*values, value]  # an empty assignment resets the list
    if len(values) != 1:
        raise FlagsError(f"expected one ExecStart= in [Service], found {len(values)}")
    return parse_exec_start(values[0])


def parse_unit_flags(unit_text: str) -> dict[str, FlagValue]:
    """The SGLang flags of a unit's ExecStart=."""
    return parse_unit(unit_text)[1]


# --- writing ---------------------------------------------------------------------------------------------


def quote_word(word: str) -> str:
    """One argument as systemd must read it back: `%` and `$` doubled, quoted when needed."""
    text = word.replace("%", "%%").replace("$", "$$")
    if word and word != ";" and not (_QUOTE_TRIGGERS & set(word)) and not any(c.isspace() for c in word):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def normalize(value: FlagInput) -> FlagValue | None:
    """The value as it will read back from the unit; None for False (the flag is left out)."""
    if isinstance(value, bool):
        return True if value else None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FlagsError(f"{value!r} is not a finite number")
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple):
        return value[0] if len(value) == 1 else value
    return value


def flag_words(name: str, value: FlagInput) -> list[str]:
    """The argv words of one flag; empty when the flag is left out."""
    norm = normalize(value)
    if norm is None or isinstance(norm, bool):
        return [f"--{name}"] if norm else []
    if isinstance(norm, tuple):
        if not norm or any(w.startswith("--") for w in norm):
            raise FlagsError(f"--{name}: a list of words must be non-empty and no word may start with --")
        return [f"--{name}", *norm]
    # A value that starts with "--" would read back as a flag: keep it inside the same word.
    return [f"--{name}={norm}"] if norm.startswith("--") else [f"--{name}", norm]


def exec_start_lines(executable: Sequence[str], flags: Mapping[str, FlagInput]) -> list[str]:
    """The command on the first line, then one flag (with its value) per line, each quoted for systemd."""
    if not executable or not executable[0] or executable[0][0] in _PREFIXES:
        raise FlagsError(f"the executable {list(executable)!r} must start with a path")
    lines = [" ".join(quote_word(w) for w in executable)]
    for name, value in flags.items():
        words = flag_words(name, value)
        if words:
            lines.append(" ".join(quote_word(w) for w in words))
    return lines


def format_exec_start(executable: Sequence[str], flags: Mapping[str, FlagInput]) -> str:
    """The ExecStart value on one line: parse_exec_start() reads it back to (executable, flags)."""
    return " ".join(exec_start_lines(executable, flags))


# --- comparing -------------------------------------------------------------------------------------------


def diff_flags(before: Mapping[str, FlagInput], after: Mapping[str, FlagInput]) -> list[FlagChange]:
    """Removed and changed flags in the order of `before`, then added ones in the order of `after`."""
    old = {k: v for k, v in ((k, normalize(v)) for k, v in before.items()) if v is not None}
    new = {k: v for k, v in ((k, normalize(v)) for k, v in after.items()) if v is not None}
    changes = [FlagChange(k, v, new.get(k)) for k, v in old.items() if new.get(k) != v]
    changes += [FlagChange(k, None, v) for k, v in new.items() if k not in old]
    return changes


def value_text(value: FlagValue | None) -> str:
    """A flag value for a table: absent '-', a bare flag 'true', several words joined by spaces."""
    if value is None:
        return "-"
    if value is True:
        return "true"
    if isinstance(value, tuple):
        return " ".join(value)
    return str(value)


def flag_table(changes: Sequence[FlagChange]) -> str:
    """The before/after table of changed flags, columns aligned."""
    rows = [("flag", "before", "after")]
    rows += [(f"--{c.name}", value_text(c.before), value_text(c.after)) for c in changes]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)
