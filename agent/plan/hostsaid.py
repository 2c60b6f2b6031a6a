"""SGLang 0.5.23's own warning for a HiCache host pool no larger than the device pool, as the plan says it."""

from __future__ import annotations

import math

from agent.plan.hostplan import HostPlan


def sglang_warns_small(host_tokens: int, device_tokens: int) -> bool:
    """SGLang's own test before it allocates a host pool (pool_host/base.py:237): `size <= device tokens`."""
    return host_tokens <= device_tokens


def smaller_than_device(host: HostPlan) -> str | None:
    """SGLang's warning when a host pool holds no more tokens than the device pool (pool_host/base.py:237-245,
    `size <= device_capacity_tokens`): the host tier then keeps no more than the GPU already does. None for a
    larger pool, and for a decode's retraction backup (a backup, not a cache tier: small by design)."""
    if host.backup or not host.pool.fits or not sglang_warns_small(host.pool.tokens, host.device_tokens):
        return None
    # the smallest whole-GB size whose pool (size // bytes per token, plus a padding page) exceeds the device
    needed = math.ceil(host.device_tokens * host.bytes_per_token / 1e9)
    return (
        f"HiCache: the host pool ({host.pool.tokens:,} tokens per rank) is smaller than the device pool "
        f"({host.device_tokens:,} tokens): SGLang 0.5.23 warns at start that L2 cache effectiveness is "
        f"reduced (pool_host/base.py:237-245); --hicache-size {needed} per rank or more holds more than the "
        "GPU does, where the host has the room"
    )
