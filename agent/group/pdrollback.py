"""`deployctl rollback` of a [pd] service: the service goes back one generation as one group change, the
same one an apply runs (agent/group/pdapply.py): each unit a member with a transaction of its own, here the
agent's `rollback` verb, started in waves (prefills, decodes, router), the last wave proving the whole with a
completion routed through the router; any member failing puts every member back on the unit it had before
the rollback (the group's abort), so the service is never left half rolled back.

Which units: those the newest group change that changed a unit backed up, each to that backup (its agent
records the group's key with it), every other unit staying as installed: one generation, never each unit's
newest backup on its own (a prefill at page 1 beside a decode at 16). That set is refused, before anything
is sent, when SGLang would refuse it (parity, placement: agent/pd/refusals.py). After a prefill goes back,
every decode restarts on its own unit, since Mooncake keeps a healthy pair failed until the decode
re-registers (sglang#13054): that decode is sent a backup that is a copy of its installed unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from agent.errors import InventoryError, UsageError
from agent.group.pdapply import PD_WAIT_S, run_group, through_router
from agent.group.pdstatus import parts
from agent.group.run import Node
from agent.inventory import HostConfig
from agent.orchestrate.asked import Connection
from agent.orchestrate.session import clients, confirm
from agent.output import Output, Style
from agent.pd.group import Part, Seen, members
from agent.pd.refusals import set_refusals
from agent.pd.units import PdUnit, pd_units, routed_url
from agent.protocol.answers import BackupRow, BackupsAnswer
from agent.protocol.common import new_txn_id
from agent.protocol.requests import ROUTER_KIND, Group
from agent.remote.client import AgentClient, base_request
from agent.render import redact_changes
from agent.sglang.flags import FlagChange, FlagValue


@dataclass(frozen=True)
class Chosen:
    index: int  # into parts(host)
    label: str
    backup: str  # the unit it goes back to, sent by name (a decode that re-registers: a copy of its own)
    why: str
    changes: tuple[tuple[object, ...], ...]  # [flag, backup's value, installed value]
    wave: int
    routed: bool


def _part(label: str) -> Part:
    return Part(label.split("[")[0])


def generation(rows: Sequence[Sequence[BackupRow]]) -> str:
    """The newest group change with a backup that differs from its unit's installed one: the one a rollback
    undoes. Its key opens with the UTC stamp of one clock, the laptop's (protocol/common.py new_txn_id),
    so the newest sorts last whatever the hosts' clocks say."""
    keys = {r["group"] for rs in rows for r in rs if r.get("group") and not r["same_as_installed"]}
    if not keys:
        raise UsageError(
            "no backup that a change of the whole service took differs from its unit, on any unit (a backup "
            "taken before such changes were recorded names none); nothing was changed",
            hint="apply the service as it should be instead",
        )
    return max(keys)


def _of(rows: Sequence[BackupRow], key: str) -> BackupRow | None:
    """The unit's backup taken by that change, where it changed the unit; None: the unit stays as it is."""
    row = next((r for r in rows if r.get("group") == key), None)
    return row if row is not None and not row["same_as_installed"] else None


def refuse_set(
    host: HostConfig, listings: Sequence[BackupsAnswer], backs: Sequence[BackupRow | None]
) -> None:
    """The [pd] refusals of parity and placement over the units the rollback leaves, each as its backup or
    its installed unit says (their ExecStart's flags): a set SGLang refuses at its first transfer is
    refused here, before anything is sent (exit 2)."""
    units = pd_units(host)
    parsed = []
    for unit, listing, back in zip(units, listings, backs, strict=False):  # the router's last: no role
        flags = back.get("flags") if back is not None else listing.get("flags")
        if flags is None:
            raise UsageError(f"{unit.label}: its {'backup' if back else 'unit'} has no flags deployctl "
                             "can read; nothing was changed")  # fmt: skip
        parsed.append(_as_run(unit, flags))
    said = set_refusals(host, parsed)
    if said:
        named = ", ".join(f"{u.label} {u.host.unit.name}" for u in parsed)
        raise InventoryError(
            f"the rollback's units ({named}): {said[0]}",
            hint="nothing was changed on any host; apply the service as it should be instead",
        )


def _number(value: FlagValue | None) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _as_run(unit: PdUnit, flags: Mapping[str, FlagValue]) -> PdUnit:
    """The unit as its ExecStart runs it: its flags, and its ports where they name them."""
    port, boot = _number(flags.get("port")), _number(flags.get("disaggregation-bootstrap-port"))
    sglang = unit.host.sglang.model_copy(update={"flags": dict(flags), "port": port or unit.host.sglang.port})
    return replace(
        unit,
        host=unit.host.model_copy(update={"sglang": sglang}),
        bootstrap_port=boot if boot and unit.bootstrap_port is not None else unit.bootstrap_port,
    )


def chosen_backups(host: HostConfig, listings: Sequence[BackupsAnswer]) -> list[Chosen]:
    """The units the rollback restarts, each with its backup, wave and why: the backups of one change of
    the service (the newest that changed something), every other unit on its own unit; refused when that
    set of units is one SGLang refuses. Raises when no change of the service has a backup."""
    labels = [label for label, _ in parts(host)]
    rows = [list(listing.get("backups") or []) for listing in listings]
    key = generation(rows)
    backs = [_of(r, key) for r in rows]
    refuse_set(host, listings, backs)
    seen = [Seen(_part(label), label, b is not None) for label, b in zip(labels, backs, strict=True)]
    chosen = []
    for m in members(seen):
        back = backs[m.index]
        why = f"back to {back['name']}" if back else m.why
        # a decode that re-registers restarts on its own unit: a backup that is a copy of it
        row = back or next((r for r in rows[m.index] if r["same_as_installed"]), None)
        if row is None:
            raise UsageError(
                f"{labels[m.index]} has no backup to restart on after its prefill goes back; "
                "nothing was changed",
                hint=f"apply the service instead: deployctl apply {host.name}",
            )
        changes = tuple(tuple(c) for c in row.get("changes", []))
        chosen.append(Chosen(m.index, labels[m.index], row["name"], why, changes, m.wave, m.routed))
    return chosen


def rollback_nodes(
    host: HostConfig, chosen: Sequence[Chosen], agents: Sequence[AgentClient]
) -> tuple[list[Node], tuple[int, ...]]:
    """One group member per unit that goes back, each a rollback transaction of its own; while the router's
    unit stays, a role's unit is drained through the running router and put back once started, as an
    apply's member is (pdapply.through_router): no routed request meets it stopped."""
    units, roles = parts(host), pd_units(host)
    nodes, key = [], new_txn_id()
    router_stays = all(_part(c.label) is not Part.ROUTER for c in chosen)
    for rank, c in enumerate(chosen):
        unit = units[c.index][1]
        req = base_request(
            unit, "rollback", backup=c.backup, txn=new_txn_id()
        )  # by name: that change's backup
        req = replace(req, group=Group(rank, len(chosen), PD_WAIT_S, collective=False, key=key))
        if _part(c.label) is Part.ROUTER:
            req = replace(req, kind=ROUTER_KIND)
        # from its own host: the router's loopback there, else its reachable address
        url = routed_url(host, unit.ssh.target)
        req = replace(req, routed_url=url) if c.routed else req
        if router_stays and c.index < len(roles):
            role = roles[c.index]
            req = through_router(req, _part(c.label), role.url, role.bootstrap_port, url)
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
            "--to: names one unit's backup; a [pd] rollback takes the service back one generation, as one "
            "group: each unit the newest change of the service backed up goes back to that backup, every "
            "other unit keeps its unit; nothing was changed",
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
