"""SGLang's HiCache host-pool lines: the pool each rank allocated, the auto-size decision, the cgroup
headroom, and the refusals (a failure kind, host_memory_short, with its fix). Formats from SGLang 0.5.23:
srt/mem_cache/pool_host/base.py:252-278, srt/mem_cache/hicache_auto_size.py:108-123,
srt/mem_cache/host_memory.py:143-160; the real lines of a CPU start are in
shared/sglang/PD-AND-HICACHE-ON-CPU.md. Anchored at the message position like every other line pattern.
"""

from __future__ import annotations

import math
import re

from agent.sglang.logs import events as ev

PAD_GB = 2**28 / 1e9  # the padding page a pool adds beyond its size, bounded (plan/hostplan.py POOL_PAD)

_NUM = r"(-?\d+(?:\.\d+)?)"
_HOST_POOL = re.compile(
    r"Allocating (.+?) hierarchical KV host pool: (\d+) tokens, " + _NUM + r" GB host memory"
    r"(?:, packed MTP KV layers: target_layers=\d+, draft_layers=(\d+))?"
)
_AUTO = re.compile(
    r"HiCache auto-sizing: ratio " + _NUM + r" -> " + _NUM + r"; " + _NUM + r" GiB host memory per rank "
    r"\(fraction " + _NUM + r", (\d+) ranks on this host\), host pools " + _NUM + r" GiB"
)
_HEADROOM = re.compile(r"HiCache memory headroom: host " + _NUM + r" GiB, cgroup " + _NUM + r" GiB")
_SHORT = re.compile(r"Not enough host memory available\. Requesting " + _NUM + r" GB but only have " + _NUM)

# The refusals' openings, matched by failures.classify after the exception's class name ("ValueError: ").
NOT_ENOUGH = r"Not enough host memory available\. Requesting"
NONE_LEFT = r"No host memory is left for HiCache after the 10 GiB reserve"
NO_CGROUP = r"Cannot automatically size HiCache host memory"
REFUSALS = (NOT_ENOUGH, NONE_LEFT, NO_CGROUP)


def parse(msg: str, rank: str | None) -> ev.LogEvent | None:
    """The event of a HiCache sizing line, None for any other line."""
    if msg.startswith("Allocating ") and (m := _HOST_POOL.match(msg)):
        return ev.HostPool(rank, m[1], int(m[2]), float(m[3]), int(m[4]) if m[4] else None)
    if msg.startswith("HiCache auto-sizing") and (m := _AUTO.match(msg)):
        return ev.HostPoolAutoSize(
            rank, float(m[1]), float(m[2]), float(m[3]), float(m[4]), int(m[5]), float(m[6])
        )
    if msg.startswith("HiCache memory headroom") and (m := _HEADROOM.match(msg)):
        return ev.HostMemoryHeadroom(rank, float(m[1]), float(m[2]))
    return None


def _whole(gb: float, pad: float = PAD_GB) -> int:
    """The largest whole --hicache-size (an int, srt/arg_groups/fields/memory.py) whose pool, padding page
    included (`pad` GB: at most 256 MiB), takes at most `gb`."""
    return math.floor(gb - pad)


def _size(allowed: float, ranks: int | None, pools: int | None, pad: float = PAD_GB) -> str:
    """The size every rank accepts: each checks against free memory read afresh, the pools the ranks before
    it pinned already used (pool_host/base.py:98-108, 247-257), so with R ranks (the divisor) and P pools on
    the host the last finds R x Y / (P + R - 1) of an allowance Y the first saw (a later rank's Y is less)."""
    room = allowed - 0.005  # SGLang prints the allowance rounded to 10 MB
    if ranks and pools:
        each = _whole(room * ranks / (pools + ranks - 1), pad)
        if each < 1:
            return "no whole-GB size fits"
        return (
            f"set --hicache-size to at most {each} (GB per rank; {pools} pool(s) on the host, pinned in turn)"
        )
    one, several = _whole(room), _whole(room / 2)
    if one < 1:
        return "no whole-GB size fits"
    return (
        f"set --hicache-size to at most {one} (GB per rank) if the service has one rank on the host, else at "
        f"most {several if several >= 1 else 'none'}: its ranks pin in turn, each checked against the memory "
        "the ones before it pinned, so R ranks fit allowance x R / (2R - 1) each"
    )


def fix(line: str, ranks: int | None = None, pools: int | None = None, asked: int | None = None) -> str:
    """What to change after a host_memory_short failure, from SGLang's own line; `ranks`: SGLang's ranks
    per host (its divisor), `pools`: the pools pinned there (more with data parallelism), `asked`: the
    explicit --hicache-size refused, where known: the pool it asked less that size is its padding page
    (base.py:221-229; the line's GB rounded to 10 MB), not the 256 MiB bound."""
    m = _SHORT.search(line)
    pad = PAD_GB if m is None or asked is None else min(PAD_GB, max(0.0, float(m[1]) - asked) + 0.005)
    if m and float(m[2]) > 0:
        return (
            f"the host pool asked {m[1]} GB per rank where SGLang allows {m[2]} GB (memory available within "
            "the service's cgroup limit, less a 10 GiB reserve, divided among the ranks on the host): "
            f"{_size(float(m[2]), ranks, pools or ranks, pad)}, or raise MemoryMax= or free host memory"
        )
    if m or re.search(NONE_LEFT, line):
        return (
            "less than 10 GiB of host memory was available to the service (the host's, or within its "
            "cgroup limit), which SGLang keeps in reserve: raise MemoryMax= or free host memory, "
            "or give --hicache-size"
        )
    return (
        "SGLang could not read the service's memory cgroup to auto-size HiCache: "
        "give --hicache-size (GB per rank)"
    )
