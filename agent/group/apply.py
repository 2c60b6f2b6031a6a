"""`deployctl apply` of a multi-node service: facts from every node, one plan from node 0's last start,
one unit per node, then the coordinated change (group/run.py) and one report."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from agent.exitcodes import ExitCode
from agent.group.decide import first_cause, group_outcome
from agent.group.inplace import every_node_in_place
from agent.group.nodes import node_hosts
from agent.group.run import Coordinator, Hear, Node, converge
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.orchestrate.session import clients
from agent.output import Output, Style
from agent.protocol.answers import HostFacts, as_facts
from agent.protocol.common import new_txn_id
from agent.protocol.events import Event, Outcome, Stage
from agent.protocol.requests import Group, Request
from agent.remote.client import base_request
from agent.remote.follow import Watch
from agent.remote.follow import follow as follow_transaction

if TYPE_CHECKING:
    from agent.apply import Prepared


def apply(host: HostConfig, conn: Connection, change: Change, out: Output) -> int:
    from agent import apply as planned
    from agent.orchestrate.session import Session, confirm, pending_recovery, recover_orphan

    hosts = node_hosts(host)
    with clients(hosts, conn) as agents:
        facts = []
        for node, agent in zip(hosts, agents, strict=True):
            answer = agent.call(base_request(node, "facts"))
            if change.dry_run:  # a dry run sends nothing but facts: it says the recovery is pending
                pending_recovery(out, node.name, answer)
            elif recover_orphan(out, Session(node, agent), answer):  # a dead agent's change first
                answer = agent.call(base_request(node, "facts"))
            facts.append(as_facts(answer))
        sent = planned.prepare(out, hosts[0], change, facts[0])
        if sent is None:
            return int(ExitCode.OK)
        requests = [
            sent.request,
            *(_node_request(h, change, sent, f) for h, f in zip(hosts[1:], facts[1:], strict=True)),
        ]
        if every_node_in_place(agents, requests):  # each node's agent decides, under its lock
            out.note(
                f"== every node of {host.name} is up to date (each node checked): nothing to do, no restart"
            )
            return int(ExitCode.OK)
        _show_nodes(out, hosts)
        confirm(out, change.yes, host)
        txn, n = new_txn_id(), len(hosts)
        assert host.nodes is not None
        nodes = [
            Node(rank, h, agent, replace(req, txn=txn, group=Group(rank, n, host.nodes.wait_s)))
            for rank, (h, agent, req) in enumerate(zip(hosts, agents, requests, strict=True))
        ]

        def report_rank0(event: Event) -> None:  # node 0's own report: its pool, smoke test, downtime
            planned.report(out, hosts[0], sent, event, facts[0])

        return _run(out, host, nodes, report_rank0)


def _node_request(host: HostConfig, change: Change, sent: Prepared, facts: HostFacts) -> Request:
    """Node rank >= 1: the same flags as node 0's plan, rendered with its own --node-rank."""
    from agent import apply as planned
    from agent.render import secret_values
    from agent.verify import render_checked

    flags = {**dict(change.flags), **sent.plan.flags()}
    target = planned.allow_context(host, change)
    text = render_checked(target, flags, installed=facts.get("unit_text") or "")
    env_secrets, flag_secrets = secret_values(target, flags)
    return base_request(
        host, "apply", unit_text=text, target_context=change.context, planned_pool=sent.request.planned_pool,
        planned_host_pool=sent.request.planned_host_pool,
        expect_sha256=planned.installed_sha256(facts), secret_env=env_secrets, secret_flags=flag_secrets,
    )  # fmt: skip


def _show_nodes(out: Output, hosts: Sequence[HostConfig]) -> None:
    if out.style is Style.JSON:
        return
    out.note(f"== {len(hosts)} nodes, one restart of all of them (rank 0 serves HTTP):")
    for rank, h in enumerate(hosts):
        out.note(f"   rank {rank}: {h.ssh.target} ({h.unit.name}, --node-rank {rank})")


def _run(out: Output, host: HostConfig, nodes: list[Node], report_rank0: Callable[[Event], None]) -> int:
    def hear(node: Node, event: Event) -> None:
        if event.kind in ("step", "warning") and out.style is not Style.JSON:
            out.note(f"   [rank {node.rank}] {event.stage}: {event.message}")

    Coordinator(nodes, hear).run()
    converged = converge(nodes, lambda node, backup: _rollback(node, backup, hear))
    outcome = group_outcome([n.view for n in nodes], converged)
    cause = first_cause([n.view for n in nodes])
    why = f"rank {cause[0]} ({nodes[cause[0]].host.ssh.target}) failed: {cause[1]}" if cause else ""
    if out.style is Style.JSON:
        out.print(json.dumps({**_json(host, nodes, outcome), "reason": why}, sort_keys=True, default=str))
        return int(outcome.exit_code)
    if nodes[0].outcome is not None:
        report_rank0(nodes[0].outcome)
    out.print(f"== {host.name}: {outcome.headline}" + (f": {why}" if why else ""))
    for node in nodes:
        what = node.view.outcome.value if node.view.outcome else "unknown (no contact)"
        out.print(f"   rank {node.rank} ({node.host.ssh.target}): {what}: {_message(node)}")
    return int(outcome.exit_code)


def _message(node: Node) -> str:
    if node.outcome is not None:
        return node.outcome.message
    return node.view.why or "no outcome"


def _rollback(node: Node, backup: str, hear: Hear) -> Event:
    """Put a node that kept the new unit back on the unit it had (the backup its apply took)."""
    req = base_request(node.host, "rollback", backup=backup, txn=new_txn_id())
    assert node.client is not None
    return follow_transaction(node.client, node.host, req, Watch(lambda e: hear(node, e)))


def _json(host: HostConfig, nodes: Sequence[Node], outcome: Outcome) -> dict[str, object]:
    return {
        "host": host.name,
        "outcome": outcome.value,
        "ranks": [
            {
                "rank": n.rank,
                "target": n.host.ssh.target,
                "outcome": n.view.outcome.value if n.view.outcome else None,
                "message": _message(n),
                "data": n.outcome.data if n.outcome else {},
            }
            for n in nodes
        ],
        "stage": Stage.GROUP.value,
    }
