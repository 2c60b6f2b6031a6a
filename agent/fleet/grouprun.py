"""A multi-node service's step of a rollout: every node in one coordinated change, as one fleet result.

The inventory plugin lists the service once, under its file's name, so Ansible counts it as one host: a
canary of 1 is the whole service, a batch of 4 is four services, and a failure halts as one host's does.
The change itself is agent/group's: facts from every node, one plan from node 0's, one unit per node,
the Coordinator (stop all, "go", vote, commit or abort) and converge (all new or all old, never a mix).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from agent.apply import drifted
from agent.fleet.calibrate import Measured
from agent.fleet.results import HostResult, RankResult
from agent.fleet.steps import (
    Applied,
    Emit,
    apply_request,
    as_change,
    flags_of,
    follow_outcome,
    plan_figures,
    plan_host,
    render_for,
)
from agent.group.decide import Vote, first_cause, group_outcome
from agent.group.inplace import every_node_in_place
from agent.group.nodes import node_hosts
from agent.group.run import Coordinator, Follow, Node, Signal, converge, signal
from agent.group.run import follow as follow_node
from agent.inventory import HostConfig
from agent.protocol.answers import HostFacts, as_facts
from agent.protocol.common import new_txn_id
from agent.protocol.events import Event, Outcome, OutcomeData
from agent.protocol.requests import Group, Request
from agent.remote.client import AgentClient, base_request
from agent.remote.follow import Watch, connected, follow
from agent.render import redact_flags
from agent.sglang.flags import FlagInput

Rollback = Callable[[Node, str], Event]  # (node, its backup) -> the rollback's outcome event


@contextlib.contextmanager
def _clients(hosts: Sequence[HostConfig]) -> Iterator[list[AgentClient]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(connected(h)) for h in hosts]


def apply_group(  # noqa: PLR0913 - as hostrun.apply_host, which calls it
    host: HostConfig,
    context: int,
    peers: Sequence[Measured],
    emit: Emit,
    check: bool,
    flags: Mapping[str, FlagInput],
) -> HostResult:
    """Plan from node 0, render every node, apply all of them in one coordinated change. Raises what
    apply_host turns into results (ConnectError, ConnectionLost, DeployError)."""
    hosts = node_hosts(host)
    with _clients(hosts) as clients:
        facts = [_facts(c, _rank_emit(emit, rank)) for rank, c in enumerate(clients)]
        plan, sources = plan_host(hosts[0], context, facts[0], peers, flags)
        figures = plan_figures(plan, sources, emit)
        before = redact_flags(flags_of(facts[0].get("unit_text") or ""))
        if not plan.feasible:
            return HostResult(
                host.name, "not_feasible", f"the plan cannot reach {context:,} tokens; nothing was changed",
                context, figures, before=before,
            )  # fmt: skip
        unit_flags = {**dict(as_change(context, flags).flags), **plan.flags()}
        texts = [render_for(h, context, unit_flags, f) for h, f in zip(hosts, facts, strict=True)]
        applied = Applied(host.name, context, figures, before, redact_flags(flags_of(texts[0])))
        if check:
            return applied.checked(drifted(texts, facts))
        sends = zip(hosts, texts, facts, strict=True)
        requests = [apply_request(h, context, t, unit_flags, plan, f) for h, t, f in sends]
        if every_node_in_place(clients, requests):  # as `deployctl apply`: each node's agent decides
            return applied.result(f"every node of {host.name} is up to date", _UP_TO_DATE, facts[0])
        nodes = group_nodes(host, clients, requests)
        return group_result(applied, nodes, coordinate(nodes, emit), facts[0])


_UP_TO_DATE: OutcomeData = {"outcome": "up_to_date"}


def _rank_emit(emit: Emit, rank: int) -> Emit:
    return lambda phase, message: emit(f"rank {rank} {phase}", message)


def _facts(client: AgentClient, emit: Emit) -> HostFacts:
    """The node's facts; an earlier change whose agent died on it is recovered first."""
    host = client.host
    answer = client.call(base_request(host, "facts"))
    if answer.get("orphan"):
        emit("recover", "an earlier change's agent died before it finished; recovering first")
        follow_outcome(client, host, base_request(host, "recover"), emit)
        answer = client.call(base_request(host, "facts"))
    return as_facts(answer)


def group_nodes(
    host: HostConfig, clients: Sequence[AgentClient | None], requests: Sequence[Request]
) -> list[Node]:
    """One Node per rank, every request under one transaction id and the group's rank and size."""
    assert host.nodes is not None
    txn, n, wait_s = new_txn_id(), len(requests), host.nodes.wait_s
    return [
        Node(rank, h, c, replace(req, txn=txn, group=Group(rank, n, wait_s)))
        for rank, (h, c, req) in enumerate(zip(node_hosts(host), clients, requests, strict=True))
    ]


@dataclass(frozen=True)
class Drive:
    """How the nodes' transactions are followed, signalled and rolled back: over SSH, or fakes in tests."""

    follow: Follow = follow_node  # re-attaches after a dropped link, as a one-host apply does
    deliver: Signal = signal
    rollback: Rollback | None = None  # None: the node's agent, over its link


@dataclass(frozen=True)
class GroupRun:
    outcome: Outcome
    reason: str  # the coordinator's reason for an abort ("rank 1 failed: ...")
    rank0: Event | None  # node 0's own transaction outcome (its pool, smoke test, downtime)


def coordinate(nodes: Sequence[Node], emit: Emit, drive: Drive = Drive()) -> GroupRun:
    """Run the coordinated change to its end, then converge the nodes on one side (all new or all old)."""

    def hear(node: Node, event: Event) -> None:
        if event.kind in ("step", "warning"):
            emit(f"rank {node.rank} {event.stage}", event.message)

    coordinator = Coordinator(nodes, hear, deliver=drive.deliver, follow=drive.follow)
    coordinator.run()
    rank0 = nodes[0].outcome  # before converge puts a rollback's outcome in its place
    converged = converge(nodes, drive.rollback or _rollback(hear), drive.deliver)
    return GroupRun(group_outcome([n.view for n in nodes], converged), coordinator.reason, rank0)


def _rollback(hear: Callable[[Node, Event], None]) -> Rollback:
    """Put a node that kept the new unit back on the one it had (the backup its apply took)."""

    def back(node: Node, backup: str) -> Event:
        req = base_request(node.host, "rollback", backup=backup, txn=new_txn_id())
        assert node.client is not None
        return follow(node.client, node.host, req, Watch(lambda e: hear(node, e)))

    return back


def group_result(applied: Applied, nodes: Sequence[Node], run: GroupRun, facts0: HostFacts) -> HostResult:
    """The service's one row: the group's outcome, rank 0's figures, every node, and who stopped it."""
    data: OutcomeData = {**(run.rank0.outcome_data() if run.rank0 else {}), "outcome": run.outcome.value}
    ranks = tuple(_rank(n) for n in nodes)
    culprit = failed_rank(nodes, run.reason) if run.outcome is not Outcome.APPLIED else None
    message = _message(run, ranks, culprit)
    result = applied.result(message, data, facts0)
    return replace(result, backup=None, ranks=ranks, failed_rank=culprit)


def _rank(node: Node) -> RankResult:
    outcome = node.view.outcome.value if node.view.outcome else None
    said = node.outcome.message if node.outcome is not None else node.view.why or "no outcome"
    backup = node.outcome.data.get("backup") if node.outcome is not None else None
    return RankResult(
        node.rank, node.host.ssh.target, outcome, said, backup if isinstance(backup, str) else None
    )


RANK = re.compile(r"rank (\d+)\b")


def failed_rank(nodes: Sequence[Node], reason: str) -> int | None:
    """The rank that stopped the group: the one the coordinator's abort names (its start failed, it was
    lost, refused, or had rolled itself back), else one that was lost or failed after the decision (a
    rank told to abort votes "failed" too, so the reason comes first). A rank that failed on its own
    comes before one that only lost its peers (decide.first_cause)."""
    cause = first_cause([n.view for n in nodes])
    if cause is not None:
        return cause[0]
    named = RANK.match(reason)
    if named:
        return int(named.group(1))
    for pick in (lambda n: n.view.lost, lambda n: n.view.vote is Vote.FAILED):
        found = [n.rank for n in nodes if pick(n)]
        if found:
            return found[0]
    return None


def _message(run: GroupRun, ranks: Sequence[RankResult], culprit: int | None) -> str:
    n = len(ranks)
    if run.outcome is Outcome.APPLIED:
        return f"all {n} nodes applied: " + (run.rank0.message if run.rank0 else "")
    why = ranks[culprit].message if culprit is not None else ""
    stopped = run.reason or (
        f"rank {culprit} ({ranks[culprit].target}): {why}" if culprit is not None else ""
    )
    if run.outcome is Outcome.ROLLED_BACK:
        return f"every node is back on its old unit: {stopped}"
    if run.outcome is Outcome.ROLLBACK_FAILED:
        unsure = [
            f"rank {r.rank} ({r.target}): {r.outcome or 'unknown'}"
            for r in ranks
            if r.outcome != "rolled_back"
        ]
        return f"the nodes may not all be on one unit ({'; '.join(unsure)}): {stopped}"
    return f"nothing was changed: {stopped or ranks[0].message}"
