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


def daemon_unit(engine_text: str) -> str | None:
    """The daemon an engine unit is bound to: its BindsTo= when it runs in client mode."""
    try:
        flags = parse_unit_flags(engine_text)
        lines = list(unit_lines(engine_text))
    except FlagsError:
        return None
    if flags.get("weight-cache-mode") != "client":
        return None
    return next((v for s, k, v in lines if s == "Unit" and k == "BindsTo" and v.endswith(".service")), None)


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
    dead = [r.path for r in seen.ready if not r.alive]
    if dead or not seen.ready:
        said = f"a dead PID in {dead[0]}" if dead else "no ready file"
        return f"{seen.unit} runs but is not ready ({said})"
    try:
        held = wc.fingerprint(parse_unit_flags(seen.text), "")
    except FlagsError as exc:
        return f"{seen.unit}: its flags cannot be read: {exc}"
    wanted = wc.fingerprint({k: v for k, v in engine_flags.items() if k in wc.FINGERPRINT_FLAGS}, "")
    changed = held.differs(wanted)
    if changed:
        differ = ", ".join(changed)
        return f"{seen.unit} holds another fingerprint ({differ} differ): the engine would load from disk"
    return None


class _States(Protocol):
    def unit_state(self, unit: str) -> UnitState: ...


def check(systemd: _States, unit_dir: str, engine_text: str) -> str | None:
    """The verdict for the engine unit about to start; None when it is not a client of a daemon."""
    daemon = daemon_unit(engine_text)
    if daemon is None:
        return None
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
