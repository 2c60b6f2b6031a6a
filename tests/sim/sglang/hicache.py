"""HiCache's host pool in the simulated server: SGLang 0.5.23's sizing, its budget check and its lines.

Reimplemented from SGLang 0.5.23's package (`sglang/`), stdlib only (the sim runs on the test host without
torch); tests/pure/test_sim_hicache.py checks it against SGLang's own answers (tests/data/oracle/
hostpool-cases.json, made by running that code in the oracle venv):

- flags (srt/arg_groups/hicache_hook.py:114-127): the ratio defaults to 2.0 (1.2 in buffer_only mode); an
  explicit --hicache-ratio or --hicache-size turns the auto size (--hicache-host-memory-fraction, 0.8) off.
- tokens (srt/mem_cache/pool_host/base.py:221-229): `size * 1e9 // bytes_per_token` for --hicache-size,
  else `int(device_tokens * ratio)`; then one padding page.
- the check (base.py:247-257, 98-108): bytes <= (min(MemAvailable, cgroup headroom) - 10 GiB) // ranks per
  host, read afresh by every rank (a rank that checks after others pinned sees their pools as used).
- auto size (srt/mem_cache/hicache_auto_size.py:84-125): the ratio cut to budget x 0.95 / device KV bytes,
  budget = that allowance x fraction, one snapshot for every rank; a ratio <= 0 is refused.

The host the sim sees: MemAvailable from a meminfo file (/proc/meminfo, which a test host may bind to a
simulated one), the cgroup headroom from the unit's MemoryMax= (a test host's systemd applies no memory
controller, so the limit is read from systemd rather than memory.max) less what the unit holds.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
RESERVE = 10 * GIB  # HICACHE_HOST_MEMORY_RESERVE_BYTES, base.py:28
SLACK = 0.05  # _ALLOCATION_SLACK_FRACTION, hicache_auto_size.py:33


def add_flags(p: argparse.ArgumentParser) -> None:
    """The HiCache sizing flags (srt/arg_groups/fields/memory.py:98-120)."""
    add = p.add_argument
    add(
        "--enable-hierarchical-cache",
        "--enable-hicache",
        dest="enable_hierarchical_cache",
        action="store_true",
    )
    add("--hicache-host-memory-mode", default="cache", choices=["cache", "buffer_only"])
    add("--hicache-ratio", type=float)
    add("--hicache-size", type=int, default=0)
    add("--hicache-host-memory-fraction", type=float, default=0.8)


@dataclass(frozen=True)
class Flags:
    ratio: float  # as resolved (the default filled in)
    size_gb: float  # an int on the command line (memory.py); the pool's code takes any number
    fraction: float | None  # None: auto size off


def resolve(args: argparse.Namespace) -> Flags:
    """hicache_hook.py:114-127; a fraction outside (0, 1] is SGLang's ValueError."""
    fraction = args.hicache_host_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError("--hicache-host-memory-fraction must be in (0, 1].")
    ratio = args.hicache_ratio
    if ratio is not None or args.hicache_size > 0:
        fraction = None
    if ratio is None:
        ratio = 1.2 if args.hicache_host_memory_mode == "buffer_only" else 2.0
    return Flags(ratio, args.hicache_size, fraction)


@dataclass(frozen=True)
class Host:
    """The host as one rank reads it: MemAvailable, and the cgroup's headroom (None: no limit)."""

    available: int
    headroom: int | None = None

    def less(self, used: int) -> Host:
        """The host once `used` more bytes are pinned (in this cgroup, and out of MemAvailable)."""
        room = None if self.headroom is None else max(0, self.headroom - used)
        return Host(self.available - used, room)

    @property
    def usable(self) -> int:
        return self.available if self.headroom is None else min(self.available, self.headroom)


@dataclass(frozen=True)
class Pool:
    """SGLang's answer for the service's ranks on this host: the pool, or its refusal and its lines."""

    tokens: int
    bytes: int
    lines: tuple[tuple[int, str], ...]  # (rank index, message) in the order the ranks log them
    error: str | None = None  # "ValueError: ..." where a rank refused


def headroom_line(host: Host) -> tuple[str, ...]:
    """host_memory.py:154-159, logged where a cgroup limit was found."""
    if host.headroom is None:
        return ()
    return (
        f"HiCache memory headroom: host {host.available / GIB:.1f} GiB, cgroup {host.headroom / GIB:.1f} GiB",
    )


def tokens_of(device_tokens: int, bytes_per_token: int, page: int, flags: Flags, ratio: float) -> int:
    size = int(flags.size_gb * 1e9 // bytes_per_token) if flags.size_gb > 0 else int(device_tokens * ratio)
    return (size // page + 1) * page


def not_enough(requested: int, allowed: int) -> str:
    return (
        f"ValueError: Not enough host memory available. Requesting {requested / 1e9:.2f} GB but only have "
        f"{allowed / 1e9:.2f} GB free. Please reduce the size of the hierarchical cache."
    )


def small(tokens: int, device_tokens: int) -> list[str]:
    """base.py:236-245: the warning _allocate_host_buffer opens with, before its check."""
    if tokens > device_tokens:
        return []
    return [
        f"HiCache kv host pool ({tokens} tokens) is smaller than the device pool "
        f"({device_tokens} tokens);L2 cache effectiveness is reduced.Consider increasing "
        "--hicache-ratio (or --hicache-size) for higher L2 cache hit rate."
    ]


def allocated(tokens: int, size: int) -> str:
    """base.py:272-278."""
    return f"Allocating kv hierarchical KV host pool: {tokens} tokens, {size / 1e9:.2f} GB host memory."


def size_pool(  # noqa: PLR0913 - the device pool, the flags, the host, SGLang's divisor, the pools
    device_tokens: int, bytes_per_token: int, page: int, flags: Flags, host: Host, ranks: int, pools: int = 0
) -> Pool:
    """Every local rank's pool (`pools`, one per rank of every data-parallel replica; `ranks`: SGLang's
    divisor, the launch world size per host), rank by rank: an explicit size (or ratio) is checked against
    the host read afresh, the ranks before it having pinned theirs; the auto size books all against one
    snapshot."""
    out: list[tuple[int, str]] = []
    ratio = flags.ratio
    budget = None
    if flags.fraction is not None:
        out += [(r, line) for r in range(pools or ranks) for line in headroom_line(host)]
        device_bytes = (device_tokens + page) * bytes_per_token
        budget = int((host.usable - RESERVE) // ranks * flags.fraction)
        ratio = min(ratio, budget * (1 - SLACK) / device_bytes)
        if ratio <= 0:
            error = "ValueError: No host memory is left for HiCache after the 10 GiB reserve; "
            return Pool(0, 0, tuple(out), error + "set --hicache-ratio or --hicache-size explicitly.")
        out += [
            (r, f"HiCache auto-sizing: ratio {flags.ratio:.3f} -> {ratio:.3f}; {budget / GIB:.1f} GiB host "
                f"memory per rank (fraction {flags.fraction:.2f}, {ranks} ranks on this host), host pools "
                f"{device_bytes * ratio / GIB:.1f} GiB.")
            for r in range(pools or ranks)
        ]  # fmt: skip
    tokens = tokens_of(device_tokens, bytes_per_token, page, flags, ratio)
    size = tokens * bytes_per_token
    for r in range(pools or ranks):
        seen = host.less(r * size)
        out += [(r, line) for line in small(tokens, device_tokens)]
        if budget is None:
            out += [(r, line) for line in headroom_line(seen)]
        allowed = budget if budget is not None else (seen.usable - RESERVE) // ranks
        if size > allowed:
            return Pool(tokens, size, tuple(out), not_enough(size, allowed))
        out.append((r, allocated(tokens, size)))
    return Pool(tokens, size, tuple(out))


def mla_bytes_per_token(kv_cache_dim: int, dtype_bytes: int, layers: int) -> int:
    """pool_host/mla.py:195-197."""
    return kv_cache_dim * dtype_bytes * layers


def mha_bytes_per_token(head_dim: int, v_head_dim: int, heads: int, layers: int, dtype_bytes: int) -> int:
    """pool_host/mha.py:290-296."""
    return (head_dim + v_head_dim) * heads * layers * dtype_bytes


# ---- the host as the sim reads it ------------------------------------------------------------------------

MEMINFO_KNOB = "SGLANG_SIM_MEMINFO"  # a simulated /proc/meminfo the sim reads and charges its pins to


def mem_available(text: str) -> int:
    """MemAvailable of a meminfo text, bytes (psutil's `available`)."""
    found = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    if not found:
        raise ValueError("no MemAvailable in meminfo")
    return int(found.group(1)) * 1024


def with_available(text: str, available: int) -> str:
    return re.sub(r"(?m)^MemAvailable:\s+\d+ kB", f"MemAvailable:   {max(0, available) // 1024} kB", text)


def unit_of(cgroup_text: str) -> str | None:
    """The systemd unit a process runs in, from /proc/self/cgroup (cgroup2's or name=systemd's path)."""
    for line in cgroup_text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "name=systemd"):
            name = path.rstrip("/").rpartition("/")[2]
            if name.endswith(".service"):
                return name
    return None


def parse_memory_max(text: str) -> int | None:
    """`systemctl show -p MemoryMax --value`: bytes, or None for infinity/unset."""
    value = text.strip()
    return int(value) if value.isdigit() else None


def memory_max(env: Mapping[str, str], run: Callable[[list[str]], str] | None = None) -> int | None:
    """The unit's MemoryMax=: SGLANG_SIM_MEMORY_MAX if set, else systemd's value for the sim's own unit."""
    if env.get("SGLANG_SIM_MEMORY_MAX"):
        return parse_memory_max(env["SGLANG_SIM_MEMORY_MAX"])
    try:
        unit = unit_of(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    if unit is None:
        return None
    ask = run or _systemctl
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return parse_memory_max(ask(["systemctl", "show", "-p", "MemoryMax", "--value", unit]))
    return None


def _systemctl(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def host_now(env: Mapping[str, str], held: int) -> Host:
    """The host the first rank reads: MemAvailable, and MemoryMax= less what the unit holds (`held`: the
    sim's processes, SGLANG_SIM_HOST_PROCESS_GIB)."""
    available = mem_available(Path(env.get(MEMINFO_KNOB) or "/proc/meminfo").read_text())
    limit = memory_max(env)
    return Host(available, None if limit is None else max(0, limit - held))


def charge(env: Mapping[str, str], delta: int) -> None:
    """Take `delta` bytes out of the simulated meminfo's MemAvailable (a real host's pinned pages leave it;
    a negative delta gives them back as the process ends); nothing on a host whose meminfo is its own."""
    path = env.get(MEMINFO_KNOB)
    if not path or not delta:
        return
    with open(path, "r+", encoding="ascii") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read()
        f.seek(0)
        f.write(with_available(text, mem_available(text) - delta))
        f.truncate()
