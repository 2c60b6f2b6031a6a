"""Plan SGLang's CPU backend (`--device cpu`): the pool is sized from free RAM, which moves between starts.

SGLang 0.5.23 on CPU (srt/utils/common.py): get_available_gpu_memory("cpu") is get_free_cpu_memory()
(psutil.virtual_memory().available, or less under a cgroup memory.max) divided by the NUMA nodes, and the
model runner sizes the pool like on a GPU: rest = avail_before_pool - avail_before_weights * (1 - fraction),
tokens = rest / cell. Free RAM is not a card's fixed capacity: page cache, other processes and the old
server's exit move it from one start to the next, so the RAM-sized pool would move too. The plan therefore
pins the pool with --max-total-tokens (SGLang takes the smaller of the two) and picks a fraction whose
RAM-sized capacity holds that pin even when the next start sees `drift` GiB less free RAM than the last,
and free RAM drops by `drift` again between its "Load weight begin" and its pool sizing (other processes
allocate meanwhile). A larger fraction costs no RAM here: the pin, not the fraction, bounds the pool.
There are no CUDA graphs, no CUDA context or NCCL overhead classes and no graph floor on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from agent.errors import UsageError
from agent.plan.choose import Plan, Target
from agent.plan.facts import PlanInput
from agent.plan.model import StartFigures
from agent.sglang import kvpool
from agent.sglang.kvpool import GIB
from agent.sglang.pools import PoolSizer

# Free RAM the next start may see below the last one's, as a share of it, and at least this much.
DRIFT_SHARE = 0.10
DRIFT_MIN_GIB = 1.0
# Without an earlier start: the server's own processes before "Load weight begin" (1.6 GB RSS measured for
# server, scheduler and detokenizer, ../shared/sglang/REAL-ON-CPU.md), and a wider drift allowance.
PROCESS_GIB = 2.0
COLD_DRIFT_SHARE = 0.25
# RAM left free after the pool at the low end: the CPU forward's activations and request buffers.
RESERVE_GIB = 1.0
MAX_FRACTION = 0.95
MARGIN = 0.02  # the pin above the target context (planning.margin's default)


@dataclass(frozen=True)
class Ram:
    """Free RAM (GiB, per NUMA node as SGLang counts it) before weights and before the pool."""

    pre: float
    post: float
    drift: float
    basis: str  # "calibrated" or "architecture"
    why: str


def is_cpu(inp: PlanInput) -> bool:
    return inp.device == "cpu" or str(inp.flags.get("device") or "").lower() == "cpu"


def ram_of(inp: PlanInput) -> Ram:
    """From the last start's memory lines; else cold from MemAvailable and the weights, when honest."""
    starts = [f for f in inp.starts if _pre(f) and _post(f)]
    if starts:
        pres = [_pre(f) for f in starts]
        pre, post = pres[-1], _post(starts[-1])
        drift = max(DRIFT_SHARE * pre, DRIFT_MIN_GIB, max(pres) - min(pres))
        why = (
            f"free RAM {pre:.2f} GiB before the weights and {post:.2f} GiB before the pool at the last start "
            f"(psutil's available memory); the next start may see {drift:.2f} GiB less"
        )
        return Ram(pre, post, drift, "calibrated", why)
    free = inp.gpus[0].memory_free_mib if inp.gpus else None
    if free is None or inp.model.weights_bytes is None:
        raise UsageError(
            f"cannot plan {inp.name} on CPU without an earlier start: SGLang sizes the pool from the free "
            "RAM it sees when it starts, and the facts give neither a last start nor MemAvailable and the "
            "weights' bytes",
            hint="start it once with --max-total-tokens set, then plan again",
        )
    pre = free / 1024 - PROCESS_GIB
    post = pre - inp.model.weights_bytes / GIB
    drift = max(COLD_DRIFT_SHARE * pre, DRIFT_MIN_GIB)
    why = (
        f"cold: MemAvailable {free / 1024:.2f} GiB now, minus {PROCESS_GIB:.1f} GiB for the server's own "
        f"processes, minus {inp.model.weights_bytes / GIB:.2f} GiB of weights; the start may see "
        f"{drift:.2f} GiB less"
    )
    return Ram(pre, post, drift, "architecture", why)


def plan_cpu(inp: PlanInput, asked: Target, sizer: PoolSizer, notes: tuple[str, ...]) -> Plan:
    """The pool pinned at the target plus the margin (or the running pin, when larger and it still fits),
    held by free RAM at the low end of its drift."""
    ram = ram_of(inp)
    goal = math.ceil(asked.context * (1 + MARGIN))
    running = sizer.max_total_tokens
    if running is not None and running > goal:
        kept = _plan(inp, asked, sizer, ram, running)
        if kept.feasible:  # a larger pool already pinned is kept: fewer tokens would cost concurrency
            return replace(kept, notes=(*kept.notes, *notes))
    plan = _plan(inp, asked, sizer, ram, goal)
    return replace(plan, notes=(*plan.notes, *notes))


def _plan(inp: PlanInput, asked: Target, sizer: PoolSizer, ram: Ram, goal: int) -> Plan:
    open_sizer = replace(sizer, max_total_tokens=None)  # capacity, before the pin
    low_pre, low_post = ram.pre - ram.drift, ram.post - 2 * ram.drift

    def capacity(fraction: float) -> int:
        return open_sizer.tokens(low_post - low_pre * (1 - fraction))

    fraction = asked.fraction if asked.fraction is not None else kvpool.search_fraction(capacity, goal)
    pool_gib = goal * open_sizer.effective_cell() / GIB
    reserve = low_post - pool_gib
    feasible = (
        low_pre > 0
        and fraction is not None
        and fraction <= MAX_FRACTION
        and capacity(fraction) >= goal
        and reserve >= RESERVE_GIB
    )
    chosen = fraction if fraction is not None else MAX_FRACTION
    why_not = [] if feasible else [_why_not(ram, goal, pool_gib, reserve, capacity(chosen))]
    return Plan(
        mem_fraction_static=chosen,
        max_running_requests=_requests(inp, asked),
        context_length=asked.context,
        predicted_pool_tokens=goal if feasible else min(goal, capacity(chosen)),
        target_pool_tokens=math.ceil(asked.context * (1 + MARGIN)),
        predicted_pool_low_tokens=goal if feasible else min(goal, capacity(chosen)),  # low RAM already
        concurrency_at_full_context=min(goal // asked.context, _requests(inp, asked)),  # bounded by the cap
        reserve_gib_per_gpu=reserve,
        reserve_floor_gib=RESERVE_GIB,
        feasible=feasible,
        basis=ram.basis,
        pre_gib=ram.pre,
        post_gib=ram.post,
        cell_bytes=sizer.cell_bytes,
        tokens_per_0_01=kvpool.tokens_per_step(ram.pre, open_sizer.effective_cell()),
        user_fraction=asked.fraction is not None,
        max_total_tokens=goal,
        notes=tuple(_notes(ram, goal, chosen, pool_gib, reserve)),
        warnings=tuple(why_not),
    )


def _notes(ram: Ram, goal: int, fraction: float, pool_gib: float, reserve: float) -> list[str]:
    return [
        "CPU backend (--device cpu): the pool is sized from free RAM, not a card (srt/utils/common.py "
        "get_available_gpu_memory -> get_free_cpu_memory); no CUDA graphs, no GPU overhead classes",
        ram.why,
        f"the pool is pinned with --max-total-tokens {goal:,} ({pool_gib:.2f} GiB of KV): it does not move "
        f"with free RAM; --mem-fraction-static {fraction:.3f} lets SGLang size at least that much at "
        f"{ram.drift:.2f} GiB less free RAM and {ram.drift:.2f} GiB more taken during the start, leaving "
        f"{reserve:.2f} GiB free",
    ]


def _why_not(ram: Ram, goal: int, pool_gib: float, reserve: float, capacity: int) -> str:
    return (
        f"free RAM cannot hold {goal:,} tokens ({pool_gib:.2f} GiB) with {RESERVE_GIB:.1f} GiB to spare at "
        f"{ram.drift:.2f} GiB below the last start's free RAM: {reserve:.2f} GiB would be left, "
        f"and SGLang would size {capacity:,} tokens"
    )


def _requests(inp: PlanInput, asked: Target) -> int:
    """The running request limit is kept: the flag, else what the last start resolved, else SGLang's."""
    if asked.max_running:
        return asked.max_running
    for value in (
        inp.flags.get("max-running-requests"),
        *(f.get("max_running_requests") for f in inp.starts),
    ):
        if value:
            return int(str(value))
    return 2048  # what SGLang 0.5.23 resolved on CPU for the toy model (REAL-ON-CPU.md's scheduler line)


def _pre(figures: StartFigures) -> float:
    return float(figures.get("avail_mem_before_weights_gb") or 0.0)


def _post(figures: StartFigures) -> float:
    return float(figures.get("avail_mem_before_pool_gb") or figures.get("avail_mem_after_weights_gb") or 0.0)
