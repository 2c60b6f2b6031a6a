"""A unit's own memory limit as systemd reads it: its [Service] MemoryMax=/MemoryHigh= lines (parse_size,
parse_permyriad), which the HiCache plan sizes the pool under (plan/hostplan.py) and render keeps in place of
the MemoryMax= it would render (render.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from agent.plan.hostbudget import RamShare, UnitLimit

# systemd's parse_size (base 1024): case-sensitive suffixes, B for bytes, parts concatenated (1G512M)
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50, "E": 2**60}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([BKMGTPE]?)")
# systemd's parse_permyriad (src/basic/percent-util.c): N% with up to two decimals, N‰ with up to one, N‱
# whole; at most 100 %, else parse_size reads it (and rejects it)
_PERMYRIAD = (
    (re.compile(r"([0-9]+(?:\.[0-9]{1,2})?)%"), 1.0),
    (re.compile(r"([0-9]+(?:\.[0-9])?)‰"), 0.1),
    (re.compile(r"([0-9]+)‱"), 0.01),
)


def _share(text: str) -> RamShare | None:
    """A percentage, permille or permyriad of physical memory as systemd parses it; None: not one."""
    for pattern, scale in _PERMYRIAD:
        found = pattern.fullmatch(text)
        if found and float(found.group(1)) * scale <= 100:
            return RamShare(round(float(found.group(1)) * scale, 4))
    return None


def _systemd_size(text: str) -> int | RamShare | None:
    """One MemoryMax= value as systemd reads it (config_parse_memory_limit): bytes, a RamShare, None (no
    limit: `infinity`, empty); ValueError for one systemd rejects ('Invalid memory limit') or finds out of
    range (0 bytes, 0 %), and ignores with a warning (the earlier assignment stays)."""
    if text in ("", "infinity"):
        return None
    share = _share(text)
    if share is not None:
        if share.percent <= 0:
            raise ValueError(text)
        return share
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(text)
    size = int(sum(float(n) * _UNITS[u] for n, u in parts))
    if size <= 0:
        raise ValueError(text)
    return size


def unit_memory_limit(service_lines: Sequence[str]) -> int | RamShare | None:
    """The memory limit a unit's own [Service] lines set (the smallest of its last MemoryMax= and
    MemoryHigh=, systemd.resource-control(5)), which systemd applies over the rendered MemoryMax= since it
    comes after it; a percentage comes back as a RamShare (of MemTotal, resolve_limit), a value systemd
    rejects (MemoryMax=64g: its suffixes are case-sensitive) is ignored as systemd ignores it."""
    found: dict[str, int | RamShare | None] = {}
    for line in service_lines:
        key, sep, value = (x.strip() for x in line.partition("="))
        if not sep or key not in ("MemoryMax", "MemoryHigh", "MemoryLimit"):
            continue
        try:
            found[key] = _systemd_size(value)
        except ValueError:
            continue
    limits = [UnitLimit(v, k) for k, v in found.items() if isinstance(v, int)]
    low = min(limits) if limits else None
    shares = [v.percent for v in found.values() if isinstance(v, RamShare)]
    return RamShare(min(shares), low) if shares else low


DEFAULT_TEMPLATE = "sglang.service.j2"  # renders no unit.verbatim (render.py refuses it there)
MEMORY_KEYS = ("MemoryMax", "MemoryHigh", "MemoryLimit")


def verbatim_memory_limit(template: str, service_lines: Sequence[str]) -> int | RamShare | None:
    """The memory limit of an inventory unit's verbatim [Service] lines, which the plan sizes the pool
    under; refused in one line (UsageError) where render refuses the unit, so that plan and render agree:
    verbatim lines with a template that does not render them, or a limit systemd rejects or ignores
    ('Invalid memory limit', 'out of range': 64g, 0)."""
    from agent.errors import UsageError

    memory = [line for line in service_lines if line.partition("=")[0].strip() in MEMORY_KEYS]
    if memory and template == DEFAULT_TEMPLATE:
        raise UsageError(
            f"unit.verbatim: {memory[0]!r} would not be in the unit: only "
            "templates/sglang-adopted.service.j2 renders unit.verbatim (unit.template), so the pool is not "
            "sized under it"
        )
    for line in memory:
        try:
            _systemd_size(line.partition("=")[2].strip())
        except ValueError:
            raise UsageError(
                f"unit.verbatim.Service: {line!r}: systemd rejects or ignores this limit ('Invalid memory "
                "limit' or 'out of range'; its size suffixes K, M, G, T are upper-case, 0 is no limit): "
                "set a limit systemd reads, or remove the line"
            ) from None
    return unit_memory_limit(service_lines)


def sets_memory_max(service_lines: Sequence[str]) -> bool:
    """The unit's own [Service] lines set a MemoryMax= systemd accepts: the rendered one is then left out
    (two lines, the last winning, say one limit twice), and the plan sizes under the unit's own."""
    for line in service_lines:
        key, sep, value = (x.strip() for x in line.partition("="))
        if sep and key == "MemoryMax":
            try:
                _systemd_size(value)
            except ValueError:
                continue
            return True
    return False
