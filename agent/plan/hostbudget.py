"""One host's memory budget across every service on it: pinned HiCache host pools, the weight-cache daemon,
each service's own process memory, a stated headroom, and the page cache a pre-warm needs.

Pinned memory must fit, or the plan is refused, naming the first service (in start order) that does not fit
and the `--hicache-size` per rank that would. The page cache is reclaimable: a pre-warm that cannot keep its
checkpoint cached beside the pinned memory is skipped (the verdict says which), it never refuses the plan.
Each service with a cgroup limit (`MemoryMax=`) must hold its own pools (one more per rank beyond the first:
sglang#38156), process and SGLang's 10 GiB reserve inside it, since SGLang sizes against the cgroup's headroom
(srt/mem_cache/host_memory.py:136-162).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from agent.plan.hostpool import GIB, RESERVE_BYTES, HostPool, RankPool

DEFAULT_HEADROOM = 8 * GIB  # the kernel, sshd, journald, the agent: what nobody plans but every host needs


@dataclass(frozen=True)
class ServiceNeed:
    """What one service asks of the host's RAM."""

    name: str
    ranks: int  # its ranks on this host, each with one host pool
    pool: RankPool | None = None  # the rank's device pool, to size a fitting --hicache-size
    host_pool: HostPool | None = None  # the planned host pool per rank (None: no HiCache, no decode backup)
    process_bytes: int = 0  # its processes' own memory on the host (tokenizer, schedulers, staging)
    checkpoint_bytes: int = 0  # the page cache its pre-warm needs: the checkpoint on disk
    memory_max: int | None = None  # its unit's MemoryMax=, if any
    daemon_bytes: int = 0  # its weight-cache daemon's processes (plan/hostplan.py daemon_bytes), own unit
    unit: str = ""  # its systemd unit (a neighbour's: what the host's facts say it holds now)
    sglang_ranks: int = 0  # SGLang's ranks per host, its pool divisor (0: `ranks`; fewer with data parallel)
    pins_pool: bool = True  # it pins a host pool (HiCache, a decode's backup); False: processes only
    auto_fraction: float | None = None  # its --hicache-host-memory-fraction where SGLang auto-sizes its pool

    @property
    def pools_seen_by_last(self) -> int:
        """The pools the last rank to pin must find room for: the others' as used, and its divisor's
        share (2 x ranks - 1 without data parallelism)."""
        ranks = max(self.ranks, 1)
        return ranks + (self.sglang_ranks or ranks) - 1

    @property
    def pool_bytes(self) -> int:
        return 0 if self.host_pool is None else self.host_pool.bytes * self.ranks

    @property
    def pinned(self) -> int:
        return self.pool_bytes + self.process_bytes + self.daemon_bytes

    @property
    def memory_max_needed(self) -> int:
        """The smallest MemoryMax= under which SGLang still finds its pools' room and its reserve: its ranks
        check the cgroup one by one as they pin, the last seeing the others' pools as used (sglang#38156),
        so 2 x ranks - 1 pools; the daemon runs in a unit (a cgroup) of its own, outside it."""
        if self.host_pool is None:
            return self.process_bytes
        pools = self.host_pool.bytes * self.pools_seen_by_last
        return pools + self.process_bytes + RESERVE_BYTES


@dataclass(frozen=True)
class HostRam:
    """The host, with the planned services stopped."""

    total: int  # MemTotal
    available: int  # MemAvailable, plus what the planned services hold now (they are replaced)
    cgroup_limit: int | None = None  # a limit over all the services (their slice), if any

    @property
    def capacity(self) -> int:
        return min(self.total, self.available, self.total if self.cgroup_limit is None else self.cgroup_limit)

    @property
    def bound(self) -> str:
        """Whose memory the capacity is: the host's, or its slice's limit where that binds."""
        return (
            "the slice's"
            if self.cgroup_limit is not None and self.cgroup_limit < min(self.total, self.available)
            else "the host's"
        )


@dataclass(frozen=True)
class RamShare:
    """A unit's MemoryMax=N% (systemd.resource-control(5): N% of the host's physical memory), with its
    other byte limits; the plan resolves it against the facts' MemTotal."""

    percent: float
    bytes_limit: int | None = None  # a MemoryMax=/MemoryHigh= in bytes beside it: the smallest applies

    def of(self, total: int) -> int:
        share = int(total * self.percent / 100)
        return share if self.bytes_limit is None else min(share, self.bytes_limit)


class UnitLimit(int):
    """A unit's own memory limit in bytes, with the directive that sets it (`MemoryMax`, `MemoryHigh`): a
    fix that raises it names that one, as raising another leaves it binding."""

    key: str

    def __new__(cls, value: int, key: str) -> UnitLimit:
        made = super().__new__(cls, value)
        made.key = "MemoryMax" if key == "MemoryLimit" else key  # MemoryLimit=: MemoryMax='s old name
        return made

    def __getnewargs__(self) -> tuple[int, str]:  # type: ignore[override]  # copy and pickle keep its key
        return int(self), self.key


def limit_key(limit: object) -> str:
    """The directive a unit's limit comes from (MemoryMax= where unsaid)."""
    return limit.key if isinstance(limit, UnitLimit) else "MemoryMax"


class Verdict(Enum):
    FITS = "fits"
    PREWARM_SKIPPED = "fits, pre-warm skipped"
    UNCHECKED = "unchecked"  # no host facts: the pool is sized from the flags, the host not read
    REFUSED = "refused"


@dataclass(frozen=True)
class HostBudget:
    verdict: Verdict
    capacity: int
    pinned: int  # pools, processes, daemon and headroom together
    page_cache: int  # the checkpoints of the pre-warms that fit
    over: str | None = None  # the service that does not fit
    fitting_size_gb: float | None = None  # the --hicache-size per rank that would fit it (None: none does)
    prewarm_skipped: tuple[str, ...] = ()
    reason: str = ""
    why: str = ""  # a refusal's cause alone, without its fix (the planner re-words the fix: hostplan.offer)

    @property
    def fits(self) -> bool:
        return self.verdict is not Verdict.REFUSED


def fitting_size_gb(pool: RankPool, room: int) -> float | None:
    """The largest --hicache-size (whole GB: SGLang's flag is an int, srt/arg_groups/fields/memory.py) whose
    pool, padding page included, takes at most `room` bytes (srt/mem_cache/pool_host/base.py:221-229:
    size * 1e9 // bytes per token, plus one page)."""
    size = math.floor((room - pool.page_size * pool.bytes_per_token) / 1e9)
    return float(size) if size >= 1 else None


def _refuse(  # noqa: PLR0913 - the host, what is pinned, the service, the others, why, and whose bound
    host: HostRam, pinned: int, service: ServiceNeed, others: int, why: str, ram: bool = False
) -> HostBudget:
    """Refused at `service`; the fix is the largest pool per rank that meets every bound on it at once:
    the host beside the services started before it, SGLang's own check, and its MemoryMax=. `ram`: the
    host's RAM refused it, which a larger MemoryMax= cannot add to (not offered then)."""
    ranks = max(service.ranks, 1)
    room = (host.capacity - others - service.process_bytes - service.daemon_bytes) // ranks
    if service.host_pool is not None:  # SGLang's own check, per rank (base.py:248-257)
        room = min(room, service.host_pool.allowance)
    if service.memory_max is not None:
        room = min(
            room, (service.memory_max - RESERVE_BYTES - service.process_bytes) // service.pools_seen_by_last
        )
    size = fitting_size_gb(service.pool, room) if service.pool and service.host_pool else None
    if size:
        fix = f"--hicache-size {size:g} per rank would fit"
    elif service.host_pool is not None:
        fix = "no host pool fits: turn HiCache off for it"
    else:
        fix = "it has no host pool to shrink: give it more memory or move it to another host"
    if (
        service.memory_max is not None
        and service.host_pool is not None
        and service.host_pool.bytes
        and not ram
    ):
        fix += f", or a MemoryMax= of at least {service.memory_max_needed / GIB:.1f} GiB holds this one"
    reason = f"{service.name}: {why}; {fix}"
    return HostBudget(Verdict.REFUSED, host.capacity, pinned, 0, service.name, size, (), reason, why)


def plan_budget(
    host: HostRam, services: tuple[ServiceNeed, ...], daemon_bytes: int = 0, headroom: int = DEFAULT_HEADROOM
) -> HostBudget:
    """The verdict for the services in their start order; `daemon_bytes`: a daemon no service owns (each
    service's own daemon is in its `pinned`)."""
    pinned = daemon_bytes + headroom
    for i, service in enumerate(services):
        if service.host_pool is not None and not service.host_pool.fits:
            return _refuse(host, pinned + service.pinned, service, pinned, service.host_pool.message())
        if service.memory_max is not None and service.memory_max_needed > service.memory_max:
            why = (
                f"{limit_key(service.memory_max)}={service.memory_max / GIB:.1f}G holds less than its pools, "
                f"processes and SGLang's 10 GiB reserve ({service.memory_max_needed / GIB:.1f} GiB)"
            )
            return _refuse(host, pinned + service.pinned, service, pinned, why)
        if pinned + service.pinned > host.capacity:
            total = pinned + sum(s.pinned for s in services[i:])
            why = (
                f"{host.bound} {host.capacity / GIB:.1f} GiB cannot pin {total / GIB:.1f} GiB "
                f"(host pools, processes, the weight-cache daemon and {headroom / GIB:.1f} GiB headroom)"
            )
            return _refuse(host, total, service, pinned, why, ram=True)
        pinned += service.pinned
    cache, skipped = 0, []
    for service in services:
        if not service.checkpoint_bytes:
            continue
        if pinned + cache + service.checkpoint_bytes <= host.capacity:
            cache += service.checkpoint_bytes
        else:
            skipped.append(service.name)
    if skipped:
        reason = (
            f"pre-warm skipped for {', '.join(skipped)}: the checkpoint cannot stay cached beside the pools"
        )
        return HostBudget(
            Verdict.PREWARM_SKIPPED, host.capacity, pinned, cache, None, None, tuple(skipped), reason
        )
    return HostBudget(Verdict.FITS, host.capacity, pinned, cache)
