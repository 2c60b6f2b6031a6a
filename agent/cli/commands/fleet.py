"""deployctl fleet apply|status GROUP: a rollout across an inventory group, run on Ansible."""

from __future__ import annotations

import argparse
import re
from typing import Any

from agent.cli.completion import group_names
from agent.cli.options import add_set_arg, add_yes_arg, parse_fraction, parse_request_count, typed
from agent.errors import UsageError
from agent.orchestrate.asked import ArgError, parse_context
from agent.output import Output

# A host count from 1, or a percentage from 1% to 100%: Ansible would run "0" or "0%" as batches of
# one and "150%" as all at once, neither of which the operator asked for.
BATCH = re.compile(r"[1-9][0-9]{0,5}|(?:100|[1-9][0-9]?)%")


def context(text: str) -> int:
    """--context for argparse's type=, with the one-line message of the other commands."""
    try:
        return parse_context(text, "--context")
    except ArgError as exc:
        raise UsageError(str(exc)) from None


def canary(text: str) -> int:
    """--canary: at least one host, or a bad change reaches a whole batch before anything halts it."""
    if not re.fullmatch(r"-?[0-9]+", text.strip()):
        raise UsageError(f"--canary {text!r} is not a host count (try 1 or 2)")
    if int(text) < 1:
        raise UsageError(
            f"--canary {text!r} must be at least 1: the canary is what halts a bad rollout early"
        )
    return int(text)


def batch(text: str) -> str:
    if not BATCH.fullmatch(text.strip()):
        raise UsageError(
            f"--batch {text!r} is not a host count from 1 (4) or a percentage from 1% to 100% (25%)"
        )
    return text.strip()


def max_fail(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) > 100:
        raise UsageError(f"--max-fail {text!r} is not a percentage from 0 to 100")
    return int(text)


def _change_args(a: argparse.ArgumentParser) -> None:
    """The options fleet apply shares with apply: the fraction, the request cap, --set and --dry-run."""
    a.add_argument(
        "--mem-fraction-static",
        type=typed(parse_fraction, "--mem-fraction-static"),
        metavar="F",
        help="plan every host at this fraction instead of choosing one (strictly between 0 and 1)",
    )
    a.add_argument(
        "--max-running-requests",
        type=typed(parse_request_count, "--max-running-requests"),
        metavar="N",
        help="keep this many concurrent requests instead of the planner's choice",
    )
    add_set_arg(a)
    a.add_argument(
        "--dry-run",
        action="store_true",
        help="plan and render on every host (Ansible's check mode): which units would change; no change",
    )


def _apply_parser(sub: Any) -> None:
    said = "canary first, then batches; halts when a host fails its gate"
    a = sub.add_parser("apply", help=said, description=f"Roll a change across an inventory group: {said}.")
    group = a.add_argument("group", help="an inventory group (groups = [...] in units/<host>.toml), or all")
    group.completer = group_names  # type: ignore[attr-defined]
    a.add_argument("--context", required=True, type=context, help="target context: 200k, 1m, 128Ki")
    a.add_argument("--canary", type=canary, default=1, help="hosts in the canary batch (default 1)")
    a.add_argument(
        "--batch", type=batch, default="25%", help="later batches: a host count or a percentage (25%%)"
    )
    a.add_argument(
        "--max-fail",
        type=max_fail,
        default=0,
        help="percent of a batch that may fail; it must be EXCEEDED to halt (Ansible's rule); default 0",
    )
    _change_args(a)
    add_yes_arg(a)
    a.add_argument("--json", action="store_true", help="events and the report as JSON lines")
    a.epilog = (
        "example: deployctl fleet apply gpu --context 200k --canary 1 --batch 25%\n"
        "example: deployctl fleet apply gpu --context 400k --set kv-cache-dtype=fp8_e4m3\n"
        "example: deployctl fleet apply gpu --context 200k --dry-run   (which units would change; no change)"
    )
    a.set_defaults(fleet_run="apply")


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="fleet_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    _apply_parser(sub)
    said = "each host's measured pool and drift from what the plan renders"
    s = sub.add_parser("status", help=said, description=f"A group's hosts: {said}.")
    s.add_argument("group", help="an inventory group, or all").completer = group_names  # type: ignore[attr-defined]
    s.add_argument(
        "--context",
        type=context,
        help="drift against the plan for this context (default: the one each host was last deployed to)",
    )
    s.add_argument("--json", action="store_true", help="print the hosts as one JSON object")
    s.epilog = "example: deployctl fleet status gpu --context 200k"
    s.set_defaults(fleet_run="status")
    p.epilog = "example: deployctl fleet apply gpu --context 200k\nexample: deployctl fleet status gpu"


def run(args: argparse.Namespace, out: Output) -> int:
    from agent.fleet import front  # Ansible and SSH load only when a command runs

    out.json = args.json
    return front.apply(args, out) if args.fleet_run == "apply" else front.status(args, out)
