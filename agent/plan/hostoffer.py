"""What a refused host plan offers as its fix, each offer one the planner itself then accepts.

The size: the largest whole-GB `--hicache-size` per rank whose plan is feasible, found by planning again
(feasibility only falls as the size grows: a larger pool never fits where a smaller one did not). SGLang
checks each rank against free memory read afresh, the earlier ranks' pools already pinned
(srt/mem_cache/pool_host/base.py:98-108, 247-257), and the host's other services and their order count
too: planning again keeps every one of those rules in the one place they are written (plan/hostplan.py).

A `MemoryMax=`: only where the unit's own limit binds, the smallest (whole GiB, at most the host's RAM)
under which the plan is feasible; a limit never adds RAM, and a unit's limit cannot raise its slice's,
which the fix then names.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import ParamSpec, Protocol, TypeVar

from agent.errors import UsageError
from agent.inventory import FlagValue
from agent.plan.hostbudget import HostBudget, RamShare, limit_key
from agent.plan.hostpool import GIB
from agent.plan.inputs import float_of
from agent.protocol.answers import HostMemoryData

MAX_GB = 1 << 40  # a bound on the searches: no host has a petabyte of RAM per rank


class Planned(Protocol):
    @property
    def budget(self) -> HostBudget: ...
    @property
    def backup(self) -> bool: ...
    @property
    def fits(self) -> bool: ...


P = ParamSpec("P")
T = TypeVar("T", bound=Planned)


def largest_fitting_size(fits: Callable[[int], bool]) -> int | None:
    """The largest whole number `fits` accepts (it accepts every smaller one), None when 1 is refused."""
    if not fits(1):
        return None
    low, high = 1, 2
    while high <= MAX_GB and fits(high):
        low, high = high, high * 2
    while high - low > 1:  # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def smallest_fitting_limit(fits: Callable[[int], bool], top: int) -> int | None:
    """The smallest whole GiB (bytes) `fits` accepts, up to `top` bytes; None when `top` is refused."""
    if not fits(top):
        return None
    refused = largest_fitting_size(lambda gib: gib * GIB < top and not fits(gib * GIB)) or 0
    return min(top, (refused + 1) * GIB)


# a decode's retraction backup without HiCache: its host pool goes with the backup set to a CPU tensor
NO_BACKUP_POOL = (
    "--disaggregation-decode-retraction-backup cpu_tensor backs retracted requests up without a host pool "
    "(kv_cache_builder.py:197-242)"
)


def offered(  # noqa: PLR0913 - the refusal, the size test, and the fix's words
    budget: HostBudget,
    size_fits: Callable[[int], bool],
    memory_max: int | None = None,
    slice_limit: str | None = None,
    backup: bool = False,
    key: str = "MemoryMax",
    unit_limit: int | None = None,
) -> HostBudget:
    """The refusal `budget` with its fix re-worded: the size `size_fits` accepts last, the slice that binds
    (`slice_limit`: its words), and a `memory_max` (bytes) where one was proved to hold it; `backup`: the
    pool is a decode's retraction backup, not HiCache's (HiCache is off: the backup's own flag drops it);
    `key`: the unit's directive `memory_max` raises (MemoryHigh= binds below MemoryMax=); `unit_limit`: the
    unit's own limit (bytes), named when no size fits under it."""
    size = largest_fitting_size(size_fits)
    if size:
        fix = f"--hicache-size {size} per rank would fit" + (f", or {NO_BACKUP_POOL}" if backup else "")
    elif backup:
        fix = f"no host pool fits: {NO_BACKUP_POOL}"
    elif unit_limit is not None and memory_max is None:
        fix = (f"no host pool fits under the unit's own {key}= ({unit_limit / GIB:.1f} GiB): raise it "
               "with a smaller --hicache-size, or turn HiCache off for it")  # fmt: skip
    else:
        fix = "no host pool fits: turn HiCache off for it"
    if slice_limit:
        fix += f" ({slice_limit} binds: a unit's MemoryMax= cannot raise it)"
    if memory_max is not None:  # under MemoryHigh= the smaller of the two binds: both must hold it
        which = "MemoryHigh= (and a MemoryMax= no lower)" if key == "MemoryHigh" else "MemoryMax="
        fix += f", or a {which} of at least {memory_max / GIB:.1f} GiB holds this one"
    reason = f"{budget.over}: {budget.why}; {fix}"
    return replace(budget, fitting_size_gb=None if size is None else float(size), reason=reason)


def binding_slice(data: HostMemoryData | None) -> str | None:
    """The slice above the unit whose memory limit leaves less room than the host's free memory (then
    SGLang's bound, srt/mem_cache/host_memory.py:83-125), in words; None where the host's RAM binds."""
    levels = data["cgroup"] if data is not None else []
    old = max(0, levels[0]["current"] - levels[0]["file"]) if levels else 0
    above = levels[1:] if levels and levels[0]["path"].endswith(".service") else levels
    rooms = [
        (limit - max(0, lv["current"] - lv["file"]) + old, lv["path"], limit)
        for lv in above
        for limit in (lv["max"], lv["high"])
        if limit is not None
    ]
    if data is None or not rooms or min(rooms)[0] >= data["available"] + old:
        return None
    _, path, limit = min(rooms)
    return f"the slice {path}'s memory limit ({limit / GIB:.1f} GiB)"


def offers_fix(plan_host: Callable[P, T]) -> Callable[P, T]:
    """plan_host whose refusal of the service's own pool offers a fix it re-planned (a neighbour's refusal
    keeps its words; a decode's backup pool is sized by an explicit --hicache-size too, base.py:221-224);
    a ratio too large to count is refused in one line."""
    signature = inspect.signature(plan_host)

    @functools.wraps(plan_host)
    def planned(*args: P.args, **kwargs: P.kwargs) -> T:
        asked = signature.bind(*args, **kwargs)
        asked.apply_defaults()
        given = dict(asked.arguments)

        def again(flags: Mapping[str, FlagValue], limit: int | RamShare | None) -> T:
            return plan_host(**{**given, "flags": flags, "unit_limit": limit})  # type: ignore[call-arg]

        flags: Mapping[str, FlagValue] = given["flags"]
        try:
            plan = again(flags, given["unit_limit"])
        except OverflowError as e:
            raise UsageError(f"flags: {e}") from None
        if plan.budget.fits or plan.budget.over != given["name"]:
            return plan
        budget = _fix(plan.budget, flags, given["data"], given["unit_limit"], again, plan.backup)
        return replace(plan, budget=budget)  # type: ignore[type-var]

    return planned


def _fix(  # noqa: PLR0913 - the refusal, the flags, the host, the limit, the planner, the pool's kind
    budget: HostBudget,
    flags: Mapping[str, FlagValue],
    data: HostMemoryData | None,
    limit: int | RamShare | None,
    again: Callable[[Mapping[str, FlagValue], int | None], Planned],
    backup: bool = False,
) -> HostBudget:
    """The refusal's fix: the size, the slice that binds, and the unit's own limit raised where it binds."""
    key = limit_key(limit)
    if isinstance(limit, RamShare):
        limit = None if data is None else limit.of(data["total"])
    raised = None
    if limit is not None:
        top, low = MAX_GB * GIB if data is None else data["total"], limit
        raised = smallest_fitting_limit(lambda b: b > low and again(flags, b).fits, top)

    asked = float_of(flags, "hicache-size") or math.inf  # refused: no larger size is offered for it

    def fits(size: int) -> bool:
        return size < asked and again({**flags, "hicache-size": size}, limit).fits

    return offered(budget, fits, raised, binding_slice(data), backup, key, limit)
