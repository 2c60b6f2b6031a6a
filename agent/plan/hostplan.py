"""The host side of a HiCache plan: each rank's host pool (plan/hostpool.py, SGLang 0.5.23's own rule), the
`--hicache-size` and `MemoryMax=` the unit gets, and the budget of the whole host (plan/hostbudget.py).

The flags as given (a ratio, the auto fraction, or a size) are sized first, against the host's memory as
the facts read it (host/hostmem.py) with this service's own processes replaced; the pool they give is then
rendered as an explicit `--hicache-size` per rank (whole GB, floored: SGLang's flag is an int), so the host
pool no longer moves with the device pool or the free memory of the moment, and the plan below is the
size's own pool, padding page included, which the gate checks SGLang's `Allocating ... host pool` line
against to the token.

`MemoryMax=` holds the service's processes (an estimate, below), the weights it offloads to host RAM
(`--cpu-offload-gb`), its pools and SGLang's 10 GiB reserve, plus
one pool per rank beyond the first: the ranks of a service check the cgroup's headroom one by one as they
pin, and a rank that checks after another pinned sees that pool as used (sglang#38156).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.errors import UsageError
from agent.inventory import FlagValue
from agent.plan.hostbudget import HostBudget, HostRam, RamShare, ServiceNeed, Verdict, plan_budget
from agent.plan.hostlog import LoggedPool
from agent.plan.hostoffer import offers_fix
from agent.plan.hostorder import after_later, beside, held_now, in_any_order, mid_start, waiting
from agent.plan.hostpool import (
    AUTO_SLACK,
    GIB,
    RESERVE_BYTES,
    CgroupLevel,
    HiCacheFlags,
    HostMemory,
    HostPool,
    Mode,
    RankPool,
    allowance,
    floor_gb,
    plan_host_pool,
    ranks_per_host,
)
from agent.plan.inputs import float_of, int_of, is_on, value_of
from agent.plan.unitlimit import sets_memory_max as sets_memory_max  # re-exported
from agent.plan.unitlimit import unit_memory_limit as unit_memory_limit  # re-exported
from agent.protocol.answers import CgroupLevelData, HostMemoryData
from agent.sglang import weight_cache as wc

# What SGLang's processes hold in host RAM besides the host pools: per rank a scheduler (torch, CUDA
# context, pinned staging), and the tokenizer and detokenizer once. An estimate, stated: MemoryMax= and the
# budget count it.
PROCESS_PER_RANK = 4 * GIB
PROCESS_BASE = 2 * GIB
POOL_PAD = 256 * 2**20  # the padding page a pool adds beyond its size (page x bytes per token), bounded
MIB = 2**20
# SGLang 0.5.23's weight-cache daemon holds the weights in GPU memory, not host RAM: the model is loaded onto
# the GPU and every tensor exported as a CUDA IPC handle (srt/weight_cache/daemon.py:146-147, the weights
# measured as GPU memory reserved, daemon.py:358,392; transport.py: torch_ipc, the vmm_fd backend never
# exports, transport.py:139-163), and no shared memory is made. The checkpoint it reads goes through the
# page cache (safetensors mmap, srt/model_loader/weight_utils.py:1146-1182): reclaimable, not pinned. Its
# host side is its processes: the standalone launcher and one spawned interpreter per local PP x TP rank
# (daemon.py:681-695, 765-790), each with torch and a CUDA context. An estimate, stated, as the engine's.
DAEMON_BASE = 1 * GIB
DAEMON_PER_RANK = 2 * GIB
UNLIMITED = 1 << 62  # no facts: the host's memory is not checked, the pool is sized from the flags alone


def enabled(flags: Mapping[str, FlagValue]) -> bool:
    """The flags turn HiCache on (`--enable-hierarchical-cache`, or its alias `--enable-hicache`)."""
    return any(
        name in flags and is_on(flags, name) for name in ("enable-hierarchical-cache", "enable-hicache")
    )


def hicache_flags(flags: Mapping[str, FlagValue]) -> HiCacheFlags:
    """The HiCache sizing flags as given (srt/arg_groups/fields/memory.py); bad values refused in one line."""
    fraction = float_of(flags, "hicache-host-memory-fraction")
    mode = str(value_of(flags, "hicache-host-memory-mode") or "cache")
    try:
        return HiCacheFlags(
            ratio=float_of(flags, "hicache-ratio"),
            size_gb=float(size_of(flags)),
            fraction=0.8 if fraction is None else fraction,
            # a decode server leaves the ratio to kv_cache_builder.py:245-258, which sets 2.0 with HiCache on
            # whatever the memory mode (hicache_hook.py:118-121 skips decode)
            buffer_only=mode == "buffer_only" and value_of(flags, "disaggregation-mode") != "decode",
        )
    except ValueError as e:
        raise UsageError(f"flags: {e}") from None


def size_of(flags: Mapping[str, FlagValue]) -> int:
    """--hicache-size as SGLang's parser reads it, an int (srt/arg_groups/fields/memory.py:113-116; 0: not
    given): a fraction, nan or inf, which its argparse refuses at every start, refused in one line."""
    return int_of(flags, "hicache-size") or 0


def process_bytes(ranks: int) -> int:
    return PROCESS_BASE + PROCESS_PER_RANK * ranks


def offload_bytes(flags: Mapping[str, FlagValue]) -> int:
    """The weights `--cpu-offload-gb` keeps in host RAM: up to that many GiB per rank (OffloaderV1's
    cpu_offload_max_bytes, srt/utils/offloader.py:69-71), every rank of every replica, loaded before any
    host pool is sized (counted in MemoryMax=, the pool's headroom and the budget)."""
    gib = float_of(flags, "cpu-offload-gb") or 0.0
    return int(gib * GIB) * pools_of(flags) if gib > 0 else 0


def engine_bytes(flags: Mapping[str, FlagValue]) -> int:
    """What the service's processes hold besides its host pools: the estimate, and offloaded weights."""
    return process_bytes(pools_of(flags)) + offload_bytes(flags)


def daemon_bytes(ranks: int, runs_daemon: bool) -> int:
    """The host RAM of a service's weight-cache daemon (its unit runs one launcher and a process per local
    rank); 0 without one."""
    return DAEMON_BASE + DAEMON_PER_RANK * ranks if runs_daemon else 0


def runs_daemon(flags: Mapping[str, FlagValue], weight_cache: bool = False) -> bool:
    """The service's engine maps a daemon's weights: [weight_cache] enabled, or a unit already in
    `--weight-cache-mode client` (a facts file's flags)."""
    return weight_cache or value_of(flags, "weight-cache-mode") == "client"


def memory_max_of(flags: Mapping[str, FlagValue]) -> int | None:
    """The MemoryMax= (bytes, whole MiB) of a unit whose flags enable HiCache with an explicit size: the
    processes, SGLang's 10 GiB reserve, and pools + ranks - 1 pools (each at most size + one padding page;
    2 x ranks - 1 without data parallelism), so that the last rank to check the cgroup still finds its pool's
    room (pool_host/base.py:248-257)."""
    size = size_of(flags)
    if not enabled(flags) or size <= 0:
        return None
    ranks, pools = ranks_of(flags), pools_of(flags)
    need = engine_bytes(flags) + RESERVE_BYTES + (math.ceil(size * 1e9) + POOL_PAD) * (pools + ranks - 1)
    return math.ceil(need / MIB) * MIB


def resolve_limit(limit: int | RamShare | None, data: HostMemoryData | None) -> int | None:
    """The unit's own limit in bytes: a percentage of MemTotal (None without facts: unchecked)."""
    if isinstance(limit, RamShare):
        return None if data is None else limit.of(data["total"])
    return limit


def memory_at_start(
    data: HostMemoryData | None, ranks: int, memory_max: int | None = None, offload: int = 0
) -> HostMemory:
    """The host as the service's new start sees it when it sizes the pool: what the running service holds
    (its cgroup's usage less page cache) is freed, its new processes hold process_bytes; the unit's own
    level takes `memory_max` (the unit's own limit, or the MemoryMax= rendered now) and its memory.high:
    the running unit's memory.max is the MemoryMax= the last apply rendered, which the new unit replaces
    (kept, an auto pool re-planned under it would shrink on every apply); `offload`: the weights its ranks
    keep in host RAM (offload_bytes), held before the pools are sized."""
    new = process_bytes(ranks) + offload
    if data is None:  # no facts: the host unchecked, the unit's own limit still SGLang's bound
        return HostMemory(UNLIMITED, () if memory_max is None else (CgroupLevel((memory_max,), new, 0),))
    levels = data["cgroup"]
    old = own_held(levels)
    cgroup = []
    for i, lv in enumerate(levels):
        limits = [v for v in (lv["max"], lv["high"]) if v is not None]
        if i == 0 and lv["path"].endswith(".service"):  # the unit's own level: the new unit's limit
            # and its memory.high, which deployctl never renders: the unit's own line or a drop-in
            # (`systemctl set-property`, under system.control, outranks the unit file) survives the restart
            limits = [v for v in (memory_max, lv["high"]) if v is not None]
        usage = max(0, lv["current"] - old) + new
        cgroup.append(CgroupLevel(tuple(limits), usage, lv["file"]))
    if not old_unit(levels) and memory_max is not None:  # not running: its slices only, then its own level
        cgroup.insert(0, CgroupLevel((memory_max,), new, 0))
    return HostMemory(max(0, data["available"] + old - new), tuple(cgroup))


def old_unit(levels: Sequence[CgroupLevelData]) -> bool:
    """The facts read the unit's own cgroup (it runs); else only the slice it will start in, if any."""
    return bool(levels) and levels[0]["path"].endswith(".service")


def own_held(levels: Sequence[CgroupLevelData]) -> int:
    """What the running unit holds now (usage less page cache), given back when it is replaced."""
    return max(0, levels[0]["current"] - levels[0]["file"]) if old_unit(levels) else 0


def own_daemon_held(data: HostMemoryData | None) -> int:
    """What the service's own running weight-cache daemon holds now (the facts' siblings, by the engine
    unit's name from its cgroup; 0 when the engine does not run: then it is not known, and counted anew)."""
    levels = data["cgroup"] if data is not None else []
    unit = levels[0]["path"].rpartition("/")[2] if levels else ""
    now: Mapping[str, int] = (data.get("siblings") if data is not None else None) or {}
    return now.get(wc.daemon_unit_name(unit), 0) if unit.endswith(".service") else 0


def host_ram(data: HostMemoryData | None, daemon_counted: bool = False) -> HostRam:
    """The host with this service stopped: its usage (less page cache) back in MemAvailable, and its own
    weight-cache daemon's when the budget counts the daemon anew (it runs across an engine restart, its
    memory already out of MemAvailable); huge pages reserved by the kernel are not RAM a pool can take."""
    if data is None:
        return HostRam(UNLIMITED, UNLIMITED)
    levels = data["cgroup"]
    old = own_held(levels)
    old += own_daemon_held(data) if daemon_counted else 0
    total = data["total"] - data["hugepages_total"]
    return HostRam(total, min(total, data["available"] + old), slice_room(levels, old))


def slice_room(levels: Sequence[CgroupLevelData], old: int) -> int | None:
    """The room of the slices above the unit (their memory.max / memory.high: system.slice, a Slice= of its
    own, a template's system-x.slice), as SGLang counts a level's use (usage less page cache,
    host_memory.py:98-125), with what this service holds now given back; None: no slice limit."""
    above = levels[1:] if levels and levels[0]["path"].endswith(".service") else levels
    room = [
        limit - max(0, lv["current"] - lv["file"]) + old
        for lv in above
        for limit in (lv["max"], lv["high"])
        if limit is not None
    ]
    return max(0, min(room)) if room else None


def as_running(neighbours: Sequence[ServiceNeed], data: HostMemoryData | None) -> tuple[ServiceNeed, ...]:
    """The neighbours as the budget counts them: at least what each holds now (a HiCache pool its
    inventory does not size is in what it holds)."""
    return tuple(
        replace(n, process_bytes=n.process_bytes + held_now(n, data) - n.pinned)
        if held_now(n, data) > n.pinned
        else n
        for n in neighbours
    )


def with_neighbours_stopped(
    host: HostRam, neighbours: Sequence[ServiceNeed], data: HostMemoryData | None
) -> HostRam:
    """The host with its other services stopped too: the budget counts what they pin, which MemAvailable
    lacks while they run, so what they hold now is given back (bounded by MemTotal) rather than counted
    twice; a neighbour stopped holds nothing."""
    held = sum(held_now(n, data) for n in neighbours)
    # the facts' siblings are the services of the unit's top slice: what they hold is in its usage too
    limit = None if host.cgroup_limit is None else host.cgroup_limit + held
    return HostRam(host.total, min(host.total, host.available + held), limit)


@dataclass(frozen=True)
class HostPlan:
    """One service's host side: its pool per rank as rendered, and the host's budget."""

    ranks: int  # ranks on this host, each with one host pool (every data-parallel replica's)
    device_tokens: int  # the device pool per rank the host pool mirrors (ratio and auto modes)
    bytes_per_token: int
    page_size: int
    given: HostPool  # what the flags as given make SGLang build (or refuse)
    pool: HostPool  # what the rendered --hicache-size builds: the plan the gate checks
    size_gb: float | None  # the --hicache-size rendered; None when nothing fits
    memory_max: int | None  # the MemoryMax= rendered, bytes
    budget: HostBudget
    checked: bool  # the host's memory was read (facts); False: the sizes are unchecked against the host
    daemon_bytes: int = 0  # its weight-cache daemon's processes, counted in the budget (in their own unit)
    # the rendered size was cut to (free - 10 GiB) / (2 x ranks - 1): SGLang checks an explicit size rank by
    # rank against free memory read afresh, where its auto mode booked every rank against one snapshot
    last_rank_cap: int = 0  # the pools + ranks - 1 the size was divided by; 0: not cut
    unit_limit: int | None = None  # the unit's own MemoryMax= (bytes) the pool was sized under, if any
    backup: bool = False  # a PD decode's default retraction backup (no HiCache), SGLang's auto size kept
    logged: LoggedPool | None = None  # the host pool a start's log says it pinned (plan --from-log, history)
    kept: str | None = None  # a decode backup's explicit ratio or size (its unit keeps it), as the text says
    tier: str | None = None  # the host pool's own name where it is neither HiCache's nor a retraction backup

    @property
    def fits(self) -> bool:
        return self.budget.fits and self.pool.fits

    def flags(self) -> dict[str, FlagValue]:
        """The unit's HiCache sizing: an explicit size per rank, no ratio or fraction (the size wins)."""
        if self.size_gb is None:
            return {}
        # False leaves a flag out of the unit (sglang/flags.py): the size alone says the pool
        return {
            "hicache-size": int(self.size_gb),
            "hicache-ratio": False,
            "hicache-host-memory-fraction": False,
        }

    def to_dict(self) -> dict[str, object]:
        pool = {
            "tokens": self.pool.tokens,
            "gb": round(self.pool.gb, 2),
            "bytes": self.pool.bytes,
            "ranks": self.ranks,
            "bytes_per_token": self.bytes_per_token,
            "hicache_size_gb": self.size_gb,
            "as_given": {
                "mode": self.given.mode.value,
                "tokens": self.given.tokens,
                "gb": round(self.given.gb, 2),
            },
            "memory_max": self.memory_max,
            "checked": self.checked,
            "sized_for_last_rank": bool(self.last_rank_cap),
            "unit_memory_max": self.unit_limit,
            "backup": ("decode-offload" if self.tier else "decode-retraction") if self.backup else None,
            "logged": None if self.logged is None else self.logged.to_dict(),
        }
        budget = {
            "verdict": self.budget.verdict.value,
            "capacity": self.budget.capacity if self.checked else None,
            "pinned": self.budget.pinned,
            "weight_cache_daemon": self.daemon_bytes,
            "page_cache": self.budget.page_cache,
            "over": self.budget.over,
            "fitting_size_gb": self.budget.fitting_size_gb,
            "prewarm_skipped": list(self.budget.prewarm_skipped),
            "reason": self.budget.reason,
        }
        return {"host_pool": pool, "host_budget": budget}

    def lines(self, device_tokens: int, context: int) -> list[str]:
        """What the device and host tiers hold against the target context, and the budget's verdict."""
        held = device_tokens + self.pool.tokens
        tier = self.tier or ("decode retraction backup" if self.backup else "HiCache")
        auto = self.given.mode is Mode.AUTO and (self.backup or not self.checked)
        kept = "SGLang's auto size, at most" if auto else self.kept or "under 1 GB: the flags as given"
        how = f"--hicache-size {self.size_gb:g} GB" if self.size_gb is not None else kept
        out = [
            f"{tier}: device pool {device_tokens:,} + host pool {self.pool.tokens:,} tokens per rank "
            f"({how} x {self.ranks} rank(s), {self.pool.gb * self.ranks:.1f} GB) "
            f"= {held:,} tokens, {held / max(context, 1):.1f}x the {context:,}-token context"
            if self.pool.fits
            else f"{tier}: no host pool fits ({self.pool.message()})"
        ]
        if self.last_rank_cap:
            out.append(
                f"HiCache: --hicache-size cut to {self.size_gb:g} GB per rank, (free - 10 GiB) / "
                f"{self.last_rank_cap}: SGLang checks an explicit size rank by rank against free memory read "
                "afresh, the last rank seeing the others' pools as used (pool_host/base.py:248-257)"
            )
        out.append(self._memory_line())
        return out

    def _memory_line(self) -> str:
        """The budget's verdict, or what was checked without host facts."""
        reason = f": {self.budget.reason}" if self.budget.reason else ""
        if self.checked:
            daemon = (
                f", its weight-cache daemon {self.daemon_bytes / GIB:.0f} GiB" if self.daemon_bytes else ""
            )
            return (
                f"host memory: {self.budget.pinned / GIB:.1f} GiB pinned{daemon} of "
                f"{self.budget.capacity / GIB:.1f} GiB ({self.budget.verdict.value})" + reason
            )
        if self.unit_limit is not None:
            key = getattr(self.unit_limit, "key", "MemoryMax")
            return (
                f"host memory: the pool checked under the unit's own {key}={self.unit_limit / GIB:.1f}G "
                "as SGLang checks it; the host's RAM and its other services unchecked (no host facts)"
                + reason
            )
        return "host memory: not read (no facts): the host pool is sized from the flags, unchecked"


def rank_pool(device_tokens: int, bytes_per_token: float, page_size: int) -> RankPool | None:
    """The rank's pool for a host pool of the same layout; None for a cell that is not whole bytes (a
    blended or measured cell: its host pool is not planned here)."""
    if device_tokens <= 0 or bytes_per_token <= 0 or not float(bytes_per_token).is_integer():
        return None
    return RankPool(device_tokens, int(bytes_per_token), max(1, page_size))


def ranks_of(flags: Mapping[str, FlagValue]) -> int:
    """SGLang's ranks on one host: TP x PP over the nodes (pool_host/base.py:68-81)."""
    tp = int_of(flags, "tp-size", "tp", "tensor-parallel-size") or 1
    pp = int_of(flags, "pp-size", "pp", "pipeline-parallel-size") or 1
    return ranks_per_host(tp * pp, int_of(flags, "nnodes") or 1)


def pools_of(flags: Mapping[str, FlagValue]) -> int:
    """The host pools the service pins on one host: one per rank of every data-parallel replica. `--dp-size`
    without attention DP launches dp TP groups (srt/managers/data_parallel_controller.py
    launch_dp_schedulers), each rank pinning a pool sized by SGLang's divisor (ranks_of, unchanged); with
    `--enable-dp-attention` the DP ranks are the TP ranks."""
    dp = int_of(flags, "dp-size", "dp", "data-parallel-size") or 1
    if "enable-dp-attention" in flags and is_on(flags, "enable-dp-attention"):
        dp = 1
    tp = int_of(flags, "tp-size", "tp", "tensor-parallel-size") or 1
    pp = int_of(flags, "pp-size", "pp", "pipeline-parallel-size") or 1
    return max(ranks_of(flags), ranks_per_host(dp * tp * pp, int_of(flags, "nnodes") or 1))


def last_rank_sees(seen: HostMemory, ranks: int, pool_bytes: int) -> HostMemory:
    """The host as the last of the service's ranks to pin sees it: an explicit size (and a ratio) is checked
    per rank against free memory read afresh (pool_host/base.py:248-257 via host_memory_budget_bytes,
    base.py:98-108), so the others' pools are used by then (sglang#38156). Only the auto mode books every
    rank against one snapshot (host_memory_budget_scope, hicache_auto_size.py:124-125)."""
    used = (ranks - 1) * pool_bytes
    levels = tuple(CgroupLevel(lv.limits, lv.usage + used, lv.page_cache) for lv in seen.cgroup)
    return HostMemory(max(0, seen.available - used), levels)


def last_rank_size(pool: RankPool, seen: HostMemory, ranks: int, pools: int) -> float:
    """The largest whole-GB --hicache-size whose pool, padding page included, passes SGLang's check at every
    rank: the last sees (free - k pools - 10 GiB) // ranks with k = pools - 1, so a pool of at most
    (free - 10 GiB) / (pools + ranks - 1) (2 x ranks - 1 without data parallelism)."""
    room = (seen.usable - RESERVE_BYTES) // (pools + ranks - 1) - pool.page_size * pool.bytes_per_token
    return floor_gb(max(0, room))


def at_most_pinned(n: ServiceNeed, data: HostMemoryData | None) -> ServiceNeed:
    """A neighbour caught mid-start whose pool its inventory does not size (auto, a ratio, a decode's
    backup) with the most SGLang lets it pin on the host as it is now: per rank its allowance
    ((MemAvailable - 10 GiB) // its ranks, base.py:104-108), x the fraction x 0.95 in auto mode
    (hicache_auto_size.py:94-97), plus the padding page; a pool over the allowance SGLang refuses."""
    if n.host_pool is not None or not mid_start(n, data) or data is None:
        return n
    room = allowance(HostMemory(data["available"]), n.sglang_ranks or n.ranks)
    per_rank = int(room * n.auto_fraction * (1 - AUTO_SLACK)) if n.auto_fraction else room
    pool = HostPool(Mode.AUTO if n.auto_fraction else Mode.RATIO, 0, max(0, per_rank) + POOL_PAD, room)
    return replace(n, host_pool=pool)


def shared(  # noqa: PLR0913 - the rank's pool, the flags, what they give, the host, the ranks, the others
    pool: RankPool,
    flags: Mapping[str, FlagValue],
    given: HostPool,
    seen: HostMemory,
    ranks: int,
    later: Sequence[ServiceNeed],
    data: HostMemoryData | None = None,
    decode_backup: float | None = None,
) -> HostPool:
    """SGLang's auto size takes 0.8 of what the process sees, split by its own ranks (hicache_auto_size.py),
    leaving a second one nothing: with some still to start, sized for all their ranks over what they leave."""
    if given.mode is not Mode.AUTO or not later:
        return given
    everyone = ranks + sum(n.ranks for n in later if n.host_pool is None and n.pins_pool)
    left = after_later(seen, later, data)
    return plan_host_pool(pool, hicache_flags(flags), left, everyone, decode_backup=decode_backup)


def rendered_size(
    pool: RankPool, flags: Mapping[str, FlagValue], share: HostPool, seen: HostMemory
) -> tuple[float | None, int]:
    """The --hicache-size the unit gets (None: the flags as given stay; a pool under 1 GB has no whole-GB
    size), and the pools it was divided by for the last rank to pin (0: not cut): a size rendered in place
    of the auto mode (which books every rank against one snapshot) is checked by SGLang rank by rank, each
    reading free memory afresh, so it is kept at most (free - 10 GiB) / (pools + ranks - 1)."""
    explicit = size_of(flags)
    size = explicit if explicit > 0 else floor_gb(share.bytes) if share.fits else None
    ranks, pools = ranks_of(flags), pools_of(flags)
    capped = 0
    if explicit <= 0 and size is not None and pools > 1:
        cap = last_rank_size(pool, seen, ranks, pools)
        size, capped = (cap, pools + ranks - 1) if cap < size else (size, 0)
    return (size if size is not None and size >= 1 else None), capped


def size_pool(pool: RankPool, size: float | HiCacheFlags, start: HostMemory, ranks: int, pools: int,  # noqa: PLR0913
              backup: float | None = None) -> HostPool:  # fmt: skip
    """The pool an explicit size (or a decode's flags as given, its size or ratio) builds, checked as SGLang
    checks it: by the first rank, then by the last to pin, which sees the others' pools as used."""
    sizing = size if isinstance(size, HiCacheFlags) else HiCacheFlags(size_gb=size)
    planned = plan_host_pool(pool, sizing, start, ranks, decode_backup=backup)
    if planned.fits and pools > 1:
        last = last_rank_sees(start, pools, planned.bytes)
        planned = plan_host_pool(pool, sizing, last, ranks, decode_backup=backup)
    return planned


@offers_fix
def plan_host(  # noqa: PLR0913 - the service's pool, flags, host and neighbours
    name: str,
    pool: RankPool,
    flags: Mapping[str, FlagValue],
    data: HostMemoryData | None,
    neighbours: Sequence[ServiceNeed] = (),
    checkpoint_bytes: int = 0,
    weight_cache: bool = False,
    unit_limit: int | RamShare | None = None,
    decode_backup: float | None = None,
) -> HostPlan:
    """The service's host plan; the budget counts the neighbours (services of the same host) before it.
    `unit_limit`: a MemoryMax=/MemoryHigh= the unit's own lines set (unit_memory_limit), which systemd
    applies instead of the rendered one: the pool is sized under it, and a limit too small is refused."""
    ranks, pools = ranks_of(flags), pools_of(flags)  # SGLang's divisor; the pools pinned (data parallel)
    limit, offload = resolve_limit(unit_limit, data), offload_bytes(flags)  # offloaded weights: host RAM
    seen = memory_at_start(data, pools, limit, offload)
    given = plan_host_pool(pool, hicache_flags(flags), seen, ranks, decode_backup=decode_backup)
    neighbours = tuple(at_most_pinned(n, data) for n in neighbours)
    later = waiting(neighbours, data)
    share = shared(pool, flags, given, seen, pools, later, data, decode_backup)
    size, capped = rendered_size(pool, flags, share, after_later(seen, later, data))  # in any start order
    # SGLang's auto size shrinks to the host at start: kept without facts, and for a decode's backup-only
    # pool (the unit keeps SGLang's default; the plan says what it pins)
    if (data is None and given.mode is Mode.AUTO) or decode_backup is not None:
        size, capped = None, 0
    memory_max, planned = None, share if decode_backup is not None else given
    if decode_backup is not None and given.mode is not Mode.AUTO:  # auto off (hicache_hook.py:122-123)
        planned = size_pool(pool, hicache_flags(flags), seen, ranks, pools, decode_backup)
    if size is not None:
        memory_max = limit or memory_max_of({**flags, "hicache-size": int(size)})
        planned = size_pool(pool, size, memory_at_start(data, pools, memory_max, offload), ranks, pools)
    daemon = daemon_bytes(ranks, runs_daemon(flags, weight_cache))
    need = ServiceNeed(name, pools, pool, planned, engine_bytes(flags), checkpoint_bytes, memory_max, daemon,
                       sglang_ranks=ranks)  # fmt: skip
    budget = ordered_budget(need, neighbours, later, data, rendered=size is not None)
    return HostPlan(pools, pool.device_tokens, pool.bytes_per_token, pool.page_size, given, planned,
                    size if planned.fits else None, memory_max, budget, data is not None, daemon,
                    capped, limit, decode_backup is not None)  # fmt: skip


def ordered_budget(
    need: ServiceNeed,
    neighbours: Sequence[ServiceNeed],
    later: Sequence[ServiceNeed],
    data: HostMemoryData | None,
    rendered: bool = True,
) -> HostBudget:
    """host_budget, where a pool that fits the host now is refused if another start order fails it (systemd
    orders none: plan/hostorder.py): this one after the neighbours still to start, or a neighbour after it.
    `rendered`: the unit renders a size (checked in any start order); else SGLang sizes it at start."""
    budget = host_budget(need, neighbours, data)
    if not rendered or not budget.fits or need.host_pool is None or not need.host_pool.fits or data is None:
        return budget
    start = memory_at_start(data, need.ranks, need.memory_max)
    own = in_any_order(budget, need, start, later, data)
    return own or beside(budget, need, neighbours, data, memory_at_start(data, need.ranks))


def host_budget(
    need: ServiceNeed, neighbours: Sequence[ServiceNeed], data: HostMemoryData | None
) -> HostBudget:
    """The host's budget with this service's need last, the neighbours at least at what they hold now;
    UNCHECKED without facts (unless refused on what is known)."""
    counted = as_running(neighbours, data)
    ram = with_neighbours_stopped(host_ram(data, need.daemon_bytes > 0), counted, data)
    budget = plan_budget(ram, (*counted, need))
    if data is None and budget.verdict is not Verdict.REFUSED:
        budget = HostBudget(Verdict.UNCHECKED, budget.capacity, budget.pinned, 0)
    return budget


def neighbour(
    name: str,
    flags: Mapping[str, FlagValue],
    memory_max: int | None = None,
    weight_cache: bool = False,
    unit: str = "",
) -> ServiceNeed:
    """Another service of the host, as the budget counts it: its explicit --hicache-size per rank (a ratio's
    pool depends on its own device plan: plan it to count it), its processes and its weight-cache daemon.
    A service without HiCache counts its processes: a PD decode's default retraction backup pins a pool
    SGLang sizes at its start (kv_cache_builder.py:244-258), counted like an auto HiCache pool."""
    auto_pool = enabled(flags) or value_of(flags, "disaggregation-mode") == "decode"
    ranks, pools = ranks_of(flags), pools_of(flags)
    size = size_of(flags)
    pool = None if size <= 0 else HostPool(Mode.SIZE, 0, int(size * 1e9), UNLIMITED)
    daemon = daemon_bytes(ranks, runs_daemon(flags, weight_cache))
    if not auto_pool:  # a decode's explicit size sizes its retraction backup (base.py:221-224): counted
        pool = None
    fraction = hicache_flags(flags).effective_fraction if auto_pool else None
    return ServiceNeed(name, pools, None, pool, engine_bytes(flags), 0, memory_max, daemon, unit, ranks,
                       auto_pool, fraction)  # fmt: skip
