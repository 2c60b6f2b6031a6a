"""deployctl backups HOST: the unit's backups, newest first, with their flag differences."""

from __future__ import annotations

import argparse

from agent.cli.commands.apply import add_connection_args
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="host name: units/<host>.toml")
    add_connection_args(p)


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json = args.json
    return deploy.backups(args, out)
