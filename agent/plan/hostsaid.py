"""What a HiCache plan says about the sizing flags as given, where the unit it renders differs from them, and
SGLang 0.5.23's own warning for a host pool no larger than the device pool.

The unit gets an explicit `--hicache-size` per rank (plan/hostplan.py): a ratio or SGLang's auto size is
fixed as that size, and a flag the size overrides is left out. Each is said, so that a flag the user gave
never vanishes from the unit without a word.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.inventory import FlagValue
from agent.plan.hostplan import HostPlan
from agent.plan.hostpool import Mode
from agent.plan.inputs import float_of

# --hicache-size: "Overrides --hicache-ratio in either host memory mode" (fields/memory.py:113-116)
SIZE_WINS = "srt/arg_groups/fields/memory.py:113-116"
# an explicit ratio or size resolves --hicache-host-memory-fraction to None: auto sizing off
AUTO_OFF = "srt/arg_groups/hicache_hook.py:122-123"


def given_notes(flags: Mapping[str, FlagValue], host: HostPlan) -> tuple[str, ...]:
    """The sizing flags as given that the unit does not keep as they are, and why: a ratio or a fraction an
    explicit size (or ratio) overrides, and a ratio or auto size fixed as the rendered `--hicache-size`."""
    ratio = float_of(flags, "hicache-ratio")
    size = float_of(flags, "hicache-size") or 0.0
    fraction = float_of(flags, "hicache-host-memory-fraction")
    dropped = "; the unit leaves it out" if host.size_gb is not None else ""
    out = []
    if size > 0 and ratio is not None:
        out.append(
            f"HiCache: --hicache-ratio {ratio:g} has no effect: --hicache-size {size:g} overrides it "
            f"(SGLang 0.5.23 {SIZE_WINS}){dropped}"
        )
    if fraction is not None and (size > 0 or ratio is not None):
        which = "--hicache-size" if size > 0 else "--hicache-ratio"
        out.append(
            f"HiCache: --hicache-host-memory-fraction {fraction:g} has no effect: an explicit {which} turns "
            f"SGLang's auto size off ({AUTO_OFF}){dropped}"
        )
    fixed = _fixed_as_size(host, ratio, fraction)
    return (*out, fixed) if size <= 0 and fixed else tuple(out)


def _fixed_as_size(host: HostPlan, ratio: float | None, fraction: float | None) -> str | None:
    """The rendered size in place of a ratio or of SGLang's auto size; None where none is rendered."""
    if host.size_gb is None or host.backup:
        return None
    size = f"HiCache: the unit gets --hicache-size {host.size_gb:g} GB per rank"
    if host.given.mode is Mode.RATIO and ratio is not None:
        return (
            f"{size} in place of --hicache-ratio {ratio:g} ({ratio:g} x the device pool: "
            f"{host.given.tokens:,} tokens per rank, floored to whole GB): its host pool no longer follows "
            "the device pool"
        )
    if host.given.mode is Mode.AUTO:
        share = f" {fraction:g}" if fraction is not None else ", default 0.8"
        return (
            f"{size} in place of SGLang's auto size (--hicache-host-memory-fraction{share}): a fixed pool, "
            "which SGLang checks at start rather than shrinks"
        )
    return None


def kept_as_given(flags: Mapping[str, FlagValue], host: HostPlan) -> str | None:
    """How a decode's retraction backup is sized where its unit keeps an explicit ratio or size (SGLang's auto
    size is then off, hicache_hook.py:122-123, and the backup ratio unused, kv_cache_builder.py:244); None
    elsewhere."""
    if not host.backup or host.size_gb is not None:
        return None
    ratio, size = float_of(flags, "hicache-ratio"), float_of(flags, "hicache-size") or 0.0
    if host.given.mode is Mode.SIZE and size > 0:
        return f"--hicache-size {size:g} GB, as given,"
    if host.given.mode is Mode.RATIO and ratio is not None:
        return f"--hicache-ratio {ratio:g} of the device pool, as given,"
    return None


def sglang_warns_small(host_tokens: int, device_tokens: int) -> bool:
    """SGLang's own test before it allocates a host pool (pool_host/base.py:237): `size <= device tokens`."""
    return host_tokens <= device_tokens


def needed_size(host: HostPlan) -> int:
    """The smallest whole-GB size whose pool (size // bytes per token, plus a padding page) exceeds the
    device pool."""
    return math.ceil(host.device_tokens * host.bytes_per_token / 1e9)


def smaller_than_device(host: HostPlan, most: int | None = None) -> str | None:
    """SGLang's warning when a host pool holds no more tokens than the device pool (pool_host/base.py:237-245,
    `size <= device_capacity_tokens`): the host tier then keeps no more than the GPU already does. None for a
    larger pool, and for a decode's retraction backup (a backup, not a cache tier: small by design).
    `most`: the largest size the host's facts let the plan accept, where that is less than the size needed."""
    if host.backup or not host.pool.fits or not sglang_warns_small(host.pool.tokens, host.device_tokens):
        return None
    needed = needed_size(host)
    room = (
        f"but this host holds at most --hicache-size {most} per rank (the plan refuses more)"
        if most is not None and most < needed
        else "where the host has the room"
    )
    return (
        f"HiCache: the host pool ({host.pool.tokens:,} tokens per rank) is smaller than the device pool "
        f"({host.device_tokens:,} tokens): SGLang 0.5.23 warns at start that L2 cache effectiveness is "
        f"reduced (pool_host/base.py:237-245); --hicache-size {needed} per rank or more holds more than the "
        f"GPU does, {room}"
    )
