"""On the host: its RAM and the service's memory cgroup, as SGLang's HiCache host-pool rule reads them.

SGLang 0.5.23 sizes the host pool against MemAvailable bounded by every level of the process's memory cgroup
(memory.max and memory.high, less memory.current without the page cache: srt/mem_cache/host_memory.py:83-125).
The facts verb reports the same figures for the service's unit, so the plan (plan/hostplan.py) can size the
pool as SGLang will. Parsing is pure (text in, figures out); collect() reads the files and never raises: the
facts must answer whatever the host looks like (None or [] when it cannot tell).
"""

from __future__ import annotations

import os
import re

from agent.protocol.answers import CgroupLevelData, HostMemoryData

CGROUP_ROOT = "/sys/fs/cgroup"


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's figures in bytes (kB fields x 1024; the HugePages_ counts as they are)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            unit = fields[1] if len(fields) > 1 else ""
            out[name.strip()] = int(fields[0]) * (1024 if unit == "kB" else 1)
    return out


def host_memory(meminfo: str, numa_nodes: int, cgroup: list[CgroupLevelData]) -> HostMemoryData | None:
    """The facts' host_memory from /proc/meminfo's text; None without MemTotal and MemAvailable."""
    kb = parse_meminfo(meminfo)
    if not kb.get("MemTotal") or "MemAvailable" not in kb:
        return None
    page = kb.get("Hugepagesize", 0)
    return {
        "total": kb["MemTotal"],
        "available": kb["MemAvailable"],
        "hugepages_total": kb.get("HugePages_Total", 0) * page,
        "hugepages_free": kb.get("HugePages_Free", 0) * page,
        "numa_nodes": max(1, numa_nodes),
        "cgroup": cgroup,
    }


def parse_limit(text: str | None) -> int | None:
    """memory.max or memory.high: bytes, None for "max" (no limit) or what cannot be read."""
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


def parse_file_cache(stat: str | None) -> int:
    """The page cache SGLang takes off memory.current: memory.stat's active_file + inactive_file
    (host_memory.py:98-113), not `file`, which counts shmem and tmpfs too (they sit on the anon LRU and
    cannot be reclaimed as cache: NCCL's /dev/shm segments, for one)."""
    total = 0
    for line in (stat or "").splitlines():
        name, _, value = line.partition(" ")
        if name in ("active_file", "inactive_file") and value.strip().isdigit():
            total += int(value)
    return total


def level(path: str, files: dict[str, str | None]) -> CgroupLevelData | None:
    """One cgroup level from its files' text; None without memory.current (no memory controller)."""
    current = (files.get("memory.current") or "").strip()
    if not current.isdigit():
        return None
    return {
        "path": path,
        "max": parse_limit(files.get("memory.max")),
        "high": parse_limit(files.get("memory.high")),
        "current": int(current),
        "file": parse_file_cache(files.get("memory.stat")),
    }


def unit_cgroup(unit: str, root: str = CGROUP_ROOT) -> str | None:
    """The unit's cgroup under the root: system.slice/<unit>, <slice>/<unit> for a Slice= of its own, at
    any depth: systemd nests a dashed slice under its prefixes (Slice=a-b-c.slice lives at
    a.slice/a-b.slice/a-b-c.slice, systemd.slice(5)), and a template's instance (sglang@chat.service) in
    system-sglang.slice under its slice."""
    if not re.fullmatch(r"[A-Za-z0-9@._:-]+", unit):
        return None
    for parent in _slices(root):
        if os.path.isdir(os.path.join(root, parent, unit)):
            return f"{parent}/{unit}"
    return None


MAX_SLICE_DEPTH = 16  # systemd's slices nest by their dashes; a bound against a cgroup tree gone odd


def _slices(root: str) -> list[str]:
    """Every slice under the root, breadth first: system.slice and the root's other slices, then the
    slices inside each, level by level."""
    top = ["system.slice", *sorted(n for n in _listdir(root) if n.endswith(".slice") and n != "system.slice")]
    found, level = [], [t for t in top if os.path.isdir(os.path.join(root, t))]
    for _ in range(MAX_SLICE_DEPTH):
        if not level:
            break
        found += level
        level = [
            f"{t}/{n}" for t in level for n in sorted(_listdir(os.path.join(root, t))) if n.endswith(".slice")
        ]
    return found


def cgroup_levels(relative: str, root: str = CGROUP_ROOT) -> list[CgroupLevelData]:
    """Every level from the unit's cgroup up to the root's child, innermost first (the root has no limit)."""
    levels: list[CgroupLevelData] = []
    parts = relative.strip("/").split("/")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n])
        names = ("memory.max", "memory.high", "memory.current", "memory.stat")
        found = level(path, {name: _read(os.path.join(root, path, name)) for name in names})
        if found is not None:
            levels.append(found)
    return levels


def collect(
    unit: str,
    root: str = CGROUP_ROOT,
    meminfo: str = "/proc/meminfo",
    nodes: str = "/sys/devices/system/node",
) -> HostMemoryData | None:
    """The facts' host_memory of this host for `unit`; None when /proc/meminfo cannot be read."""
    text = _read(meminfo)
    if text is None:
        return None
    count = sum(1 for n in _listdir(nodes) if re.fullmatch(r"node[0-9]+", n))
    relative = unit_cgroup(unit, root)
    # not running (stopped, or not installed yet): the slice the template starts it in, whose memory.max
    # SGLang reads once it starts (host_memory.py:83-125)
    found = host_memory(text, count, cgroup_levels(relative or "system.slice", root))
    if found is not None:
        parent = relative.partition("/")[0] if relative else "system.slice"
        found["siblings"] = siblings(parent, unit, root)
    return found


def siblings(parent: str, unit: str, root: str = CGROUP_ROOT) -> dict[str, int]:
    """What each other service under the same top slice holds now, its template instances' slices one level
    down included: memory.current less its page cache."""
    out: dict[str, int] = {}
    places = [
        parent,
        *(f"{parent}/{n}" for n in _listdir(os.path.join(root, parent)) if n.endswith(".slice")),
    ]
    for place in places:
        for name in sorted(_listdir(os.path.join(root, place))):
            if name == unit or not name.endswith(".service"):
                continue
            files = {f: _read(os.path.join(root, place, name, f)) for f in ("memory.current", "memory.stat")}
            found = level(f"{place}/{name}", files)
            if found is not None:
                out[name] = max(0, found["current"] - found["file"])
    return out


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
