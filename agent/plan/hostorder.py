"""The order of a host's starts, which systemd does not fix (Restart=, a boot, another service's apply): the
neighbours still to pin, the host once they have, and the refusal of a host pool that passes SGLang's own
check (pool_host/base.py:104-108, 248-257) in one start order but not in another, this service's own or a
neighbour's explicit --hicache-size at its next start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from agent.plan.hostbudget import HostBudget, ServiceNeed, Verdict
from agent.plan.hostpool import RESERVE_BYTES, HostMemory, Mode
from agent.protocol.answers import HostMemoryData
from agent.sglang import weight_cache as wc


def held_now(n: ServiceNeed, data: HostMemoryData | None) -> int:
    """What the facts say a neighbour's unit and its weight-cache daemon hold now (0: stopped, or unsaid)."""
    now: Mapping[str, int] = (data.get("siblings") if data is not None else None) or {}
    units = (n.unit, wc.daemon_unit_name(n.unit)) if n.unit else ()
    return sum(now.get(u, 0) for u in units)


def mid_start(n: ServiceNeed, data: HostMemoryData | None) -> bool:
    """A neighbour caught loading: it pins a host pool, and its unit holds something but no more than its
    processes (and its daemon) are estimated at: its pool is not pinned yet (SGLang pins it after the
    weights, pool_host/base.py:247-281), so it is still to pin, not running. A unit of Type=simple is
    `active` while it loads: its memory, not its state, tells."""
    held = held_now(n, data)
    return n.pins_pool and 0 < held <= n.process_bytes + n.daemon_bytes


def waiting(neighbours: Sequence[ServiceNeed], data: HostMemoryData | None) -> tuple[ServiceNeed, ...]:
    """The neighbours still to pin: those that hold nothing now (the facts name their unit as holding
    nothing, or not at all), they start after this one, and those caught mid-start. None from facts that do
    not say what neighbours hold (an older agent)."""
    now = None if data is None else data.get("siblings")
    if now is None:
        return ()
    return tuple(n for n in neighbours if not now.get(n.unit, 0) or mid_start(n, data))


def after_later(seen: HostMemory, later: Sequence[ServiceNeed], data: HostMemoryData | None) -> HostMemory:
    """The host once the neighbours still to start have pinned (systemd does not order them), slices too."""
    held = sum(max(0, _still(n) - held_now(n, data)) for n in later)
    above = tuple(lv if i == 0 else replace(lv, usage=lv.usage + held) for i, lv in enumerate(seen.cgroup))
    return HostMemory(max(0, seen.available - held), above)


def _still(n: ServiceNeed) -> int:
    """What a neighbour still to start takes: all it pins (an unsized pool is shared out by the auto rule)."""
    return n.pinned if n.host_pool is not None else n.process_bytes + n.daemon_bytes


def fits_last(seen: HostMemory, pools: int, ranks: int, pool_bytes: int) -> int | None:
    """None where the last of `pools` pools of `pool_bytes` passes SGLang's check (pool_host/base.py:104-108,
    248-257), else the bytes per rank it finds."""
    # the last rank sees the other pools as used (hostplan.last_rank_sees): each bound less by as much
    room = (max(0, seen.usable - (pools - 1) * pool_bytes) - RESERVE_BYTES) // max(ranks, 1)
    return None if room >= pool_bytes else max(0, room)


def pinning(seen: HostMemory, held: int) -> HostMemory:
    """The host with `held` more bytes pinned (less where negative), the slices above the unit too."""
    above = tuple(lv if i == 0 else replace(lv, usage=lv.usage + held) for i, lv in enumerate(seen.cgroup))
    return HostMemory(max(0, seen.available - held), above)


def refused_order(budget: HostBudget, name: str, why: str) -> HostBudget:
    """The budget refused at `name` for a start order it does not survive (offers_fix offers the size)."""
    return replace(budget, verdict=Verdict.REFUSED, over=name, reason=f"{name}: {why}", why=why)


def in_any_order(
    budget: HostBudget,
    need: ServiceNeed,
    start: HostMemory,
    later: Sequence[ServiceNeed],
    data: HostMemoryData | None,
) -> HostBudget | None:
    """The budget refused where this service's size, which fits the host now, fails SGLang's check once the
    neighbours still to start have pinned (a restart of this one after theirs); None where it holds."""
    pool = need.host_pool
    if not later or pool is None:
        return None
    room = fits_last(after_later(start, later, data), need.ranks, need.sglang_ranks or need.ranks, pool.bytes)
    if room is None:
        return None
    names = ", ".join(n.name for n in later)
    why = (
        f"its {pool.bytes / 1e9:.2f} GB host pool per rank fits the host now, not once {names} (still to "
        f"start: systemd does not order them) has pinned: its last rank then finds {room / 1e9:.2f} GB, and "
        "SGLang refuses it at that start (pool_host/base.py:104-108, 248-257)"
    )
    return refused_order(budget, need.name, why)


def beside(
    budget: HostBudget,
    need: ServiceNeed,
    neighbours: Sequence[ServiceNeed],
    data: HostMemoryData,
    ours: HostMemory,
) -> HostBudget:
    """The budget refused where this service's pools leave a neighbour's explicit --hicache-size failing
    SGLang's own check at that neighbour's next start (a restart, a boot, its own apply, this one running):
    the host with this one (`ours`: as its start sees it) and every other neighbour pinned, that neighbour's
    own unit freed. One that fails beside this one's processes alone is its own plan's to refuse (no size of
    this one helps)."""
    later = waiting(neighbours, data)
    for n in neighbours:
        if n.host_pool is None or n.host_pool.mode is not Mode.SIZE:
            continue
        others = after_later(ours, [m for m in later if m is not n], data)
        seen = pinning(others, n.process_bytes + n.daemon_bytes - held_now(n, data))
        pools, ranks, size = n.ranks, n.sglang_ranks or n.ranks, n.host_pool.bytes
        room = fits_last(pinning(seen, need.pool_bytes), pools, ranks, size)
        if room is not None and fits_last(seen, pools, ranks, size) is None:
            why = (
                f"its pools leave {n.name} ({n.host_pool.bytes / 1e9:.0f} GB host pool x {n.ranks} rank(s)) "
                f"{room / 1e9:.2f} GB per rank at its next start (a restart, a boot, its own apply: systemd "
                "does not order them), and SGLang refuses it (pool_host/base.py:104-108, 248-257)"
            )
            return refused_order(budget, need.name, why)
    return budget
