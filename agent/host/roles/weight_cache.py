"""Before an engine in `--weight-cache-mode client` restarts: is its weight-cache daemon there, alive and
holding the fingerprint the new engine will ask for? Found here, not by a start that waits
--weight-cache-timeout (1800 s by default) and then loads from disk or fails.

The decision is pure (`verdict`); `look` reads the host: the daemon's unit file, its state, its ready files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agent.sglang import weight_cache as wc
from agent.sglang.flags import FlagsError, parse_unit_flags, unit_lines
from agent.sglang.unitfile import split_environment

if TYPE_CHECKING:
    from agent.host.systemd import UnitState

_ACTIVE = ("active", "reloading")
_TIES = ("Requires", "BindsTo")  # BindsTo=: how units rendered before Requires= name their daemon


@dataclass(frozen=True)
class Ready:
    """A daemon rank's ready file (srt/weight_cache/protocol.py: it holds the daemon's PID)."""

    path: str
    pid: int | None
    alive: bool


@dataclass(frozen=True)
class DaemonSeen:
    unit: str
    text: str | None  # its installed unit file; None: not installed
    active_state: str
    ready: tuple[Ready, ...]


def client(engine_text: str) -> bool:
    """Whether the engine unit runs in --weight-cache-mode client."""
    try:
        return parse_unit_flags(engine_text).get("weight-cache-mode") == "client"
    except FlagsError:
        return False


def ties(engine_text: str) -> set[str]:
    """The units the engine's [Unit] requires or binds to (each line may list several)."""
    try:
        lines = list(unit_lines(engine_text))
    except FlagsError:
        return set()
    return {n for s, k, v in lines if s == "Unit" and k in _TIES for n in v.split()}


def daemon_unit(engine_unit: str, engine_text: str) -> str | None:
    """The daemon an engine unit is a client of: the one name derived from the engine's unit name
    (sglang/weight_cache.py daemon_unit_name), when the unit runs in client mode and is tied to it.
    Any other unit the engine binds to (an adopted unit's BindsTo=nvidia-fabricmanager.service) is
    never taken for the daemon."""
    name = wc.daemon_unit_name(engine_unit)
    return name if client(engine_text) and name in ties(engine_text) else None


def untied(engine_unit: str, engine_text: str) -> str | None:
    """Why a client engine unit cannot be served: it is not tied to its daemon's one name."""
    if not client(engine_text) or daemon_unit(engine_unit, engine_text) is not None:
        return None
    name = wc.daemon_unit_name(engine_unit)
    return (
        f"{engine_unit} runs in --weight-cache-mode client but names no Requires={name}: the daemon of "
        f"{engine_unit} is {name} and no other unit"
    )


def ready_dir(engine_text: str) -> str | None:
    """The folder of SGLANG_WEIGHT_CACHE_READY_TEMPLATE in the engine's unit."""
    for section, key, value in unit_lines(engine_text):
        if section == "Service" and key == "Environment":
            for name, val in split_environment(value):
                if name == wc.READY_TEMPLATE:
                    return val.rpartition("/")[0] or None
    return None


def verdict(engine_flags: Mapping[str, object], seen: DaemonSeen) -> str | None:
    """Why the engine cannot restart onto this daemon, or None when it can."""
    if seen.text is None:
        return f"{seen.unit} is not installed: the engine in client mode has no daemon to map weights from"
    if seen.active_state not in _ACTIVE:
        return f"{seen.unit} is {seen.active_state}: the daemon that holds the weights is not running"
    try:
        flags = parse_unit_flags(seen.text)
    except FlagsError as exc:
        return f"{seen.unit}: its flags cannot be read: {exc}"
    dead = [r.path for r in seen.ready if not r.alive]
    ranks = wc.ranks(flags)  # every rank's ready file, not the first GPU's
    if dead or len(seen.ready) < ranks:
        said = f"a dead PID in {dead[0]}" if dead else f"{len(seen.ready)} of its {ranks} ready files"
        return f"{seen.unit} runs but is not ready ({said})"
    held = wc.fingerprint(flags, "")
    wanted = wc.fingerprint({k: v for k, v in engine_flags.items() if k in wc.FINGERPRINT_FLAGS}, "")
    changed = held.differs(wanted)
    if changed:
        differ = ", ".join(changed)
        return f"{seen.unit} holds another fingerprint ({differ} differ): the engine would load from disk"
    return None


def unservable(engine_text: str, daemon_text: str | None, config: object) -> str | None:
    """What SGLang's daemon cannot serve, read off the units the host is asked to run (the laptop refused
    it already; an older laptop or a request written by hand did not): the same rules
    (sglang/weight_cache.py refusals). config: the checkpoint's config.json, None when not read."""
    try:
        flags = parse_unit_flags(engine_text)
    except FlagsError:
        return None
    private = any(_private_tmp(t) for t in (engine_text, daemon_text or ""))
    said = wc.refusals(flags, *wc.quant_of(config), "cuda", private)
    return f"the weight cache cannot serve this unit: {said[0]}" if said else None


def _private_tmp(text: str) -> bool:
    try:
        lines = list(unit_lines(text))
    except FlagsError:
        return False
    return any(s == "Service" and k == "PrivateTmp" and wc.private_tmp(v) for s, k, v in lines)


class _States(Protocol):
    def unit_state(self, unit: str) -> UnitState: ...


def check(systemd: _States, unit_dir: str, engine_unit: str, engine_text: str) -> str | None:
    """The verdict for the engine unit about to start; None when it is not a client of a daemon."""
    daemon = daemon_unit(engine_unit, engine_text)
    if daemon is None:
        return untied(engine_unit, engine_text)
    seen = look(unit_dir, daemon, systemd.unit_state(daemon).active_state, ready_dir(engine_text))
    return verdict(parse_unit_flags(engine_text), seen)


def look(unit_dir: str, unit: str, active_state: str, folder: str | None) -> DaemonSeen:
    """The daemon as the host has it: its unit file, state and ready files."""
    path = Path(unit_dir) / unit
    try:
        text: str | None = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        text = None
    return DaemonSeen(unit, text, active_state, tuple(_ready(folder) if folder else ()))


def _ready(folder: str) -> Sequence[Ready]:
    found = []
    for p in sorted(Path(folder).glob("*.ready")) if Path(folder).is_dir() else []:
        try:
            pid: int | None = int(p.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            pid = None
        found.append(Ready(str(p), pid, pid is not None and _alive(pid)))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
