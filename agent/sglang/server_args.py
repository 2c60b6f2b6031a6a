"""SGLang's own flag table, shipped as data, and the check of a flag set against it. Stdlib only.

agent/sglang/data/server_args-<version>.json is generated from the wheel's argparse parser
(sglang/srt/server_args.py ServerArgs.add_cli_args) by tests/oracle/flag_table.py: every option's spellings,
whether it takes a value, how SGLang reads the value (type=), its choices and nargs, the deprecated ones
(sglang/srt/arg_groups/argparse_actions.py) and the options earlier releases had that this one refuses.
A flag set is checked here before anything is rendered, so a typo never reaches ExecStart=.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from importlib import resources
from typing import Any

from agent.sglang.kvpool import parse_version

FlagWord = str | int | float | bool
Value = FlagWord | tuple[str, ...]

# Values SGLang's parser reads but its start refuses: a fraction of the card's memory is between 0 and 1.
_OPEN_RANGES = {"mem-fraction-static": (0.0, 1.0)}


@dataclass(frozen=True)
class FlagSpec:
    """One option of SGLang's parser."""

    names: tuple[str, ...]  # spellings without the leading --, the first is the one SGLang documents
    takes_value: bool
    kind: str | None  # how the value is read: int, float, str, human_int, json, other:<callable>
    choices: tuple[str, ...] | None
    nargs: str | int | None  # None: one value; "+", "*", "?" or a count as argparse takes them
    deprecated: str | None  # the spelling to use instead, for a deprecated option

    @property
    def takes_list(self) -> bool:
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1)

    def words(self, value: Value) -> tuple[FlagWord, ...]:
        """The words of a value: a list flag's text (`--set cuda-graph-bs-decode="1 2 4"`, an inventory's
        "1 2 4") is its whitespace-separated words, as the unit writes them (argparse nargs)."""
        if isinstance(value, tuple):
            return value
        if isinstance(value, str) and self.takes_list and value.split():
            return tuple(value.split())
        return (value,)


@dataclass(frozen=True)
class FlagTable:
    version: str
    by_name: Mapping[str, FlagSpec]
    removed: Mapping[str, str]  # option of an earlier release -> what replaces it

    def problem(self, name: str, value: Value) -> str | None:
        """Why SGLang would refuse `--name value`, in one line; None when its parser takes it."""
        spec = self.by_name.get(name)
        if value is False:  # left out: any name SGLang knows, or once knew, may be dropped
            return None if spec is not None or name in self.removed else self._unknown(name)
        if spec is None:
            return self._unknown(name)
        if not spec.takes_value:
            return None if value is True else f"--{name} takes no value (write true, or leave it out)"
        if value is True:
            return f"--{name} needs a value"
        words = spec.words(value)
        if len(words) > 1 and spec.nargs in (None, "?"):
            return f"--{name} takes one value, not {len(words)}"
        for word in words:
            said = _word_problem(name, spec, word)
            if said:
                return said
        return None

    def _unknown(self, name: str) -> str:
        bare = name.lstrip("-")
        if bare and bare != name:  # a unit's ExecStart= spelling ("--tp-size") where the name alone goes
            said = f"name it without its leading dashes: {bare!r}"
            return said if bare in self.by_name else f"{said}; {self._unknown(bare)}"
        if name in self.removed:
            return f"--{name} was removed before SGLang {self.version}: use {self.removed[name]}"
        close = difflib.get_close_matches(name, list(self.by_name), n=3, cutoff=0.75)
        guess = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
        return f"SGLang {self.version} has no flag --{name}{guess}"

    def deprecations(self, flags: Mapping[str, object]) -> list[str]:
        return [
            f"--{n} is deprecated in SGLang {self.version}: use {spec.deprecated}"
            for n in flags
            if (spec := self.by_name.get(n)) is not None and spec.deprecated
        ]


def _word_problem(name: str, spec: FlagSpec, word: FlagWord) -> str | None:
    if isinstance(word, bool):
        return f"--{name} takes a value, not {str(word).lower()}"
    text = _text(word)
    reader = _READERS.get(spec.kind or "str")
    try:
        value = reader(text) if reader else text
    except (ValueError, InvalidOperation):
        return f"--{name} {text!r} is not {_WHAT[spec.kind or 'str']}"
    if spec.choices is not None and str(value) not in spec.choices:
        return f"--{name} {text!r} is not one of {', '.join(spec.choices)}"
    bounds = _OPEN_RANGES.get(name)
    if bounds and isinstance(value, float) and not bounds[0] < value < bounds[1]:
        return f"--{name} {text!r} must be strictly between {bounds[0]:g} and {bounds[1]:g}"
    return None


def _text(word: FlagWord) -> str:
    """The word as the unit writes it (a float as Python prints it)."""
    return repr(word) if isinstance(word, float) else str(word)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


_HUMAN = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_int(text: str) -> int:
    """sglang/srt/utils/common.py human_readable_int: 1k, 25.6k, 1Ki, 1M or an integer (case-sensitive)."""
    m = _HUMAN.fullmatch(text.strip())
    if m is None:
        return int(text)
    number, suffix = m.groups()
    if suffix in _IEC:
        if "." in number:
            raise ValueError(text)
        return int(number) * _IEC[suffix]
    return int(Decimal(number) * _SI[suffix])


_READERS: dict[str, Callable[[str], object]] = {
    "int": int, "float": _float, "human_int": human_int, "json": json.loads,
}  # fmt: skip
_WHAT = {
    "int": "an integer", "float": "a number", "human_int": "an integer (1k, 128Ki and 1M are read too)",
    "json": "JSON", "str": "text",
}  # fmt: skip


@functools.lru_cache(maxsize=4)
def table_for(version: str) -> FlagTable | None:
    """The table of this SGLang release (same major.minor.patch), or None where none is shipped."""
    try:
        release = ".".join(str(n) for n in parse_version(version)[:3])
        data = resources.files("agent.sglang").joinpath(f"data/server_args-{release}.json").read_text("utf-8")
    except (ValueError, FileNotFoundError):
        return None
    return load_table(json.loads(data))


def load_table(doc: Mapping[str, Any]) -> FlagTable:
    by_name: dict[str, FlagSpec] = {}
    for f in doc["flags"]:
        spec = FlagSpec(
            names=tuple(f["names"]),
            takes_value=f["takes"] == "value",
            kind=f["type"],
            choices=tuple(f["choices"]) if f["choices"] is not None else None,
            nargs=f["nargs"],
            deprecated=f.get("deprecated"),
        )
        by_name.update(dict.fromkeys(spec.names, spec))
    removed = {r["name"]: r["replacement"] for r in doc["removed"]}
    return FlagTable(str(doc["sglang"]), by_name, removed)


def typed(version: str, name: str, value: Value) -> Value | int | float:
    """A --set word as the flag table's type reads it (`--set tp-size=4`: 4), for JSON; a word the type
    does not read, a list, a switch and a flag the table lacks are returned as given."""
    table = table_for(version)
    spec = table.by_name.get(name) if table is not None else None
    if spec is None or not isinstance(value, str) or spec.kind not in ("int", "float", "human_int"):
        return value
    try:
        if spec.kind == "float":
            return _float(value)
        return human_int(value) if spec.kind == "human_int" else int(value)
    except ValueError:
        return value


def as_words(version: str, flags: Mapping[str, Value]) -> dict[str, Value]:
    """The flags with a list flag's text split into its words (a tuple), as the unit must carry them: one
    quoted word "1 2 4" would reach SGLang's argparse as one value it cannot read."""
    table = table_for(version)
    if table is None:
        return dict(flags)
    out: dict[str, Value] = {}
    for name, value in flags.items():
        spec = table.by_name.get(name)
        listed = spec is not None and spec.takes_list and isinstance(value, str) and len(value.split()) > 1
        out[name] = tuple(str(value).split()) if listed else value
    return out


def problems(version: str, flags: Mapping[str, Value]) -> list[tuple[str, str]]:
    """(flag, one line) for each flag SGLang `version` would refuse; [] where no table is shipped."""
    table = table_for(version)
    if table is None:
        return []
    found = ((name, table.problem(name, value)) for name, value in flags.items())
    return [(name, said) for name, said in found if said]
