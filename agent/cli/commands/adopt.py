"""`deployctl adopt HOST --ssh TARGET`: write units/HOST.toml from the SGLang unit a host already runs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, cast

from agent.errors import UsageError
from agent.inventory import HOST_NAME, Gpus, HostConfig, Model, Ssh, Unit, units_dir
from agent.output import Output
from agent.protocol import UNIT_NAME, GpuRow, InspectAnswer, as_facts

if TYPE_CHECKING:
    from agent.adopt import Inspected


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="the name for units/<host>.toml")
    p.add_argument(
        "--ssh", required=True, metavar="TARGET", help="an ~/.ssh/config alias or user@host[:port]"
    )
    p.add_argument("--unit", help="the unit to adopt when several run SGLang")
    p.add_argument("--sudo", action="store_true", help="run the agent through sudo on the host")
    p.add_argument("--force", action="store_true", help="overwrite an existing units/<host>.toml")
    p.add_argument("--accept-new-host-key", action="store_true", help="trust an unknown SSH host key once")
    p.epilog = "example: deployctl adopt ct200 --ssh ct200 --sudo   (reads only; changes nothing on the host)"


def run(args: argparse.Namespace, out: Output) -> int:
    if not HOST_NAME.fullmatch(args.host):
        raise UsageError(f"host {args.host!r} is not a valid host name (letters, digits, '.', '_', '-')")
    if args.unit is not None and not UNIT_NAME.fullmatch(args.unit):
        raise UsageError(f"--unit {args.unit!r} is not a unit name like sglang.service")
    path = units_dir(args.units) / f"{args.host}.toml"
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists", hint="--force replaces it")
    from agent.adopt import inventory_text  # tomlkit: only here

    unit, gpus = _inspect(args)
    text = inventory_text(args.host, args.ssh, args.sudo, unit, gpus)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    out.print(f"adopted {unit.name} ({unit.fragment_path}) from {args.ssh} into {path}")
    _warn(out, unit)
    out.print(
        f"next: deployctl apply {args.host} --context 200k --dry-run   (the plan and the diff; no change)"
    )
    return 0


def _inspect(args: argparse.Namespace) -> tuple[Inspected, list[GpuRow]]:
    """The unit to adopt and the host's GPUs, asked over SSH (reads only)."""
    from agent.adopt import choose_unit
    from agent.remote.client import AgentClient, base_request, open_transport

    # Only the connection and the agent's folders matter until the unit is known.
    probe = HostConfig(
        name=args.host,
        ssh=Ssh(target=args.ssh, sudo=args.sudo),
        gpus=Gpus(count=1, memory_gib=1.0),
        model=Model(path="/"),
        unit=Unit(name=args.unit or "sglang.service"),
    )
    transport = open_transport(probe, args.accept_new_host_key)
    try:
        client = AgentClient(transport, probe)
        unit = choose_unit(cast(InspectAnswer, client.call(base_request(probe, "inspect"))), args.unit)
        probe = probe.model_copy(update={"unit": Unit(name=unit.name)})
        facts = as_facts(client.call(base_request(probe, "facts")))
    finally:
        transport.close()
    return unit, facts.get("gpus") or []


def _warn(out: Output, unit: Inspected) -> None:
    """What the adopted unit does that an apply will change or keep (stop timeout, caches, secrets)."""
    from agent.adopt import cache_notes, stop_notes
    from agent.host.drain import stop_timeout_s
    from agent.inventory import Drain

    drain = Drain()
    for note in stop_notes(unit, stop_timeout_s(drain.timeout_s, drain.stop_allowance_s)):
        out.print(f"warning: {note}")
    for note in cache_notes(unit):
        out.print(f"warning: {note}")
    if unit.secret_environment:
        out.print(f"secrets kept on the host (values never read here): {', '.join(unit.secret_environment)}")
