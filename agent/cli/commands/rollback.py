"""deployctl rollback HOST [--to BACKUP]: restore a backup, verify it; the replaced unit is kept too."""

from __future__ import annotations

import argparse

from agent.cli.commands.apply import add_connection_args
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="host name: units/<host>.toml")
    p.add_argument("--to", metavar="BACKUP", help="the backup to restore (default: the newest)")
    p.add_argument(
        "--yes", "-y", action="store_true", help="do not ask for confirmation (required without a tty)"
    )
    add_connection_args(p)


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json, out.quiet = args.json, args.quiet
    return deploy.rollback(args, out)
