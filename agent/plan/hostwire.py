"""A plan with its HiCache host side (plan/hostplan.py) folded in: the host pool and the budget when the
flags enable HiCache; a budget that does not fit makes the plan infeasible (apply refuses it before any
restart, naming the service and the `--hicache-size` that fits), a pre-warm that cannot fit is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from agent.inventory import FlagValue, HostConfig, load_services
from agent.plan.choose import Plan
from agent.plan.facts import PlanInput
from agent.plan.hostbudget import ServiceNeed, Verdict
from agent.plan.hostlog import LoggedPool
from agent.plan.hostoffer import largest_fitting_size
from agent.plan.hostplan import HostPlan, enabled, neighbour, plan_host, rank_pool, size_of
from agent.plan.hostpool import GIB, DecodeServer, RankPool, decode_backup_ratio
from agent.plan.hostsaid import given_notes, kept_as_given, needed_size, smaller_than_device
from agent.plan.inputs import draft_model, float_of, int_of, is_on, value_of
from agent.plan.overhead import is_amd
from agent.sglang.kvlayout import read_layout
from agent.sglang.logs.summary import StartFigures
from agent.sglang.pools import PoolSizer


def backup_server(inp: PlanInput, sizer: PoolSizer | None) -> DecodeServer | None:
    """A PD decode without HiCache, as its retraction backup resolves (kv_cache_builder.py:199-241); None
    for any other server, or a decode whose backup is named (host_pool: kept as HiCache's pool is not,
    cpu_tensor / none: no host pool)."""
    flags = inp.flags
    if value_of(flags, "disaggregation-mode") != "decode" or enabled(flags):
        return None
    if value_of(flags, "disaggregation-decode-retraction-backup") is not None:
        return None
    preempts = _on(flags, "enable-priority-scheduling") and not _on(flags, "disable-priority-preemption")
    mla = bool(inp.model.config.integer("kv_lora_rank"))
    return DecodeServer(
        mha=not mla and (sizer is None or sizer.mamba is None),  # a recurrent state: cpu_tensor (line 210)
        rocm=any(is_amd(gpu.name) for gpu in inp.gpus),  # `and not is_hip()`: cpu_tensor on ROCm (line 232)
        dcp=(int_of(flags, "dcp-size", "decode-context-parallel-size") or 1) > 1,
        decode_radix_cache=_on(flags, "disaggregation-decode-enable-radix-cache"),
        decode_offload=_on(flags, "disaggregation-decode-enable-offload-kvcache"),
        priority_preemption=preempts,
    )


def offload_flags(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue] | None:
    """A PD decode's `--disaggregation-decode-enable-offload-kvcache` without HiCache: its own host pool
    (decode_kvcache_offload_manager.py:116, build_kv_host_pool), sized by --hicache-size or the ratio, 2.0
    unless given (kv_cache_builder.py:259-260), built outside the auto size's scope (kv_cache_builder.py:456)
    and checked as an explicit one (pool_host/base.py:98-108, 247-257): the flags that plan it; else None."""
    if value_of(flags, "disaggregation-mode") != "decode" or enabled(flags):
        return None
    if not _on(flags, "disaggregation-decode-enable-offload-kvcache"):
        return None
    explicit = value_of(flags, "hicache-ratio") is not None or size_of(flags) > 0
    return dict(flags) if explicit else {**flags, "hicache-ratio": 2.0}


def _on(flags: Mapping[str, FlagValue], name: str) -> bool:
    return name in flags and is_on(flags, name)


HYBRID = (
    "HiCache with a hybrid model ({kind}): SGLang 0.5.23 adds host pools deployctl does not size "
    "(a host state pool, srt/mem_cache/pool_host/mamba.py:75; the state and sliding-window device pools "
    "counted in its auto size, srt/mem_cache/hicache_auto_size.py:44-52,75): turn HiCache off for it, or "
    "size it by hand (--hicache-size, a MemoryMax= of the unit's own) and start it outside a host plan"
)
DRAFT = (
    "HiCache with a speculative draft model ({algorithm}): SGLang 0.5.23 backs the draft's KV up fused, "
    "packed into the target's host pages or as a sidecar host pool "
    "(srt/speculative/base_spec_worker.py:269-341, counted in its auto size, "
    "srt/mem_cache/hicache_auto_size.py:55-79), which deployctl does not size: turn HiCache off for it, "
    "or the draft"
)
DSA = (
    "HiCache with a DSA model: SGLang 0.5.23 builds an MLA host pool from --hicache-size "
    "(srt/mem_cache/pool_host/mla.py:195-197) and an indexer host pool of the same tokens beside it, "
    "allocated and checked on its own (srt/mem_cache/pool_host/dsa.py:199-243), which deployctl does not "
    "size into the pool or the rendered MemoryMax=: turn HiCache off for it, or size it by hand "
    "(--hicache-size, a MemoryMax= of the unit's own) and start it outside a host plan"
)


def unsized(inp: PlanInput, sizer: PoolSizer | None) -> str | None:
    """The one-line refusal of HiCache whose host pools deployctl does not size: a hybrid model's (state or
    sliding-window pools), a DSA model's indexer pool or a speculative draft's; None when it sizes them."""
    kind = _hybrid(sizer)
    if kind is not None:
        return HYBRID.format(kind=kind)
    if _dsa(inp):
        return DSA
    algorithm = draft_model(inp.flags)
    return None if algorithm is None else DRAFT.format(algorithm=algorithm)


def _hybrid(sizer: PoolSizer | None) -> str | None:
    """The kind of hybrid pool the model's device pool is (a linear-attention state or a sliding window)."""
    if sizer is not None and sizer.mamba is not None:
        return "linear-attention state"
    return "sliding window" if sizer is not None and sizer.swa_ratio is not None else None


def _dsa(inp: PlanInput) -> bool:
    """The model's KV layout is DSA's (an MLA pool with an indexer beside it)."""
    try:
        return read_layout(inp.model.config).family == "dsa"
    except ValueError:  # Unsupported too: the device plan says why
        return False


def with_host_plan(inp: PlanInput, sizer: PoolSizer | None, plan: Plan) -> Plan:
    """The plan with `host` set where HiCache is on (or a PD decode's default retraction backup builds a
    host pool) and its pool is one deployctl follows; else unchanged (with a note saying why the host pool
    is not planned)."""
    server = backup_server(inp, sizer)
    offload = offload_flags(inp.flags)
    if offload is not None:  # planned as a decode's backup pool is: its unit keeps its flags
        inp, server = replace(inp, flags=offload), DecodeServer(mha=True, decode_offload=True)
    elif not enabled(inp.flags) and not (server and server.builds_backup_pool):
        return plan
    refused = unsized(inp, sizer) if enabled(inp.flags) else None
    if refused is not None:
        return replace(plan, feasible=False, binding=refused, refusals=(*plan.refusals, refused))
    pool = _rank_pool(inp, sizer, plan)
    if isinstance(pool, str):
        return replace(plan, notes=(*plan.notes, f"HiCache host pool not planned: {pool}"))
    weights = inp.model.weights_bytes or 0
    backup = None if server is None else _backup_ratio(inp, server, pool, plan.context_length)
    host = plan_host(inp.name, pool, inp.flags, inp.host_memory, inp.neighbours, weights, inp.weight_cache,
                     inp.unit_memory_limit, backup)  # fmt: skip
    tier = "decode KV offload" if offload is not None else None
    host = replace(host, logged=logged_pool(inp.starts), kept=kept_as_given(inp.flags, host), tier=tier)
    tiers, *rest = host.lines(plan.predicted_pool_tokens, plan.context_length)
    # the flags as given, next to the size they became; the offline neighbours counted
    lines = (tiers, *given_notes(inp.flags, host), *rest, *counted_beside(host, inp))
    if host.logged is not None:  # what that start pinned: the plan's evidence, as the device pool's line is
        said = host.logged.line(host.pool, host.bytes_per_token)
        if host.logged.tokens == host.pool.tokens:
            lines = (*lines, said)
        else:
            plan = replace(plan, warnings=(*plan.warnings, said))
    if not host.fits:
        reason = host.budget.reason or lines[0]
        return replace(plan, host=host, feasible=False, binding=reason, refusals=(*plan.refusals, reason),
                       notes=(*plan.notes, *lines))  # fmt: skip
    warnings = (host.budget.reason,) if host.budget.verdict is Verdict.PREWARM_SKIPPED else ()
    small = smaller_than_device(host, _most(inp, host, pool, weights))
    warnings = (*warnings, small) if small else warnings
    return replace(plan, host=host, notes=(*plan.notes, *lines), warnings=(*plan.warnings, *warnings))


def _most(inp: PlanInput, host: HostPlan, pool: RankPool, weights: int) -> int | None:
    """With the host's facts, the largest --hicache-size the plan accepts where the size that would outgrow
    the device pool is refused (planned again, as a refusal's offer is); None: it fits, or is unchecked."""
    if not host.checked or host.backup:
        return None

    def fits(size: int) -> bool:
        flags = {**inp.flags, "hicache-size": size}
        return plan_host(inp.name, pool, flags, inp.host_memory, inp.neighbours, weights, inp.weight_cache,
                         inp.unit_memory_limit).fits  # fmt: skip

    needed = needed_size(host)
    return None if fits(needed) else largest_fitting_size(lambda size: size < needed and fits(size))


def counted_beside(host: HostPlan, inp: PlanInput) -> tuple[str, ...]:
    """Without host facts, the line naming the host's other services the budget's pinned counts (their
    explicit pools and processes), so that figure is not read as all this service pins."""
    if host.checked or not inp.neighbours:
        return ()
    names = ", ".join(n.name for n in inp.neighbours)
    return (
        f"host memory: host_budget.pinned {host.budget.pinned / GIB:.1f} GiB counts the host's other "
        f"services too ({names}: their explicit pools and processes)",
    )


def _rank_pool(inp: PlanInput, sizer: PoolSizer | None, plan: Plan) -> RankPool | str:
    """The rank's device pool the host pool mirrors, or why it is not planned (a decode's backup beside a
    hybrid pool or a draft, a cell that is not whole bytes)."""
    if sizer is None or _hybrid(sizer) is not None:
        return "a hybrid pool (state cache or sliding window)"
    if draft_model(inp.flags) is not None:
        return "a speculative draft's pool"
    pool = rank_pool(plan.predicted_pool_tokens, sizer.cell_bytes, sizer.page_size)
    return "no whole-byte cell or no device pool" if pool is None else pool


def _backup_ratio(inp: PlanInput, server: DecodeServer, pool: RankPool, context: int) -> float:
    """A decode's backup-only ratio (kv_cache_builder.py:248-258), its host-receive threshold as given; a KV
    offload pool's, the ratio its flags give (offload_flags: no retraction minimum, the size wins)."""
    if server.decode_offload:
        return float_of(inp.flags, "hicache-ratio") or 2.0
    threshold = float_of(inp.flags, "disaggregation-decode-host-receive-threshold")
    return decode_backup_ratio(pool, context, receive_threshold=1.0 if threshold is None else threshold)


def logged_pool(starts: Sequence[StartFigures]) -> LoggedPool | None:
    """The host pool the newest start that logged one pinned (its smallest rank's `Allocating kv
    hierarchical KV host pool` line), with its auto-size line's ratios; None where no start logged one."""
    for figures in reversed(starts):
        tokens = figures.get("host_pool_tokens")
        if tokens:
            gb = figures.get("host_pool_gb") or 0.0
            ratios = figures.get("host_pool_requested_ratio"), figures.get("host_pool_auto_ratio")
            return LoggedPool(tokens, gb, *ratios)
    return None


def neighbours(host: HostConfig, directory: Path) -> tuple[ServiceNeed, ...]:
    """The other services of the inventory on the same host (the same ssh target: docs/topologies.md), as
    the host's budget counts them: their explicit --hicache-size pools, their processes and daemons (a
    service without HiCache, its processes); a [pd] service by each of its role units on the host (a
    decode's retraction backup pool among them). A file that does not load is left out (its own commands
    say why)."""
    mine = set(host.node_targets)
    found: list[ServiceNeed] = []
    for s in load_services(directory, skip_broken=True):
        if s.config.name != host.name and mine & set(s.config.node_targets):
            found.extend(_needs_of(s.config, mine))
    return tuple(found)


def _needs_of(other: HostConfig, mine: set[str]) -> list[ServiceNeed]:
    """A neighbour service's needs: one, or one per [pd] role unit on one of `mine`'s targets (each runs as
    an SGLang server of its own, under its own unit, agent/pd/units.py)."""
    if other.pd is None:
        units = [(other.name, other)]
    else:
        from agent.pd.units import pd_units  # the [pd] layer builds on the planner: imported when used

        units = [(f"{other.name} {u.label}", u.host) for u in pd_units(other) if u.target in mine]
    return [neighbour(name, c.sglang.flags, None, c.weight_cache.enabled, c.unit.name) for name, c in units]
