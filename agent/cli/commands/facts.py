"""`deployctl facts HOST [--json]`: what the host knows for planning, in the deployctl-facts/1 format."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, cast

from agent.errors import UsageError
from agent.output import Output

if TYPE_CHECKING:
    from agent.protocol.answers import FactsDoc


def configure(p: argparse.ArgumentParser) -> None:
    from agent.cli.options import add_connection_args, add_host_arg

    add_host_arg(p)
    add_connection_args(p, quiet=False)  # --json prints the facts file (deployctl-facts/1)
    p.epilog = (
        "example: deployctl facts ct200 --json > ct200.json\n"
        "The JSON plans offline: deployctl plan --facts ct200.json --context 200k\n"
        "(examples/ct200.json is one: deployctl plan --facts examples/ct200.json --context 200k)"
    )


def host_facts(args: argparse.Namespace) -> FactsDoc:
    """The facts document the host's agent read (config.json, safetensors headers, nvidia-smi...)."""
    from agent.cli.options import connection_of
    from agent.orchestrate.session import session
    from agent.remote.client import base_request

    with session(connection_of(args)) as s:
        answer = s.client.call(base_request(s.host, "facts"))
        doc = answer.get("model_facts")
        if not isinstance(doc, dict):
            raise UsageError(
                f"{args.host}: the unit names no local model folder with a config.json",
                hint="check --model-path in the unit; a hub id is not read on the host",
            )
        from agent.plan.factsdoc import filled

        return filled(cast("FactsDoc", doc), s.host)  # a name for mypy only: not imported at run time


def run(args: argparse.Namespace, out: Output) -> int:
    from agent.cli.options import connection_of
    from agent.inventory import load_service, units_dir

    conn = connection_of(args)
    service = load_service(conn.host, units_dir(conn.units))
    if service.pd is not None:  # each prefill and decode, with its transfer facts
        from agent.group.pdinfo import facts as pd_facts

        out.json = args.json
        return pd_facts(service, conn, out)
    doc = host_facts(args)
    if args.json:
        out.print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    from agent.plan.factsdoc import facts_lines

    lines = facts_lines(args.host, doc)
    out.print("\n".join(lines))
    return 0
