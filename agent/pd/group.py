"""Pure: which units of a [pd] service a change restarts, in which wave, and who sends the routed check.

A unit restarts when its own agent says an apply of its rendered unit would change something (the one
check every apply makes, under the unit's lock: the text, its secrets, the running process; `compare`).
Besides that, one rule of order: after a prefill restarts, every decode restarts too, since Mooncake keeps a
healthy pair failed until the decode re-registers with the new prefill (sglang#13054); so does a prefill
that the recovery opening the change started again (an earlier change's agent died). The router restarts
only when its own unit changes: it names the units by URL and finds a restarted one by its health check.

The waves: prefills, then decodes, then the router; a wave starts only once every unit of the waves before
it is ready (agent/group/decide.py next_wave). The last wave proves the whole with one completion routed
through the router: the router itself, or, when its unit is unchanged, each unit of the last wave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Part(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"


ORDER = (Part.PREFILL, Part.DECODE, Part.ROUTER)  # the waves, in order


@dataclass(frozen=True)
class Seen:
    """One unit of the service as the change found it."""

    part: Part
    label: str  # prefill[0], decode[1], router
    changes: bool  # its agent says an apply would change it
    recovered: bool = False  # the recovery that opened this change (re)started its unit
    # its change is a role switch SGLang takes ("prefill -> decode", agent/pd/switch.py), or for the router
    # a unit that changes by the switched roles alone: no restart
    switch: str | None = None


@dataclass(frozen=True)
class Member:
    index: int  # into the units given
    wave: int  # 0, 1, ... with no gap: next_wave sends "go" to each in turn
    why: str
    routed: bool  # checks the whole with a completion through the router's URL once ready
    switch: bool = False  # switched in place (a role), or written without a restart (the router)


def _why(unit: Seen, prefill_restarts: str | None) -> str | None:
    if unit.changes and _switches(unit, prefill_restarts):
        if unit.part is Part.ROUTER:
            return "its unit changes by the switched roles alone: written, no restart (told through its API)"
        return f"its role switches ({unit.switch}) without a restart"
    if unit.changes:
        return "its unit changes"
    if unit.part is Part.DECODE and prefill_restarts:
        return f"{prefill_restarts}: the decode must re-register with it (sglang#13054)"
    return None


def _switches(unit: Seen, prefill_restarts: str | None) -> bool:
    """A switch stands unless a prefill restarts and the unit would become a decode: that one restarts
    with the others (sglang#13054, the rule above)."""
    return unit.switch is not None and not (unit.part is Part.DECODE and prefill_restarts)


def _prefill_restarts(units: Sequence[Seen]) -> str | None:
    """Why the decodes re-register: a prefill restarts now, or the recovery that opened the change
    started one again (its earlier change finished: a new process, which Mooncake pairs afresh)."""
    prefills = [u for u in units if u.part is Part.PREFILL]
    if any(u.changes and u.switch is None for u in prefills):  # a prefill switched in is no new process
        return "a prefill restarts"
    recovered = [u.label for u in prefills if u.recovered]
    return f"{recovered[0]} was started again by the recovery of an earlier change" if recovered else None


def members(units: Sequence[Seen]) -> list[Member]:
    """The units the change restarts, each with its wave and why; [] when nothing changes."""
    prefill_restarts = _prefill_restarts(units)
    chosen = [(i, u, why) for i, u in enumerate(units) if (why := _why(u, prefill_restarts)) is not None]
    parts = [p for p in ORDER if any(u.part is p for _, u, _ in chosen)]
    router_restarts = any(u.part is Part.ROUTER and not _switches(u, None) for _, u, _ in chosen)
    return [
        Member(i, parts.index(u.part), why, not router_restarts and u.part is parts[-1],
               _switches(u, prefill_restarts))
        for i, u, why in chosen
    ]  # fmt: skip


def waves(chosen: Sequence[Member]) -> tuple[int, ...]:
    return tuple(m.wave for m in chosen)
