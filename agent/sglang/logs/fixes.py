"""The one-line fix of a failure kind whose SGLang line says what to change (None for the others)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.sglang.logs import events as ev
from agent.sglang.logs import hicache, pd
from agent.sglang.logs.failures import refused_said

# The kernel's OOM killer: host RAM ran out (what SGLang itself holds there: --cpu-offload-gb's weights and
# HiCache's host pool, srt/mem_cache/pool_host/base.py); a memory cgroup's kill is the unit's MemoryMax=
_HOST_OOM = (
    "the host ran out of RAM, not GPU memory (the kernel's OOM killer ended SGLang): free host memory, or "
    "lower what SGLang holds there (--cpu-offload-gb, HiCache's --hicache-ratio / --hicache-size)"
)
_CGROUP_OOM = (
    "the service's memory cgroup ran out (the unit's MemoryMax=), not GPU memory: raise MemoryMax=, or lower "
    "what SGLang holds in host memory (--cpu-offload-gb, HiCache's --hicache-ratio / --hicache-size)"
)


def fix_for(
    kind: str | None, line: str, host_ranks: Sequence[int] | None = None, hicache_size: int | None = None
) -> str | None:
    """`host_ranks`: SGLang's ranks per host and the host pools pinned there, where the log said;
    `hicache_size`: the explicit --hicache-size the start asked, where it said."""
    if kind == ev.HOST_MEMORY_SHORT:  # HiCache's host pool refused: SGLang's own figures
        ranks, pools = (host_ranks[0], host_ranks[1]) if host_ranks else (None, None)
        return hicache.fix(line, ranks, pools, hicache_size)
    if kind in (ev.PD_PAGE_SIZE_MISMATCH, ev.PD_KV_DTYPE_MISMATCH, ev.PD_KV_LAYOUT_MISMATCH):
        return pd.fix(line)
    if kind in pd.FIXES:
        return pd.FIXES[kind]
    if kind == ev.PD_KV_CHECKSUM_MISMATCH:
        return pd.CHECKSUM_FIX
    if kind == ev.START_REFUSED:  # SGLang's message names the flag and what to do
        said = refused_said(line).rstrip(".")
        return (
            f"SGLang refused the unit's arguments before any scheduler ran: {said}. Change its flags as that "
            "says ([sglang.flags], or a [pd] role's flags), then apply again"
        )
    if kind == ev.HOST_OOM_KILLED:
        return _CGROUP_OOM if line.startswith("Memory cgroup") else _HOST_OOM
    return None
