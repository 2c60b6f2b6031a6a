"""A plan with its HiCache host side (plan/hostplan.py) folded in: the host pool and the budget when the
flags enable HiCache; a budget that does not fit makes the plan infeasible (apply refuses it before any
restart, naming the service and the `--hicache-size` that fits), a pre-warm that cannot fit is a warning.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from agent.inventory import HostConfig, load_services
from agent.plan.choose import Plan
from agent.plan.facts import PlanInput
from agent.plan.hostbudget import ServiceNeed, Verdict
from agent.plan.hostplan import enabled, neighbour, plan_host, rank_pool
from agent.plan.inputs import draft_model
from agent.sglang.pools import PoolSizer


def with_host_plan(inp: PlanInput, sizer: PoolSizer | None, plan: Plan) -> Plan:
    """The plan with `host` set where HiCache is on and its pool is one deployctl follows; else unchanged
    (with a note saying why the host pool is not planned)."""
    if not enabled(inp.flags):
        return plan
    why = None
    if sizer is None or sizer.mamba is not None or sizer.swa_ratio is not None:
        why = "a hybrid pool (state cache or sliding window)"
    elif draft_model(inp.flags) is not None:
        why = "a speculative draft's pool"
    pool = (
        None
        if why or sizer is None
        else rank_pool(plan.predicted_pool_tokens, sizer.cell_bytes, sizer.page_size)
    )
    if pool is None:
        said = why or "no whole-byte cell or no device pool"
        return replace(plan, notes=(*plan.notes, f"HiCache host pool not planned: {said}"))
    weights = inp.model.weights_bytes or 0
    host = plan_host(inp.name, pool, inp.flags, inp.host_memory, inp.neighbours, weights, inp.weight_cache,
                     inp.unit_memory_limit)  # fmt: skip
    lines = tuple(host.lines(plan.predicted_pool_tokens, plan.context_length))
    if not host.fits:
        reason = host.budget.reason or lines[0]
        return replace(plan, host=host, feasible=False, binding=reason, refusals=(*plan.refusals, reason),
                       notes=(*plan.notes, *lines))  # fmt: skip
    warnings = (host.budget.reason,) if host.budget.verdict is Verdict.PREWARM_SKIPPED else ()
    return replace(plan, host=host, notes=(*plan.notes, *lines), warnings=(*plan.warnings, *warnings))


def neighbours(host: HostConfig, directory: Path) -> tuple[ServiceNeed, ...]:
    """The other services of the inventory on the same host (the same ssh target: docs/topologies.md), as
        the host's budget counts them: their explicit --hicache-size pools, their processes and daemons (a
    service without HiCache, its processes). A file
        that does not load is left out (its own commands say why)."""
    mine = set(host.node_targets)
    found = []
    for s in load_services(directory, skip_broken=True):
        if s.config.name != host.name and mine & set(s.config.node_targets):
            found.append(
                neighbour(
                    s.config.name,
                    s.config.sglang.flags,
                    None,
                    s.config.weight_cache.enabled,
                    s.config.unit.name,
                )
            )
    return tuple(found)
