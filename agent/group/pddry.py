"""`deployctl apply --dry-run` of a [pd] service: each unit's flag changes and diff against the unit its
host has, and whether (and why) it would restart; nothing is sent but facts and compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.inventory import HostConfig
from agent.output import Output, Style
from agent.pd.group import Member, Part
from agent.render import redact_changes, unit_diff
from agent.sglang.flags import FlagsError, FlagValue, diff_flags, flag_table, parse_unit_flags
from agent.sglang.redact import redact


@dataclass(frozen=True)
class Planned:
    """One unit of the service, ready to send: its inventory as a plain service, its unit and its gate."""

    part: Part
    label: str
    host: HostConfig
    text: str
    need: int  # the pool its role must hold: its start's gate
    url: str | None = None  # the router's name for it (a role's unit; None for the router)
    bootstrap_port: int | None = None  # a prefill's


def _flags(text: str) -> dict[str, FlagValue]:
    """A unit's flags; {} for none, or one deployctl cannot read as SGLang's (the router's)."""
    try:
        return dict(parse_unit_flags(text)) if text else {}
    except FlagsError:
        return {}


def unit_lines(unit: Planned, installed: str, why: str | None, note: str | None = None) -> list[str]:
    """One unit's part of the dry run: its verdict (and why a role change is not a switch), its flag
    changes, its diff."""
    head = f"== {unit.label} {unit.host.ssh.target} {unit.host.unit.name}: "
    switches = why is not None and ("switches" in why or "no restart" in why)
    head += f"would change ({why})" if switches else f"would restart ({why})" if why else "no restart"
    if installed == unit.text:
        return [head, "   the unit would not change"]
    lines = [head] + ([f"   {note}"] if note else [])
    changes = redact_changes(diff_flags(_flags(installed), _flags(unit.text)))
    if changes:
        lines += ["   " + line for line in flag_table(changes).splitlines()]
    diff = unit_diff(installed, unit.text, unit.host.unit.name)
    lines.append(redact(diff, unit.host.unit.secret_environment).rstrip())
    return lines


def show_dry_run(
    out: Output, units: Sequence[Planned], installed: Sequence[str], chosen: Sequence[Member],
    notes: dict[int, str] | None = None,
) -> None:  # fmt: skip
    if out.style is Style.JSON:
        return
    whys = {m.index: m.why for m in chosen}
    for i, (unit, text) in enumerate(zip(units, installed, strict=True)):
        out.note("\n".join(unit_lines(unit, text, whys.get(i), (notes or {}).get(i))))
    if not chosen:
        out.note("== every unit is up to date: an apply would restart nothing")
    else:
        out.note(f"== {len(chosen)} unit(s) would change as one group, in waves (prefills, decodes, router)")
    out.note("dry run: nothing was changed")
