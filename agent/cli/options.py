"""Command-line values and shared option groups: bad values never get past argparse; errors name the flag.

The typed values built here (Connection, Change: orchestrate/asked.py) are what the layers below take: no
argparse.Namespace travels further than a command's run().
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from agent.errors import UsageError
from agent.orchestrate.asked import NO_TERMINAL, ArgError, Change, Connection, parse_context
from agent.sglang import flagrules
from agent.sglang.flags import FlagInput

MAX_REQUESTS = 1_000_000  # far above any GPU's batch; a bigger number is a typo, not a plan


def parse_fraction(text: str, flag: str = "--mem-fraction-static") -> float:
    """A number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise ArgError(f"{flag} {text!r} is not a number") from None
    if not 0.0 < value < 1.0:  # also refuses nan and inf
        raise ArgError(f"{flag} {text!r} must be strictly between 0 and 1")
    return value


def parse_positive_int(text: str, flag: str) -> int:
    """A positive integer written in decimal digits."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) <= 0:
        raise ArgError(f"{flag} {text!r} must be a positive integer")
    return int(text)


def parse_request_count(text: str, flag: str = "--max-running-requests") -> int:
    """A positive number of requests, at most MAX_REQUESTS."""
    value = parse_positive_int(text, flag)
    if value > MAX_REQUESTS:
        raise ArgError(f"{flag} {text!r} is more than {MAX_REQUESTS:,} requests")
    return value


def typed(parse: Callable[[str, str], Any], flag: str) -> Callable[[str], Any]:
    """Wrap a value parser for argparse's type=, keeping our one-line message."""

    def convert(text: str) -> Any:
        try:
            return parse(text, flag)
        except ArgError as exc:
            raise UsageError(str(exc)) from None

    convert.__name__ = flag.lstrip("-")
    return convert


# Flags that have their own option: `--set` goes through the same check, and the two must not both be given.
OPTION_FLAGS: dict[str, tuple[str, Callable[[str, str], FlagInput]]] = {
    "context-length": ("context", parse_context),
    "mem-fraction-static": ("mem_fraction_static", parse_fraction),
    "max-running-requests": ("max_running_requests", parse_request_count),
}


def parse_set(text: str) -> tuple[str, FlagInput]:
    """`FLAG=VALUE` (leading dashes optional) -> (flag, value); `true`/`false` give a bare flag or none."""
    from agent.render import FLAG_NAME, check_text

    name, eq, value = text.partition("=")
    name = name.strip().lstrip("-")
    check_text(f"--set {name}", name)
    if not eq or not FLAG_NAME.fullmatch(name):
        raise UsageError(
            f"--set {text!r} is not FLAG=VALUE with a flag like mem-fraction-static",
            hint="e.g. --set mem-fraction-static=0.94 or --set enable-metrics=true",
        )
    check_text(f"--set {name}", value)
    name = flagrules.canonical(name, flagrules.TABLE_VERSION)  # --tensor-parallel-size is --tp-size
    said = flagrules.set_elsewhere(name) or flagrules.value_problem(name, value)
    if said:
        raise UsageError(f"--set {name}: {said}")
    if name in OPTION_FLAGS:
        try:
            return name, OPTION_FLAGS[name][1](value, f"--set {name}")
        except ArgError as exc:
            raise UsageError(str(exc)) from None
    return name, {"true": True, "false": False}.get(value, value)


def add_set_arg(p: argparse.ArgumentParser) -> None:
    """--set FLAG=VALUE, repeatable; shared by the commands that render a unit."""
    p.add_argument(
        "--set",
        dest="set_flags",
        action="append",
        default=[],
        type=parse_set,
        metavar="FLAG=VALUE",
        help="set an SGLang flag over the baseline, checked against SGLang's own table: "
        "kv-cache-dtype=fp8_e4m3 (true/false for a bare flag; repeatable)",
    )


def connection_of(args: argparse.Namespace) -> Connection:
    """Which host a command names, and how to reach it."""
    return Connection(
        args.host,
        args.units,
        getattr(args, "local", False),
        getattr(args, "accept_new_host_key", False),
    )


def change_of(args: argparse.Namespace) -> Change:
    """What a command's options ask an apply (or a plan) for."""
    flags = dict(getattr(args, "set_flags", None) or ())
    if "context-length" in flags:
        raise UsageError("--set context-length: the target context is --context")
    return Change(
        args.context,
        _one_way(flags, "mem-fraction-static", args.mem_fraction_static),
        _one_way(flags, "max-running-requests", args.max_running_requests),
        getattr(args, "force", False),
        getattr(args, "dry_run", False),
        getattr(args, "yes", False),
        tuple(flags.items()),
        getattr(args, "allow_longer_context", False),
        getattr(args, "shrink_context", False),
        getattr(args, "start", False),
        getattr(args, "ignore_host_memory", False),
    )


def _one_way(flags: dict[str, FlagInput], name: str, option: Any) -> Any:
    """A flag with its own option, taken out of the --set flags; given both ways, it is refused."""
    if name in flags and option is not None:
        raise UsageError(f"--set {name} and --{name} both given; use one")
    return flags.pop(name) if name in flags else option


def add_host_arg(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    from agent.cli.completion import host_names

    action = p.add_argument("host", nargs=None if required else "?", help="host name: units/<host>.toml")
    action.completer = host_names  # type: ignore[attr-defined]  # argcomplete reads it (cli/completion.py)


def add_target_args(
    p: argparse.ArgumentParser, *, context_required: bool, host_required: bool = True
) -> None:
    """The flags shared by plan, render and apply."""
    add_host_arg(p, required=host_required)
    p.add_argument(
        "--context",
        required=context_required,
        type=typed(parse_context, "--context"),
        help="target context in tokens: 200000, 200k or 1m (x1000, x1000000), 128Ki (x1024)",
    )
    p.add_argument(
        "--shrink-context",
        action="store_true",
        help="allow a --context below the one the unit serves now (clients' longer prompts are then refused)",
    )
    p.add_argument(
        "--mem-fraction-static",
        type=typed(parse_fraction, "--mem-fraction-static"),
        metavar="F",
        help="plan at this fraction instead of choosing one (strictly between 0 and 1)",
    )
    p.add_argument(
        "--max-running-requests",
        type=typed(parse_request_count, "--max-running-requests"),
        metavar="N",
        help="keep this many concurrent requests instead of the planner's choice",
    )


def refuse_unconfirmed(yes: bool, stdin_isatty: bool) -> None:
    """Without a terminal to ask on, --yes is required: refused before any connection is made, so nothing
    (not even a recovery of an earlier change) runs on the host."""
    if not yes and not stdin_isatty:
        raise UsageError(NO_TERMINAL, hint="add --yes (cron, CI), or run it on a terminal")


def add_yes_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--yes", "-y", action="store_true", help="do not ask for confirmation (required without a tty)"
    )


def add_connection_args(p: argparse.ArgumentParser, *, quiet: bool = True) -> None:
    """How to reach the host, and how to print: shared by apply, rollback, backups, status and facts
    (`quiet=False`: a command that always prints its answer has no --quiet)."""
    p.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust an unknown SSH host key once and record it (a changed key is always refused)",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="run the agent on this machine, not over SSH (deployctl on the GPU host itself, e.g. cron)",
    )
    p.add_argument("--json", action="store_true", help="print events and results as JSON lines")
    if quiet:
        p.add_argument("--quiet", action="store_true", help="print nothing when nothing changed (cron)")
