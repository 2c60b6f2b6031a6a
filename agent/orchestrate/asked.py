"""What a person (or Ansible) asks of deployctl, as the layers below the CLI take it: which host and how to
reach it (Connection), what an apply or a plan is asked for (Change), and a target context in tokens
(200k, 128Ki, 1m). The CLI (cli/options.py) and the fleet's plugin (fleet/plugin.py) build these from their
arguments; no argparse.Namespace travels below them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TextIO

from agent.sglang import flagrules
from agent.sglang.flags import FlagInput

NO_TERMINAL = "not on a terminal and --yes not given: refusing to restart without confirmation"
MAX_CONTEXT = 10_000_000

# The unit in any case: 1m is 1M and 128ki is 128Ki (there is no milli-token to confuse it with).
# A decimal needs a unit (0.5M, 1.5k) and must come to whole tokens.
_CONTEXT = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>ki|k|mi|m)?", re.IGNORECASE)
_UNITS = {None: 1, "k": 1000, "ki": 1024, "m": 1000**2, "mi": 1024**2}


class ArgError(ValueError):
    """A bad value; its text is the one-line message (the flag is named in it)."""


def _ungroup(text: str) -> str:
    """'170,000' -> '170000'; a malformed grouping ('17,00') is left to be refused."""
    return text.replace(",", "") if _GROUPED.fullmatch(text) else text


_GROUPED = re.compile(r"\d{1,3}(,\d{3})+(\.\d+)?[A-Za-z]*")


def parse_context(text: str, flag: str = "--context") -> int:
    """'200000', '200k'/'200K' (x1000), '128Ki'/'128ki' (x1024), '1M'/'1m', '0.5M', '1.5k' -> tokens; else
    refused (a decimal that is no whole number of tokens too). '170,000', as plans print counts, is accepted:
    correctly grouped thousands separators are dropped."""
    m = _CONTEXT.fullmatch(_ungroup(text.strip()))
    if m is None:
        raise ArgError(f"{flag} {text!r} is not a token count (try 200k, 128Ki or 131072)")
    whole, _, frac = m["num"].partition(".")
    if frac and not m["unit"]:  # 1.0 or 131072.5: a decimal needs a unit (docs/commands.md)
        raise ArgError(
            f"{flag} {text!r} is not a token count: a decimal needs a unit (try 0.5M, 1.5k or 131072)"
        )
    scale = _UNITS[m["unit"] and m["unit"].lower()]
    denominator: int = 10 ** len(frac)
    tokens, rest = divmod(int(whole + frac) * scale, denominator)  # exact: no float rounding
    if rest:
        raise ArgError(f"{flag} {text!r} is not a whole number of tokens (try 200k, 0.5M or 131072)")
    if tokens <= 0:
        raise ArgError(f"{flag} {text!r} must be a positive token count")
    if tokens > MAX_CONTEXT:
        raise ArgError(f"{flag} {text!r} is more than {MAX_CONTEXT:,} tokens")
    return tokens


@dataclass(frozen=True)
class Connection:
    """Which host, and how to reach it."""

    host: str  # the inventory's name: units/<host>.toml
    units: str | None = None  # the inventory folder (None: $DEPLOYCTL_UNITS or ./units)
    local: bool = False  # the agent runs on this machine, not over SSH
    accept_new_host_key: bool = False


@dataclass(frozen=True)
class Change:
    """What a person asked an apply (or a plan) for."""

    context: int
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    force: bool = False
    dry_run: bool = False
    yes: bool = False
    flags: tuple[tuple[str, FlagInput], ...] = ()  # --set FLAG=VALUE beyond the three above
    allow_longer_context: bool = False  # --allow-longer-context: SGLang's own override, apart from --force
    shrink_context: bool = False  # --shrink-context: a target below the context the unit serves now
    start: bool = False  # --start: an unchanged unit someone stopped is started too
    # --ignore-host-memory: a plan the host's memory refuses (HiCache host pools) applied anyway; --force
    # does not pass that refusal
    ignore_host_memory: bool = False


def warn_flag_table(stderr: TextIO, version: str, flags: dict[str, FlagInput]) -> None:
    """--set under a release whose own flag table deployctl does not ship: which table read it, one line."""
    said = flagrules.table_warning(version, flags)
    if said:
        print(f"deployctl: warning: {said}", file=stderr)
