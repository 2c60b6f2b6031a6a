"""deployctl status HOST: the service, and the running or last transaction (re-attach after a drop)."""

from __future__ import annotations

import argparse

from agent.cli.options import add_connection_args, add_host_arg, connection_of
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    add_host_arg(p)
    p.add_argument("--follow", action="store_true", help="follow a running transaction until it ends")
    add_connection_args(p)
    p.epilog = "example: deployctl status ct200 --follow"


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json = args.json
    return deploy.status(connection_of(args), out, follow_running=args.follow)
