"""`deployctl rollback` of a [pd] service: every unit that has a previous unit goes back to it as one group
change, the same one an apply runs (agent/group/pdapply.py): each unit a member with a transaction of its
own, here the agent's `rollback` verb, started in waves (prefills, decodes, router), the last wave proving
the whole with a completion routed through the router; any member failing puts every member back on the
unit it had before the rollback (the group's abort), so the service is never left half rolled back.

Which units: each unit's newest backup that differs from its installed unit (the one-host default, picked
again by its own agent under its lock); and after a prefill goes back, every decode restarts on its own unit,
since Mooncake keeps a healthy pair failed until the decode re-registers (sglang#13054): that decode is sent
its newest backup, a copy of its installed unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

from agent.errors import UsageError
from agent.group.pdapply import PD_WAIT_S, run_group
from agent.group.pdstatus import parts
from agent.group.run import Node
from agent.inventory import HostConfig
from agent.orchestrate.asked import Connection
from agent.orchestrate.session import clients, confirm
from agent.output import Output, Style
from agent.pd.group import Part, Seen, members
from agent.pd.units import routed_url
from agent.protocol.answers import BackupRow, BackupsAnswer
from agent.protocol.common import new_txn_id
from agent.protocol.requests import ROUTER_KIND, Group
from agent.remote.client import AgentClient, base_request
from agent.render import redact_changes
from agent.sglang.flags import FlagChange


@dataclass(frozen=True)
class Chosen:
    index: int  # into parts(host)
    label: str
    backup: str  # the unit it goes back to
    named: bool  # sent by name: a copy of its installed unit (a decode that re-registers)
    why: str
    changes: tuple[tuple[object, ...], ...]  # [flag, backup's value, installed value]
    wave: int
    routed: bool


def _part(label: str) -> Part:
    return Part(label.split("[")[0])


def _differing(rows: Sequence[BackupRow]) -> BackupRow | None:
    return next((r for r in rows if not r.get("same_as_installed")), None)


def chosen_backups(host: HostConfig, listings: Sequence[BackupsAnswer]) -> list[Chosen]:
    """The units the rollback restarts, each with its backup, wave and why; [] when none has a backup
    that differs from its unit."""
    labels = [label for label, _ in parts(host)]
    rows = [list(listing.get("backups") or []) for listing in listings]
    seen = [
        Seen(_part(label), label, _differing(r) is not None) for label, r in zip(labels, rows, strict=True)
    ]
    chosen = []
    for m in members(seen):
        back = _differing(rows[m.index])
        why = f"back to {back['name']}" if back else m.why
        row = back or (rows[m.index][0] if rows[m.index] else None)
        if row is None:
            raise UsageError(
                f"{labels[m.index]} has no backup to restart on after its prefill goes back; "
                "nothing was changed",
                hint=f"apply the service instead: deployctl apply {host.name}",
            )
        changes = tuple(tuple(c) for c in row.get("changes", []))
        chosen.append(
            Chosen(m.index, labels[m.index], row["name"], back is None, why, changes, m.wave, m.routed)
        )
    return chosen


def rollback_nodes(
    host: HostConfig, chosen: Sequence[Chosen], agents: Sequence[AgentClient]
) -> tuple[list[Node], tuple[int, ...]]:
    """One group member per unit that goes back, each a rollback transaction of its own."""
    units = parts(host)
    nodes, key = [], new_txn_id()
    for rank, c in enumerate(chosen):
        unit = units[c.index][1]
        req = base_request(unit, "rollback", backup=c.backup if c.named else None, txn=new_txn_id())
        req = replace(req, group=Group(rank, len(chosen), PD_WAIT_S, collective=False, key=key))
        if _part(c.label) is Part.ROUTER:
            req = replace(req, kind=ROUTER_KIND)
        if c.routed:  # from its own host: the router's loopback there, else its reachable address
            req = replace(req, routed_url=routed_url(host, unit.ssh.target))
        nodes.append(Node(rank, unit, agents[rank], req))
    return nodes, tuple(c.wave for c in chosen)


def _show(out: Output, host: HostConfig, chosen: Sequence[Chosen]) -> None:
    if out.style is Style.JSON:
        return
    units = parts(host)
    out.note(f"== rollback of {host.name}: {len(chosen)} unit(s) as one group, in waves:")
    for c in chosen:
        unit = units[c.index][1]
        out.note(f"   wave {c.wave}: {c.label} {unit.ssh.target} {unit.unit.name}: {c.why}")
        changes = [FlagChange(str(x[0]), x[1], x[2]) for x in c.changes]  # type: ignore[arg-type]
        for change in redact_changes(changes):  # a secret flag's values never printed
            out.note(f"      --{change.name}: {change.after} -> {change.before}")


def refuse_to(host: HostConfig, to: str | None) -> None:
    """--to is refused for a [pd] service: the command line says it before it asks for --yes."""
    if to is not None:
        raise UsageError(
            "--to: names one unit's backup; a [pd] rollback takes each unit back to its newest backup that "
            "differs from its unit, as one group; nothing was changed",
            hint=f"deployctl rollback {host.name} --yes",
        )


def rollback(host: HostConfig, conn: Connection, to: str | None, out: Output, *, yes: bool) -> int:
    refuse_to(host, to)
    units = parts(host)
    with clients([u for _, u in units], conn) as agents:
        listings = [
            cast(BackupsAnswer, a.call(base_request(u, "backups")))
            for (_, u), a in zip(units, agents, strict=True)
        ]
        chosen = chosen_backups(host, listings)
        if not chosen:
            raise UsageError(f"{host.name}: no backup that differs from its installed unit on any unit; "
                             "nothing was changed")  # fmt: skip
        _show(out, host, chosen)
        confirm(out, yes, host)
        nodes, order = rollback_nodes(host, chosen, [agents[c.index] for c in chosen])
        return run_group(out, host, nodes, order)
