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


def fix(line: str) -> str:
    """What to change after a host_memory_short failure, from SGLang's own line."""
    m = _SHORT.search(line)
    if m and float(m[2]) > 0:
        # --hicache-size is an int (srt/arg_groups/fields/memory.py) and its pool adds a padding page (at
        # most 256 MiB) to the size; the figure SGLang prints is rounded to 10 MB
        whole = math.floor(float(m[2]) - 0.005 - PAD_GB)
        size = (
            f"set --hicache-size to at most {whole} (GB per rank)" if whole >= 1 else "no whole-GB size fits"
        )
        return (
            f"the host pool asked {m[1]} GB per rank where SGLang allows {m[2]} GB (memory available within "
            "the service's cgroup limit, less a 10 GiB reserve, divided among the ranks on the host): "
            f"{size}, or raise MemoryMax= or free host memory"
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
