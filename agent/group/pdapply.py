"""`deployctl apply` of a [pd] service: every refusal first, one plan per role, then one group change over
the units that must restart (agent/pd/group.py), started in waves by the coordinator of a multi-node
change (group/run.py): prefills, then decodes, then the router, each unit a member of its own (a host
that runs several keeps a transaction per unit), each gated on its own pool against its role's need, the
last wave on one completion routed through the router. Any member that fails rolls every member back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace

from agent.errors import InventoryError
from agent.exitcodes import ExitCode
from agent.group.decide import first_cause, group_outcome
from agent.group.pddry import Planned, show_dry_run
from agent.group.run import Coordinator, Hear, Node, converge
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.orchestrate.session import Session, clients, confirm, pending_recovery, recover_orphan
from agent.output import Output, Style
from agent.pd import plan as pd_plan
from agent.pd.group import Member, Part, Seen, members, waves
from agent.pd.refusals import PdHostFacts, check
from agent.pd.router import render_router_unit
from agent.pd.switch import Restart, Switch, decide, running_of, settle
from agent.pd.units import routed_url, router_target, router_unit_name, spec
from agent.protocol.answers import HostFacts, as_facts
from agent.protocol.common import new_txn_id
from agent.protocol.events import Event, Outcome
from agent.protocol.requests import ROUTER_KIND, Group, Request
from agent.remote.client import AgentClient, base_request
from agent.remote.follow import Watch
from agent.remote.follow import follow as follow_transaction

RANK_FAILED = re.compile(r"^rank \d+ failed: ")
PD_WAIT_S = 3600.0  # a unit waits this long for its wave's "go" and for the decision, as a node does


def refused_first(host: HostConfig, context: int) -> list[pd_plan.RolePlan]:
    """Every refusal before anything else (exit 2, nothing touched); a unit short of its need is refused
    too: its start would fail its gate after the others restarted."""
    said = check(host).refusals
    plans = pd_plan.role_plans(host, context)
    said = said or check(host, decodes=pd_plan.decode_needs(plans, context)).refusals
    short = [f"{p.unit.label}: {p.verdict}" if not p.plan.feasible else
             f"{p.unit.label} plans a pool of ~{p.plan.predicted_pool_low_tokens} tokens, short of "
             f"its need {p.need_tokens} ({p.need})" for p in plans if not p.feasible]  # fmt: skip
    said = said or tuple(short)
    if said:
        more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
        raise InventoryError(f"{said[0]}{more}", hint="nothing was changed on any host")
    return plans


def planned_units(host: HostConfig, context: int) -> list[Planned]:
    """Each role's unit rendered with its plan's flags, prefills first, then the router's unit."""
    from agent.verify import render_checked

    units = []
    for p in refused_first(host, context):
        flags = {"context-length": context, **p.plan.flags()}
        text = render_checked(p.unit.host, flags)
        part = Part(p.unit.role.value)
        u = p.unit
        units.append(Planned(part, u.label, u.host, text, p.need_tokens, u.url, u.bootstrap_port))
    units.append(Planned(Part.ROUTER, "router", router_host(host), render_router_unit(host), context))
    return units


def router_host(host: HostConfig) -> HostConfig:
    """The router's unit as a service of its own: its host, unit name and port; no pre-warm, no drain of
    its own (its requests are the units')."""
    router = spec(host).router
    return host.model_copy(
        update={
            "name": f"{host.name}.router",
            "ssh": host.ssh.model_copy(update={"target": router_target(host)}),
            "unit": host.unit.model_copy(update={"name": router_unit_name(host, router)}),
            "sglang": host.sglang.model_copy(update={"port": router.port, "host": router.host}),
            "prewarm": host.prewarm.model_copy(update={"enabled": False}),
            "drain": host.drain.model_copy(update={"enabled": False}),
            "pd": None,
        }
    )


def request_of(unit: Planned, installed: str, context: int) -> Request:
    """Its apply: a role's start gated on its role's need, the router's on its /health. A role's own smoke
    test is off: a prefill or decode alone does not serve a completion (the router pairs them); the
    routed check through the router (its smoke settings) proves them instead."""
    if unit.part is Part.ROUTER:
        return base_request(unit.host, "apply", unit_text=unit.text, target_context=context,
                            expect_sha256=installed, kind=ROUTER_KIND)  # fmt: skip
    # The gate is the role's need alone: the plan here is the inventory's (offline), not calibrated on the
    # host's own starts, so its predicted pool is no bound a start must meet (a one-host apply plans from
    # the host's facts and sends that).
    req = base_request(
        unit.host, "apply", unit_text=unit.text, target_context=unit.need, expect_sha256=installed
    )  # fmt: skip
    return replace(req, smoke=replace(req.smoke, enabled=False, load=0))


def apply(host: HostConfig, conn: Connection, change: Change, out: Output) -> int:
    from agent.apply import allow_context

    # a context above the model's own is refused first, as for one host (exit 2); --allow-longer-context
    # sets SGLang's override in every role's unit (they inherit [unit] environment)
    host = allow_context(host, change)
    units = planned_units(host, change.context)  # every refusal before any connection
    hosts = [u.host for u in units]
    with clients(hosts, conn) as agents:
        asked = [_asked(out, u, agent, change) for u, agent in zip(units, agents, strict=True)]
        refused_by_facts(host, units, [facts for _, _, facts, _ in asked])  # before any compare or restart
        requests = [req for req, _, _, _ in asked]
        changes = [_changes(agent, req) for agent, (req, _, _, _) in zip(agents, asked, strict=True)]
        seen, notes, planned = switches(units, asked, changes)
        chosen = members(seen)
        if change.dry_run:  # every unit's flag changes and diff; nothing sent but facts and compare
            show_dry_run(out, units, [installed for _, _, _, installed in asked], chosen, notes)
            return int(ExitCode.OK)
        if not chosen:
            out.note(
                f"== every unit of {host.name} is up to date (each one checked): nothing to do, no restart"
            )
            return int(ExitCode.OK)
        _show(out, host, units, chosen, notes)
        confirm(out, change.yes, host)
        nodes = _nodes(
            host, units, agents, [switching(r, planned.get(i)) for i, r in enumerate(requests)], chosen
        )
        return run_group(out, host, nodes, waves(chosen))


def _asked(
    out: Output, unit: Planned, agent: AgentClient, change: Change
) -> tuple[Request, bool, HostFacts, str]:
    """Its facts (a dead agent's change finished first: the same recovery as a one-host change; a dry run
    only says it is pending), then its request against the unit it has; whether that recovery ran or would
    (it starts the unit again); the facts, read for the unit about to be written (its Python's transfer
    modules); and the installed unit's text ("" where it has none)."""
    ask = replace(base_request(unit.host, "facts"), unit_text=unit.text)
    answer = agent.call(ask)
    if change.dry_run:  # nothing but facts and compare: its `recover` would restart the unit
        recovered = pending_recovery(
            out, f"{unit.label} {unit.host.ssh.target} {unit.host.unit.name}", answer
        )
    elif recovered := recover_orphan(out, Session(unit.host, agent), answer):
        answer = agent.call(ask)
    from agent.apply import installed_sha256

    facts = as_facts(answer)
    installed = facts.get("unit_text") or ""
    return request_of(unit, installed_sha256(facts), change.context), recovered, facts, installed


Asked = tuple[Request, bool, HostFacts, str]


def switches(
    units: Sequence[Planned], asked: Sequence[Asked], changes: Sequence[bool]
) -> tuple[list[Seen], dict[int, str], dict[int, Switch | bool]]:
    """Each unit as the change found it, with its role switch where SGLang would take one
    (agent/pd/switch.py); the line that says why a unit whose role changes restarts instead; what each
    switching member is sent (the router's: True, its unit written without a restart)."""
    roles = [i for i, u in enumerate(units) if u.part is not Part.ROUTER]
    peer = next((units[i].url for i in roles if units[i].part is Part.DECODE and not changes[i]), None)
    decided = [decide(running_of(asked[i][2]), units[i].text, peer) if changes[i] else None for i in roles]
    prefill_restarts = any(
        units[i].part is Part.PREFILL and (asked[i][1] or (changes[i] and not isinstance(d, Switch)))
        for i, d in zip(roles, decided, strict=True)
    )
    router = next(i for i, u in enumerate(units) if u.part is Part.ROUTER)
    settled = settle(decided, [units[i].url for i in roles], prefill_restarts, (asked[router][3] or None,
                     units[router].text))  # fmt: skip
    said = dict(zip(roles, settled.decisions, strict=True))
    seen = [
        Seen(
            u.part,
            u.label,
            changes[i],
            asked[i][1],
            _switch_word(said.get(i), i == router and settled.router_keeps),
        )
        for i, u in enumerate(units)
    ]
    notes = {i: d.line for i, d in said.items() if isinstance(d, Restart)}
    planned: dict[int, Switch | bool] = {i: d for i, d in said.items() if isinstance(d, Switch)}
    if settled.router_keeps and changes[router]:
        planned[router] = True
    return seen, notes, planned


def _switch_word(decision: Switch | Restart | None, router_keeps: bool) -> str | None:
    if isinstance(decision, Switch):
        return f"{decision.old_role} -> {decision.new_role}"
    return "by the switched roles alone" if router_keeps else None


def host_facts(units: Sequence[Planned], answers: Sequence[HostFacts]) -> dict[str, PdHostFacts]:
    """Each role host's PD facts (its units' answers together: a module counts when every unit's Python
    has it); a field no answer gives stays unknown, and its check is not made."""
    found: dict[str, PdHostFacts] = {}
    for unit, answer in zip(units, answers, strict=True):
        seen = _pd_facts(answer)
        if unit.part is Part.ROUTER or seen is None:
            continue
        was = found.get(unit.host.ssh.target)
        found[unit.host.ssh.target] = seen if was is None else _merge(was, seen)
    return found


def _pd_facts(answer: HostFacts) -> PdHostFacts | None:
    pd = answer.get("pd")
    if not pd:
        return None
    version = ((answer.get("model_facts") or {}).get("sglang") or {}).get("version")
    mods, rdma, engine = pd.get("importable"), pd.get("rdma_devices"), pd.get("engine")
    return PdHostFacts(
        version,
        frozenset(mods) if mods is not None else None,
        tuple(rdma) if rdma is not None else None,
        engine["detail"] if engine and engine.get("verdict") == "not_importable" else None,
    )


def _merge(a: PdHostFacts, b: PdHostFacts) -> PdHostFacts:
    mods = a.importable & b.importable if a.importable is not None and b.importable is not None else None
    return PdHostFacts(
        a.sglang_version or b.sglang_version,
        mods if mods is not None else a.importable or b.importable,
        a.rdma_devices if a.rdma_devices is not None else b.rdma_devices,
        a.engine_error or b.engine_error,  # one unit's Python that cannot import it is enough
    )


def refused_by_facts(host: HostConfig, units: Sequence[Planned], answers: Sequence[HostFacts]) -> None:
    """The refusals the hosts' facts decide (a transfer backend not installed for a unit's Python, NIXL with
    no RDMA device chosen on a host with several, different SGLang releases): exit 2, nothing changed."""
    said = check(host, host_facts(units, answers)).refusals
    if said:
        more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
        raise InventoryError(f"{said[0]}{more}", hint="nothing was changed on any host")


def _changes(agent: AgentClient, req: Request) -> bool:
    """Whether its agent says an apply would change something (under its lock: the one-host check)."""
    answer = agent.call(replace(req, verb="compare", group=None, txn=None))
    return answer.get("up_to_date") is not True


def _nodes(
    host: HostConfig, units: Sequence[Planned], agents: Sequence[AgentClient], requests: Sequence[Request],
    chosen: Sequence[Member],
) -> list[Node]:  # fmt: skip
    """One group member per unit that restarts, each with its own transaction (units of one host each
    keep their own folder and signals)."""
    n, nodes, key = len(chosen), [], new_txn_id()
    router_stays = all(units[m.index].part is not Part.ROUTER or m.switch for m in chosen)
    for rank, m in enumerate(chosen):
        group = Group(rank, n, PD_WAIT_S, collective=False, key=key)
        req = replace(requests[m.index], txn=new_txn_id(), group=group)
        # from its own host: the router's loopback there, else its reachable address (refused when none)
        url = routed_url(host, units[m.index].host.ssh.target)
        req = replace(req, routed_url=url) if m.routed else req
        u = units[m.index]
        req = through_router(req, u.part, u.url, u.bootstrap_port, url) if router_stays else req
        nodes.append(Node(rank, units[m.index].host, agents[m.index], req))
    return nodes


def switching(req: Request, planned: Switch | bool | None) -> Request:
    """A member switched in place: its new role and, to decode, the decode peer SGLang's graph memory is
    read from (a decode that keeps running); no pre-warm (nothing loads). The router's member (True): its
    unit written, no restart."""
    if planned is True:
        return replace(req, pd_router_keeps=True)
    if not isinstance(planned, Switch):
        return req
    return replace(
        req, pd_switch_role=planned.new_role, pd_switch_graph_url=planned.graph_peer, prewarm=False
    )


def through_router(
    req: Request, part: Part, worker_url: str | None, bootstrap_port: int | None, router: str | None
) -> Request:
    """A role's unit is drained through the running router: taken out of it before its stop (no new
    request reaches it; the drain waits for those it has), put back with its role once its new server
    passed its checks (host/roles/routerstep.py). Only while the router's own unit stays: a router that
    restarts registers every unit anew from its command line. An apply's member and a rollback's alike."""
    if part is Part.ROUTER or worker_url is None or router is None:
        return req
    return replace(
        req, router_url=router, router_worker_url=worker_url, router_worker_type=part.value,
        router_bootstrap_port=bootstrap_port,
    )  # fmt: skip


def _show(
    out: Output, host: HostConfig, units: Sequence[Planned], chosen: Sequence[Member], notes: dict[int, str]
) -> None:
    if out.style is Style.JSON:
        return
    out.note(f"== {len(chosen)} unit(s) change as one group, in waves (prefills, decodes, router):")
    out.note(f"   {pd_plan.checksum_line(host)}")
    for m in chosen:
        u = units[m.index]
        out.note(f"   wave {m.wave}: {u.label} {u.host.ssh.target} {u.host.unit.name}: {m.why}")
        if m.index in notes:
            out.note(f"      {notes[m.index]}")


ROLE_NAME = re.compile(r"(prefill|decode)(\d+)")


def shown(node: Node) -> str:
    """A member as plan, refusals and the waves name it (prefill[0], router), not its unit's inventory
    name (pd.prefill0: written into its unit's header, so kept)."""
    tail = node.host.name.rsplit(".", 1)[-1]
    m = ROLE_NAME.fullmatch(tail)
    return f"{m[1]}[{m[2]}]" if m else tail


def run_group(out: Output, host: HostConfig, nodes: list[Node], order: tuple[int, ...]) -> int:
    """The coordinator over the members in waves, converge, and one report (an apply's or a rollback's)."""

    def hear(node: Node, event: Event) -> None:
        if event.kind in ("step", "warning") and out.style is not Style.JSON:
            out.note(f"   [{shown(node)}] {event.stage}: {event.message}")

    Coordinator(nodes, hear, waves=order).run()
    converged = converge(nodes, lambda node, backup: _rollback(node, backup, hear))
    outcome = group_outcome([n.view for n in nodes], converged)
    cause = first_cause([n.view for n in nodes])
    # a member's vote says "rank N failed: ..."; the report names the unit instead
    said = RANK_FAILED.sub("", cause[1]) if cause else ""
    why = f": {shown(nodes[cause[0]])} failed: {said}" if cause else ""
    if out.style is Style.JSON:
        out.print(json.dumps(_json(host, nodes, outcome.value, why), sort_keys=True, default=str))
        return int(outcome.exit_code)
    out.print(f"== {host.name}: {headline(nodes, outcome)}{why}")
    for node in nodes:
        what = node.view.outcome.value if node.view.outcome else "unknown (no contact)"
        said = node.outcome.message if node.outcome else node.view.why
        out.print(f"   {shown(node)} ({node.host.ssh.target} {node.host.unit.name}): {what}: {said}")
    return int(outcome.exit_code)


# A rollback's own words where an apply's would mislead (the one-host one says `<unit> restored <backup>`)
UNDONE = {
    Outcome.APPLIED: "RESTORED: the service is back one generation, every unit healthy",
    Outcome.ROLLED_BACK: "ROLLED BACK: the rollback was rejected; every unit is back on the unit it had "
    "before it, healthy",
}


def headline(nodes: Sequence[Node], outcome: Outcome) -> str:
    """The report's headline: an apply's, or a rollback's (every member the agent's rollback verb)."""
    undo = bool(nodes) and all(n.request.verb == "rollback" for n in nodes)
    return UNDONE.get(outcome, outcome.headline) if undo else outcome.headline


def _json(host: HostConfig, nodes: Sequence[Node], outcome: str, why: str) -> dict[str, object]:
    units = [
        {"unit": n.host.unit.name, "target": n.host.ssh.target, "name": n.host.name,
         "outcome": n.view.outcome.value if n.view.outcome else None,
         "message": n.outcome.message if n.outcome else n.view.why}
        for n in nodes
    ]  # fmt: skip
    return {"service": host.name, "outcome": outcome, "reason": why.removeprefix(": "), "units": units}


def _rollback(node: Node, backup: str, hear: Hear) -> Event:
    req = replace(
        base_request(node.host, "rollback", backup=backup, txn=new_txn_id()), kind=node.request.kind
    )
    assert node.client is not None
    return follow_transaction(node.client, node.host, req, Watch(lambda e: hear(node, e)))


__all__ = ["Planned", "apply", "planned_units", "request_of", "run_group", "through_router"]
