"""deployctl apply HOST --context 200k: plan, render, apply on the host with automatic rollback, report."""

from __future__ import annotations

import argparse

from agent.cli.options import Change, Connection, add_connection_args, add_target_args, add_yes_arg
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    add_target_args(p, context_required=True)
    add_yes_arg(p)
    p.add_argument("--force", action="store_true", help="apply even when the plan says the target cannot fit")
    p.add_argument("--dry-run", action="store_true", help="show the plan and the diff, change nothing")
    add_connection_args(p)
    p.epilog = (
        "example: deployctl apply ct200 --context 200k --dry-run   (the plan and the diff; no change)\n"
        "example: deployctl apply ct200 --context 200k --yes"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json, out.quiet = args.json, args.quiet
    return deploy.apply(Connection.of(args), Change.of(args), out)
