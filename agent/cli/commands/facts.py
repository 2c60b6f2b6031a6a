"""`deployctl facts HOST [--json]`: what the host knows for planning, in the deployctl-facts/1 format."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agent.errors import UsageError
from agent.output import Output


def configure(p: argparse.ArgumentParser) -> None:
    from agent.cli.options import add_connection_args, add_host_arg

    add_host_arg(p)
    add_connection_args(p, quiet=False)  # --json prints the facts file (deployctl-facts/1)
    p.epilog = (
        "example: deployctl facts ct200 --json > ct200.json\n"
        "The JSON plans offline: deployctl plan --facts ct200.json --context 200k\n"
        "(examples/ct200.json is one: deployctl plan --facts examples/ct200.json --context 200k)"
    )


def host_facts(args: argparse.Namespace) -> dict[str, Any]:
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
        if not (doc.get("sglang") or {}).get("version"):  # no SGLang in the unit's Python to ask
            doc["sglang"] = {"version": s.host.sglang.version, "source": "inventory"}
        if doc.get("draft") is None:  # no draft config.json on the host: the inventory's figures
            from agent.plan.from_inventory import inventory_draft

            tp = int(str((doc.get("flags") or {}).get("tp-size") or s.host.gpus.count))
            doc["draft"] = inventory_draft(s.host, tp)
        if not doc.get("gpus"):  # no nvidia-smi answer: the inventory's cards, marked as such
            card = {"name": s.host.gpus.name, "memory_total_mib": round(s.host.gpus.memory_gib * 1024, 1),
                    "source": "inventory"}  # fmt: skip
            doc["gpus"] = [card] * s.host.gpus.count
        else:  # the facts of this service: its own GPUs, so that `plan --facts` plans on them
            from agent.plan.facts import service_gpus

            doc["gpus"] = service_gpus(doc["gpus"], s.host)
        return doc


def run(args: argparse.Namespace, out: Output) -> int:
    doc = host_facts(args)
    if args.json:
        out.print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    model = doc["model"]
    arch = (model["config"].get("architectures") or ["?"])[0]
    gpus = doc.get("gpus") or []
    weights = model.get("weights_bytes")
    lines = [
        f"facts for {args.host} ({doc['format']})",
        f"  gpus     {len(gpus)} x {gpus[0]['name'] if gpus else '?'}"
        + (f", {gpus[0]['memory_total_mib']:.0f} MiB" if gpus else ""),
        f"  sglang   {doc['sglang'].get('version')}",
        f"  model    {model.get('path')}: {arch}, weights "
        + (f"{weights / 2**30:.2f} GiB" if weights is not None else "unknown"),
    ]
    if doc.get("draft"):
        lines.append(f"  draft    {doc['draft'].get('path')}")
    lines.append(
        f"  flags    {len(doc.get('flags') or {})}, last start: {'yes' if doc.get('last_start') else 'none'}"
    )
    out.print("\n".join(lines))
    return 0
