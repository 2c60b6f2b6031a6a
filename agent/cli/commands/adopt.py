"""`deployctl adopt HOST --ssh TARGET [--node TARGET...]`: write units/HOST.toml from the SGLang unit a host
already runs (a multi-node service: from the unit of each node)."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from agent.errors import UsageError
from agent.inventory import Gpus, HostConfig, Model, Ssh, Unit, check_host_name, units_dir
from agent.output import Output
from agent.protocol.answers import GpuRow, InspectAnswer, as_facts
from agent.protocol.common import UNIT_NAME

if TYPE_CHECKING:
    from agent.adopt import Inspected


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="the name for units/<host>.toml")
    p.add_argument(
        "--ssh", required=True, metavar="TARGET", help="an ~/.ssh/config alias or user@host[:port]"
    )
    p.add_argument(
        "--node",
        action="append",
        default=[],
        dest="nodes",
        metavar="TARGET",
        help="a multi-node service (--nnodes): the SSH target of node rank 1, then 2...; --ssh is rank 0",
    )
    p.add_argument("--unit", help="the unit to adopt when several run SGLang")
    p.add_argument("--sudo", action="store_true", help="run the agent through sudo on the host")
    p.add_argument("--force", action="store_true", help="overwrite an existing units/<host>.toml")
    p.add_argument("--accept-new-host-key", action="store_true", help="trust an unknown SSH host key once")
    p.add_argument("--json", action="store_true", help="print what was adopted as one JSON object")
    p.epilog = (
        "example: deployctl adopt ct200 --ssh ct200 --sudo   (reads only; changes nothing on the host)\n"
        "         deployctl adopt k2 --ssh k2-a --node k2-b --node k2-c   (one service over three hosts)"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    check_host_name(args.host)
    if args.unit is not None and not UNIT_NAME.fullmatch(args.unit):
        raise UsageError(f"--unit {args.unit!r} is not a unit name like sglang.service")
    path = units_dir(args.units) / f"{args.host}.toml"
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists", hint="--force replaces it")
    from agent.adopt import check_node_targets, choose_unit, inventory_text  # tomlkit: only here

    check_node_targets(args.ssh, args.nodes)
    unit, gpus = _inspect(args, args.ssh, lambda answer: choose_unit(answer, args.unit), facts=True)
    if args.nodes:
        text = _adopt_nodes(args, unit, gpus)
    else:
        text = inventory_text(args.host, args.ssh, args.sudo, unit, gpus)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if args.json:
        out.print(json.dumps(_adopted(args, unit, path), sort_keys=True))
        return 0
    nodes = f" (node rank 0) and {', '.join(args.nodes)}" if args.nodes else ""
    out.print(f"adopted {unit.name} ({unit.fragment_path}) from {args.ssh}{nodes} into {path}")
    _warn(out, unit)
    out.print(
        f"next: deployctl apply {args.host} --context 200k --dry-run   (the plan and the diff; no change)"
    )
    return 0


def _adopted(args: argparse.Namespace, unit: Inspected, path: Path) -> dict[str, object]:
    """adopt --json: what was read and where the inventory went, and the warnings as a list."""
    from agent.adopt import cache_notes, stop_notes
    from agent.inventory import Drain
    from agent.protocol.requests import stop_timeout_s

    drain = Drain()
    warnings = [
        *stop_notes(unit, stop_timeout_s(drain.timeout_s, drain.stop_allowance_s)),
        *cache_notes(unit),
    ]
    return {
        "host": args.host, "unit": unit.name, "fragment_path": unit.fragment_path, "ssh": args.ssh,
        "nodes": list(args.nodes), "inventory": str(path), "warnings": warnings,
        "secrets_kept_on_host": list(unit.secret_environment),
    }  # fmt: skip


def _adopt_nodes(args: argparse.Namespace, unit: Inspected, gpus: list[GpuRow]) -> str:
    """The inventory of a multi-node service: the unit of node rank 0's name, read on every other node."""
    from agent.adopt import Node, nodes_inventory_text, pick_node_unit

    nodes = [Node(args.ssh, unit)]
    for target in args.nodes:
        other, _ = _inspect(args, target, functools.partial(pick_node_unit, name=unit.name, target=target))
        nodes.append(Node(target, other))
    return nodes_inventory_text(args.host, args.sudo, nodes, gpus)


def _inspect(
    args: argparse.Namespace, target: str, choose: Callable[[InspectAnswer], Inspected], facts: bool = False
) -> tuple[Inspected, list[GpuRow]]:
    """The unit `choose` picks on `target` and, with `facts`, the host's GPUs, asked over SSH (reads only)."""
    from agent.remote.client import AgentClient, base_request, open_transport

    # Only the connection and the agent's folders matter until the unit is known.
    probe = HostConfig(
        name=args.host,
        ssh=Ssh(target=target, sudo=args.sudo),
        gpus=Gpus(count=1, memory_gib=1.0),
        model=Model(path="/"),
        unit=Unit(name=args.unit or "sglang.service"),
    )
    transport = open_transport(probe, args.accept_new_host_key)
    try:
        client = AgentClient(transport, probe)
        unit = choose(cast(InspectAnswer, client.call(base_request(probe, "inspect"))))
        if not facts:
            return unit, []
        probe = probe.model_copy(update={"unit": Unit(name=unit.name)})
        gpus = as_facts(client.call(base_request(probe, "facts"))).get("gpus") or []
    finally:
        transport.close()
    return unit, gpus


def _warn(out: Output, unit: Inspected) -> None:
    """What the adopted unit does that an apply will change or keep (stop timeout, caches, secrets)."""
    from agent.adopt import cache_notes, stop_notes
    from agent.inventory import Drain
    from agent.protocol.requests import stop_timeout_s

    drain = Drain()
    for note in stop_notes(unit, stop_timeout_s(drain.timeout_s, drain.stop_allowance_s)):
        out.print(f"warning: {note}")
    for note in cache_notes(unit):
        out.print(f"warning: {note}")
    if unit.secret_environment:
        out.print(f"secrets kept on the host (values never read here): {', '.join(unit.secret_environment)}")
