"""deployctl backups HOST: the unit's backups, newest first, with their flag differences."""

from __future__ import annotations

import argparse

from agent.cli.options import add_connection_args, add_host_arg, connection_of
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    add_host_arg(p)
    add_connection_args(p)
    p.epilog = "example: deployctl backups ct200"


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json = args.json
    return deploy.backups(connection_of(args), out)
