"""deployctl apply HOST --context 200k: plan, render, apply on the host with automatic rollback, report."""

from __future__ import annotations

import argparse

from agent.cli.options import (
    add_connection_args,
    add_set_arg,
    add_target_args,
    add_yes_arg,
    change_of,
    connection_of,
    refuse_unconfirmed,
)
from agent.orchestrate.asked import warn_flag_table
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    add_target_args(p, context_required=True)
    add_set_arg(p)
    add_yes_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="apply even when the plan says the target cannot fit (risk: the start misses the target and is "
        "rolled back)",
    )
    p.add_argument(
        "--ignore-host-memory",
        action="store_true",
        help="apply even when the host's memory refuses the plan's HiCache host pools, which --force does "
        "not pass (risk: SGLang refuses the pool at start and the change is rolled back, or the host's "
        "services pin more than it has)",
    )
    p.add_argument(
        "--allow-longer-context",
        action="store_true",
        help="let SGLang run a context above the model's own (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; "
        "risk: the model runs past its trained length, unscaled; a YaRN --set json-model-override-args=... "
        "scales it instead)",
    )
    p.add_argument("--dry-run", action="store_true", help="show the plan and the diff, change nothing")
    p.add_argument(
        "--start",
        action="store_true",
        help="start the service when its unit is unchanged but someone stopped it (without it, an "
        "unchanged stopped service is left stopped and the output says so)",
    )
    add_connection_args(p)
    p.epilog = (
        "example: deployctl apply ct200 --context 200k --dry-run   (the plan and the diff; no change)\n"
        "example: deployctl apply ct200 --context 200k --yes\n"
        "example: deployctl apply ct200 --context 400k --set kv-cache-dtype=fp8_e4m3 --dry-run"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from agent import deploy  # SSH and the planner load only when a command runs

    out.json, out.quiet = args.json, args.quiet
    change = change_of(args)
    if not change.dry_run:
        refuse_unconfirmed(change.yes, out.stdin_isatty)
    from agent.inventory import load_service, units_dir
    from agent.plan.effective import effective_of

    host = load_service(args.host, units_dir(args.units))  # loaded once, passed down
    effective_of(host, change.flags)  # SGLang's own table refuses a bad --set before any connection
    if change.flags:
        warn_flag_table(out.stderr, host.sglang.version, dict(change.flags))
    return deploy.apply(connection_of(args), change, out, host)
