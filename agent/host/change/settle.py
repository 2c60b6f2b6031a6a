"""Before a commit, with [weight_cache]: the start just verified is still the one that runs.

A daemon that crashes while the new start is checked comes back by its `Restart=always` (`RestartSec=10`,
agent/plan/weight_cache_unit.py) and restarts the engine with it (`PartOf=`). The watch follows restarts
made while it watches (host/watch/start.py), but a crash during the HTTP checks is seen by nobody: the
change would be committed as verified while its daemon is down, and the start it verified replaced a few
seconds later. So the commit first waits for the daemon to run again, then either keeps the start it
verified or watches and verifies the engine's new start (judged on its own, as any start).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from agent.host.watch.poll import wait_until
from agent.protocol.requests import ENGINE_BACK_S

UP = ("active", "reloading")
STARTING = ("activating", *UP)
GONE = ("inactive", "failed")  # and not waiting for its Restart=: nothing will start it again


class Settled(Enum):
    KEPT = "kept"  # the verified start still runs: commit
    RESTARTED = "restarted"  # a new start of the engine: watch and verify it
    DAEMON_DOWN = "daemon down"  # the daemon did not come back: roll back
    ENGINE_DOWN = "engine down"  # the engine was stopped with its daemon and not started again: roll back


@dataclass(frozen=True)
class Seen:
    """One look at both units."""

    daemon_active: str
    daemon_sub: str
    engine_active: str
    engine_invocation: str


def daemon_up(seen: Seen) -> bool:
    """Running; not failed and waiting for its Restart= (state "activating", sub-state "auto-restart")."""
    return seen.daemon_active in UP and seen.daemon_sub != "auto-restart"


def verdict(seen: Seen, verified: str) -> Settled | None:
    """Pure: what one look says, or None while it cannot tell yet (the daemon or the engine on its way)."""
    if not daemon_up(seen):
        return None
    if seen.engine_invocation != verified and seen.engine_active in STARTING:
        return Settled.RESTARTED
    if seen.engine_invocation == verified and seen.engine_active in UP:
        return Settled.KEPT
    return None  # stopped with the daemon, its new start not begun yet


def daemon_gone(seen: Seen) -> bool:
    """Stopped or failed with no restart pending (a person's `systemctl stop`): not worth waiting for."""
    return seen.daemon_active in GONE and seen.daemon_sub != "auto-restart"


def settle(
    look: Callable[[], Seen], verified: str, daemon_s: float, engine_s: float = ENGINE_BACK_S
) -> Settled:
    """Wait for the daemon (up to daemon_s: its restart delay and load), then for the engine to run again."""
    seen: list[Seen] = []

    def daemon_decided() -> bool:
        seen[:] = [look()]
        return daemon_up(seen[0]) or daemon_gone(seen[0])

    if not wait_until(daemon_decided, daemon_s) or not daemon_up(seen[0]):
        return Settled.DAEMON_DOWN
    found: list[Settled] = []

    def told() -> bool:
        v = verdict(look(), verified)
        found[:] = [v] if v is not None else []
        return v is not None

    return found[0] if wait_until(told, engine_s) else Settled.ENGINE_DOWN
