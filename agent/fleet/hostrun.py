"""One host's part of a rollout, run on the controller: facts, plan, render, the host transaction.

The Ansible action plugins call these functions; they reach the host through deployctl's own client (its
SSH rules, the bundle pushed only when its checksum differs, the transaction detached on the host), so a
dropped connection loses nothing: the host finishes on its own and this side re-attaches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.apply import allow_context, drifted, installed_sha256, refuse_weight_cache
from agent.errors import ConnectError, DeployError, UsageError
from agent.fleet.calibrate import Measured, peer_key
from agent.fleet.results import HostResult, HostStatus
from agent.fleet.steps import (
    Applied,
    Emit,
    apply_request,
    as_change,
    downtime_of,
    flags_of,
    follow_outcome,
    plan_figures,
    plan_host,
    render_for,
)
from agent.group.nodes import node_hosts
from agent.group.status import warning
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change
from agent.protocol.answers import HostFacts, as_facts
from agent.protocol.common import new_txn_id
from agent.remote.client import AgentClient, Conversation, base_request
from agent.remote.follow import connected
from agent.remote.transport import ConnectionLost
from agent.render import redact_flags, render_unit, template_dir
from agent.sglang.flags import FlagInput
from agent.sglang.logs.summary import StartFigures
from agent.verify import render_checked


def apply_host(  # noqa: PLR0913 - as _planned below
    host: HostConfig,
    context: int,
    peers: Sequence[Measured],
    emit: Emit,
    *,
    check: bool = False,
    flags: Mapping[str, FlagInput] | None = None,
) -> HostResult:
    """Plan, render and apply on one host; every expected failure becomes a result, never a raise.

    check: Ansible's check mode: plan and render only; the outcome says whether the unit would change.
    """
    try:
        if host.nodes is not None:  # one service over several hosts: every node in one coordinated change
            from agent.fleet.grouprun import apply_group

            return apply_group(host, context, peers, emit, check, flags or {})
        with connected(host) as client:
            return _apply(client, context, peers, emit, check, flags or {})
    except ConnectionLost as exc:  # re-attaching failed too: the host finishes on its own
        return HostResult(
            host.name, "unreachable", f"connection lost and not regained: {exc.message}", context
        )
    except ConnectError as exc:
        return HostResult(host.name, "unreachable", exc.message, context)
    except DeployError as exc:
        return HostResult(host.name, "error", exc.message, context)


def _apply(  # noqa: PLR0913 - as _planned below
    client: AgentClient,
    context: int,
    peers: Sequence[Measured],
    emit: Emit,
    check: bool,
    flags: Mapping[str, FlagInput],
) -> HostResult:
    host = client.host
    ask = base_request(host, "facts")
    # facts and the apply planned from them: one agent process over one channel, as `deployctl apply`
    with client.converse(ask) as talk:
        if not talk.answer.get("orphan"):
            return _planned(talk, context, peers, emit, check, flags)
    emit("recover", "an earlier change's agent died before it finished; recovering first")
    follow_outcome(client, host, base_request(host, "recover"), emit)
    with client.converse(ask) as talk:
        return _planned(talk, context, peers, emit, check, flags)


def _planned(  # noqa: PLR0913 - one host's rollout step: its link, target, peers, sink, mode and flags
    talk: Conversation,
    context: int,
    peers: Sequence[Measured],
    emit: Emit,
    check: bool,
    flags: Mapping[str, FlagInput],
) -> HostResult:
    host, facts = talk.client.host, as_facts(talk.answer)
    try:  # as `deployctl apply`: before the plan, nothing sent to the host but the facts request
        refuse_weight_cache(host, flags, facts)
    except UsageError as exc:
        return HostResult(host.name, "error", exc.message, context)
    plan, sources = plan_host(host, context, facts, peers, flags)
    unit_flags = {**dict(as_change(context, flags).flags), **plan.flags()}
    figures = plan_figures(plan, sources, emit)
    old_text = facts.get("unit_text") or ""
    before = redact_flags(flags_of(old_text))
    if not plan.feasible:
        return HostResult(
            host.name, "not_feasible", f"the plan cannot reach {context:,} tokens; nothing was changed",
            context, figures, before=before,
        )  # fmt: skip
    new_text = render_for(host, context, unit_flags, facts)
    applied = Applied(host.name, context, figures, before, redact_flags(flags_of(new_text)))
    if check:
        return applied.checked(drifted([new_text], [facts]))
    req = apply_request(host, context, new_text, unit_flags, plan, facts, daemon=True)
    message, data = follow_outcome(talk.client, host, req, emit, talk)
    return applied.result(message, data, facts)


def measurement(host: HostConfig, result: HostResult) -> Measured | None:
    """The fact later hosts read from hostvars to recalibrate."""
    if result.measured_start is None:
        return None
    return Measured(host.name, peer_key(host, result.after or dict(host.sglang.flags)), result.measured_start)


def rollback_host(host: HostConfig, backup: str | None, emit: Emit) -> HostResult:
    if host.nodes is not None:  # as `deployctl rollback` of a group: each node has its own backups
        return HostResult(
            host.name, "error",
            f"one service over {len(host.node_targets)} nodes: a rollback of one node would leave the others "
            "on the new unit; nothing was changed (roll the group back with an apply of the old context: "
            f"deployctl apply {host.name} --context N)",
        )  # fmt: skip
    try:
        with connected(host) as client:
            req = base_request(host, "rollback", backup=backup, txn=new_txn_id())
            message, data = follow_outcome(client, host, req, emit)
    except ConnectError as exc:
        return HostResult(host.name, "unreachable", exc.message)
    except DeployError as exc:
        return HostResult(host.name, "error", exc.message)
    summary: StartFigures = data.get("summary") or {}
    return HostResult(
        host.name, str(data.get("outcome")), message, measured_pool=summary.get("kv_tokens"),
        backup=data.get("backup"), downtime_s=downtime_of(data),
    )  # fmt: skip


def host_status(host: HostConfig, context: int | None) -> HostStatus:
    """Drift and the measured pool: does the installed unit differ from what the plan renders? For a
    multi-node service, one row: rank 0's pool and flags, drift on any node, and a rank that is down."""
    nodes = node_hosts(host)
    facts: list[HostFacts] = []
    for rank, node in enumerate(nodes):
        try:
            with connected(node) as client:
                facts.append(as_facts(client.call(base_request(node, "facts"))))
        except ConnectError as exc:
            where = f"rank {rank} ({node.ssh.target}): " if len(nodes) > 1 else ""
            return {"host": host.name, "reachable": False, "message": where + exc.message}
    state = facts[0].get("state")
    status: HostStatus = {
        "host": host.name,
        "reachable": True,
        "active": state.get("active_state") if state else None,
        "measured_pool": (facts[0].get("last_start") or {}).get("kv_tokens"),
        "flags": redact_flags(flags_of(facts[0].get("unit_text") or "")),
        "unit_sha256": None if installed_sha256(facts[0]) == "absent" else installed_sha256(facts[0]),
    }
    status.update(_drift(nodes, facts, context))
    if len(nodes) > 1:
        status["nodes"] = len(nodes)
        said = warning(host, [f.get("state") for f in facts])
        if said:
            status["warning"] = said
    return status


def _drift(nodes: Sequence[HostConfig], facts: Sequence[HostFacts], context: int | None) -> HostStatus:
    """Whether any node's installed unit differs from what rank 0's plan renders for it."""
    # Without a target: the context of the last start the agent verified (what it was deployed to).
    verified = [c for h in facts[0].get("history") or [] if (c := h.get("context_len"))]
    against = context or (int(verified[-1]) if verified else None)
    if against is None:  # never deployed by deployctl: drift from the inventory's baseline
        texts = [render_unit(node, {}, template_dir()) for node in nodes]
        return {"drift": drifted(texts, facts), "drift_against": None}
    plan, _ = plan_host(nodes[0], against, facts[0], ())
    # against the unit an apply that reaches the context renders: with SGLang's longer-context override where
    # the context is above the model's own (a unit without it drifts from such a target)
    reach = Change(against, force=True, allow_longer_context=True)
    texts = [render_checked(allow_context(n, reach), plan.flags()) for n in nodes]
    return {"drift": drifted(texts, facts), "planned_fraction": plan.mem_fraction_static,
            "drift_against": against}  # fmt: skip
