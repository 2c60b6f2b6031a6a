"""deployctl apply HOST --context 200k: plan, render, apply on the host with automatic rollback, report."""

from __future__ import annotations

import argparse

from agent.cli.main import add_target_args
from agent.output import Output


def add_connection_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--quiet", action="store_true", help="print nothing when nothing changed (cron)")


def configure(p: argparse.ArgumentParser) -> None:
    add_target_args(p, context_required=True)
    p.add_argument(
        "--yes", "-y", action="store_true", help="do not ask for confirmation (required without a tty)"
    )
    p.add_argument("--force", action="store_true", help="apply even when the plan says the target cannot fit")
    p.add_argument("--dry-run", action="store_true", help="show the plan and the diff, change nothing")
    add_connection_args(p)


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json, out.quiet = args.json, args.quiet
    return deploy.apply(args, out)
