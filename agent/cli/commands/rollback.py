"""deployctl rollback HOST [--to BACKUP]: restore a backup, verify it; the replaced unit is kept too."""

from __future__ import annotations

import argparse

from agent.cli.completion import backup_names
from agent.cli.options import (
    add_connection_args,
    add_host_arg,
    add_yes_arg,
    connection_of,
    refuse_unconfirmed,
)
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    add_host_arg(p)
    to = p.add_argument(
        "--to",
        metavar="BACKUP",
        help="the backup to restore, as `deployctl backups HOST` lists it "
        "(default: the newest backup that differs from the installed unit)",
    )
    to.completer = backup_names  # type: ignore[attr-defined]  # those deployctl last saw on the host
    add_yes_arg(p)
    add_connection_args(p)
    p.epilog = "example: deployctl rollback ct200 --yes"


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json, out.quiet = args.json, args.quiet
    if args.to is not None:  # a [pd] service refuses --to: said first, not a request for --yes
        from agent.group.pdrollback import refuse_to
        from agent.inventory import load_service, units_dir

        host = load_service(args.host, units_dir(args.units))
        if host.pd is not None:
            refuse_to(host, args.to)
    refuse_unconfirmed(args.yes, out.stdin_isatty)
    return deploy.rollback(connection_of(args), args.to, out, yes=args.yes)
