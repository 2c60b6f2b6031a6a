"""HiCache's host pool per rank, by SGLang 0.5.23's own rule: tokens, bytes, or SGLang's own refusal.

SGLang sizes the host-RAM KV tier (`--enable-hierarchical-cache`, and a PD decode's retraction backup) in
three ways; every line cited is in SGLang 0.5.23's package (`sglang/`):

- `--hicache-size G` (GB per rank, decimal): `G * 1e9 // bytes_per_token` tokens
  (srt/mem_cache/pool_host/base.py:221-224); it wins over the ratio.
- `--hicache-ratio R` (default 2.0, srt/arg_groups/hicache_hook.py:118-121): `int(device_tokens * R)`
  (base.py:226).
- auto (neither given; `--hicache-host-memory-fraction F`, default 0.8, nulled by an explicit ratio or size,
  hicache_hook.py:122-123): the ratio is cut to `budget * 0.95 / device_kv_bytes`, budget = the per-rank
  allowance below x F (srt/mem_cache/hicache_auto_size.py:94-97); a ratio <= 0 is refused (lines 108-112).

Then one padding page: `page_num = size // page + 1`, tokens = page_num x page (base.py:227-229). The pool's
bytes (tokens x bytes per token) must not exceed the per-rank allowance (base.py:248-257):
`(min(available, cgroup headroom) - 10 GiB) // ranks_per_host` (base.py:28 and 104-108;
srt/mem_cache/host_memory.py:136-162), where the cgroup headroom is, over every level of the process's memory
cgroup and each of its limits, `limit - (usage - file page cache)`, the smallest (host_memory.py:83-125).
In auto mode the allowance is the budget snapshot itself (base.py:98-102, hicache_auto_size.py:124).

A decode server's default retraction backup (srt/mem_cache/kv_cache_builder.py:244-258) sets the ratio to
max(0.2, one request's tokens / device tokens) and is auto-sized like the rest; an MLA decode builds none.
Scope: one attention KV pool per rank, proved on MHA and MLA pools (tests/data/oracle/hostpool-cases.json);
draft, hybrid and DSA indexer host pools are not planned here (hostwire.py refuses HiCache with them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

GIB = 1024**3
RESERVE_BYTES = 10 * GIB  # HICACHE_HOST_MEMORY_RESERVE_BYTES, base.py:28
AUTO_SLACK = 0.05  # _ALLOCATION_SLACK_FRACTION, hicache_auto_size.py:33
DEFAULT_RATIO = 2.0  # hicache_hook.py:118-121 (cache mode)
BUFFER_ONLY_RATIO = 1.2  # the same lines, --hicache-host-memory-mode buffer_only
DEFAULT_FRACTION = 0.8  # srt/arg_groups/fields/memory.py
BACKUP_ONLY_RATIO = 0.2  # BACKUP_ONLY_HICACHE_RATIO, kv_cache_builder.py:164
REQ_POOL_EXTRA = 4  # the request-to-token pool's row is context_len + 4 (the real decode's 4,100-token pool)


@dataclass(frozen=True)
class CgroupLevel:
    """One level of the service's memory cgroup (v2: memory.max and memory.high; v1: limit_in_bytes)."""

    limits: tuple[int, ...]  # the finite limits only ("max" is no limit)
    usage: int  # memory.current
    page_cache: int  # active_file + inactive_file of memory.stat


def cgroup_headroom(levels: tuple[CgroupLevel, ...]) -> int | None:
    """What the cgroup still allows, as SGLang reads it (host_memory.py:98-125); None without a limit."""
    room = [max(0, limit - max(0, lv.usage - lv.page_cache)) for lv in levels for limit in lv.limits]
    return min(room) if room else None


@dataclass(frozen=True)
class HostMemory:
    """The host as one service's process sees it when its host pool is sized."""

    available: int  # MemAvailable (psutil's `available`), bytes
    cgroup: tuple[CgroupLevel, ...] = ()

    @property
    def usable(self) -> int:
        room = cgroup_headroom(self.cgroup)
        return self.available if room is None else min(self.available, room)


class Mode(Enum):
    SIZE = "size"
    RATIO = "ratio"
    AUTO = "auto"


@dataclass(frozen=True)
class HiCacheFlags:
    """The flags as given (None: not given), resolved as hicache_hook.py does."""

    ratio: float | None = None
    size_gb: float = 0.0
    fraction: float | None = DEFAULT_FRACTION
    buffer_only: bool = False

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError("--hicache-host-memory-fraction must be in (0, 1].")  # hicache_hook.py:116
        if self.size_gb < 0:  # 0 is SGLang's default: the ratio (or the auto size) decides
            raise ValueError("--hicache-size must not be negative")
        if self.ratio is not None and not 0 < self.ratio < math.inf:
            raise ValueError("--hicache-ratio must be a positive number")

    @property
    def mode(self) -> Mode:
        if self.size_gb > 0:
            return Mode.SIZE
        return Mode.RATIO if self.effective_fraction is None else Mode.AUTO

    @property
    def effective_fraction(self) -> float | None:
        explicit = self.ratio is not None or self.size_gb > 0
        return None if explicit else self.fraction

    def requested_ratio(self, decode_backup: float | None = None) -> float:
        if self.ratio is not None:
            return self.ratio
        if decode_backup is not None:
            return decode_backup
        return BUFFER_ONLY_RATIO if self.buffer_only else DEFAULT_RATIO


@dataclass(frozen=True)
class RankPool:
    """One rank's device KV pool, as the host pool mirrors it."""

    device_tokens: int  # max_total_num_tokens per rank
    bytes_per_token: int  # host bytes per token per rank (MHA: (K + V width) x heads x layers x dtype)
    page_size: int = 1

    @property
    def device_kv_bytes(self) -> int:
        """The device pool's K+V buffers: size + one page of rows (srt/mem_cache/memory_pool.py:2574)."""
        return (self.device_tokens + self.page_size) * self.bytes_per_token


def mha_bytes_per_token(heads: int, head_dim: int, v_head_dim: int, layers: int, dtype_bytes: int) -> int:
    """An MHA host pool's bytes per token per rank (srt/mem_cache/pool_host/mha.py:290-296)."""
    return (head_dim + v_head_dim) * heads * layers * dtype_bytes


def mla_bytes_per_token(kv_cache_dim: int, layers: int, dtype_bytes: int) -> int:
    """An MLA host pool's bytes per token (srt/mem_cache/pool_host/mla.py:195-197): a latent row per layer."""
    return kv_cache_dim * dtype_bytes * layers


@dataclass(frozen=True)
class DecodeServer:
    """A PD decode server without HiCache, as its retraction backup's default resolves
    (`--disaggregation-decode-retraction-backup`, kv_cache_builder.py:199-241)."""

    mha: bool  # a dense MHA pool (MLA and recurrent-state models back up to a plain CPU tensor)
    rocm: bool = False
    dcp: bool = False
    decode_radix_cache: bool = False
    decode_offload: bool = False
    priority_preemption: bool = False

    @property
    def builds_backup_pool(self) -> bool:
        blocked = self.rocm or self.dcp or self.decode_radix_cache or self.decode_offload
        return self.mha and not (blocked or self.priority_preemption)


def decode_backup_ratio(
    pool: RankPool, context_len: int, *, size_gb: float = 0.0, receive_threshold: float = 1.0
) -> float:
    """A decode server's retraction-backup ratio (kv_cache_builder.py:248-258, 167-170)."""
    ratio = BACKUP_ONLY_RATIO
    if size_gb == 0:
        one = min(context_len + REQ_POOL_EXTRA - 1, pool.device_tokens)
        one = math.ceil(one / pool.page_size) * pool.page_size
        if receive_threshold < 1:
            one *= 2  # one request can receive while another is retracted
        ratio = max(ratio, one / pool.device_tokens)
    return ratio


class Refusal(Enum):
    NOT_ENOUGH = "not-enough-host-memory"
    NONE_LEFT = "no-host-memory-after-reserve"


@dataclass(frozen=True)
class AutoSize:
    requested_ratio: float
    ratio: float
    budget: int  # bytes per rank, the fraction applied
    fraction: float
    ranks_per_host: int
    device_kv_bytes: int

    def line(self) -> str:
        """SGLang's auto-size line (hicache_auto_size.py:114-123)."""
        return (
            f"HiCache auto-sizing: ratio {self.requested_ratio:.3f} -> {self.ratio:.3f}; "
            f"{self.budget / GIB:.1f} GiB host memory per rank (fraction {self.fraction:.2f}, "
            f"{self.ranks_per_host} ranks on this host), "
            f"host pools {self.device_kv_bytes * self.ratio / GIB:.1f} GiB."
        )


@dataclass(frozen=True)
class HostPool:
    """SGLang's answer for one rank: a pool, or its refusal (then tokens and bytes are what it asked for)."""

    mode: Mode
    tokens: int
    bytes: int
    allowance: int  # the per-rank bytes the pool was checked against
    auto: AutoSize | None = None
    refusal: Refusal | None = None

    @property
    def gb(self) -> float:
        return self.bytes / 1e9

    @property
    def fits(self) -> bool:
        return self.refusal is None

    def message(self) -> str:
        """SGLang's own line for this outcome, as its log carries it."""
        if self.refusal is Refusal.NONE_LEFT:
            return (
                "No host memory is left for HiCache after the 10 GiB reserve; "
                "set --hicache-ratio or --hicache-size explicitly."
            )
        if self.refusal is Refusal.NOT_ENOUGH:
            return (
                f"Not enough host memory available. Requesting {self.bytes / 1e9:.2f} GB but only have "
                f"{self.allowance / 1e9:.2f} GB free. Please reduce the size of the hierarchical cache."
            )
        return (
            f"Allocating kv hierarchical KV host pool: {self.tokens} tokens, "
            f"{self.bytes / 1e9:.2f} GB host memory."
        )


def floor_gb(nbytes: int) -> float:
    """Whole GB: SGLang's --hicache-size is an int (srt/arg_groups/fields/memory.py)."""
    return float(math.floor(nbytes / 1e9))


def ranks_per_host(world_size: int, nnodes: int = 1) -> int:
    """Ranks sharing one host's RAM: launch world size / nodes (base.py:68-81)."""
    return max(world_size // max(nnodes, 1), 1)


def allowance(memory: HostMemory, ranks_per_host: int) -> int:
    """The bytes one rank may claim (base.py:104-108)."""
    return (memory.usable - RESERVE_BYTES) // max(ranks_per_host, 1)


def _tokens(pool: RankPool, size_gb: float, ratio: float) -> int:
    if not math.isfinite(pool.device_tokens * ratio):  # int() of it would be SGLang's OverflowError too
        raise OverflowError(f"--hicache-ratio {ratio:g} asks more host pool tokens than can be counted")
    size = int(size_gb * 1e9 // pool.bytes_per_token) if size_gb > 0 else int(pool.device_tokens * ratio)
    return (size // pool.page_size + 1) * pool.page_size


def plan_host_pool(
    pool: RankPool,
    flags: HiCacheFlags,
    memory: HostMemory,
    ranks_per_host: int,
    *,
    decode_backup: float | None = None,
) -> HostPool:
    """The host pool one rank builds, or SGLang's refusal; `decode_backup`: a decode's retraction ratio."""
    if pool.device_tokens <= 0 or pool.bytes_per_token <= 0 or pool.page_size <= 0 or ranks_per_host <= 0:
        raise ValueError("device tokens, bytes per token, page size and ranks per host must be positive")
    requested = flags.requested_ratio(decode_backup)
    fraction = flags.effective_fraction
    mode = flags.mode
    auto = None
    if mode is Mode.AUTO and fraction is not None:
        budget = int(allowance(memory, ranks_per_host) * fraction)
        ratio = min(requested, budget * (1 - AUTO_SLACK) / pool.device_kv_bytes)
        auto = AutoSize(requested, ratio, budget, fraction, ranks_per_host, pool.device_kv_bytes)
        if ratio <= 0:
            return HostPool(mode, 0, 0, budget, auto, Refusal.NONE_LEFT)
        room = budget
    else:
        ratio, room = requested, allowance(memory, ranks_per_host)
    tokens = _tokens(pool, flags.size_gb, ratio)
    size = tokens * pool.bytes_per_token
    return HostPool(mode, tokens, size, room, auto, Refusal.NOT_ENOUGH if size > room else None)
