"""deployctl fleet apply|status GROUP: a rollout across an inventory group, run on Ansible."""

from __future__ import annotations

import argparse

from agent.cli.options import ArgError, parse_context
from agent.errors import UsageError
from agent.output import Output


def context(text: str) -> int:
    """--context for argparse's type=, with the one-line message of the other commands."""
    try:
        return parse_context(text, "--context")
    except ArgError as exc:
        raise UsageError(str(exc)) from None


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="fleet_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    a = sub.add_parser("apply", help="canary first, then batches; halts when a host fails its gate")
    a.add_argument("group", help="an inventory group (groups = [...] in units/<host>.toml), or all")
    a.add_argument("--context", required=True, type=context)
    a.add_argument("--canary", type=int, default=1, help="hosts in the canary batch (default 1)")
    a.add_argument("--batch", default="25%", help="later batches: a host count or a percentage (25%%)")
    a.add_argument(
        "--max-fail",
        type=int,
        default=0,
        help="percent of a batch that may fail; it must be EXCEEDED to halt (Ansible's rule); default 0",
    )
    a.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    a.add_argument("--json", action="store_true", help="events and the report as JSON lines")
    a.set_defaults(fleet_run="apply")
    s = sub.add_parser("status", help="each host's measured pool and drift from what the plan renders")
    s.add_argument("group")
    s.add_argument(
        "--context",
        type=context,
        help="drift against the plan for this context (default: the one each host was last deployed to)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(fleet_run="status")


def run(args: argparse.Namespace, out: Output) -> int:
    from agent.fleet import front  # Ansible and SSH load only when a command runs

    out.json = args.json
    return front.apply(args, out) if args.fleet_run == "apply" else front.status(args, out)
