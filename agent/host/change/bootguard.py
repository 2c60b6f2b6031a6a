"""A boot guard for a group node's uncommitted change: its unit does not start at boot until the agent
has decided (keep the new unit, or restore the old one).

A rebooted node of an uncommitted change would otherwise start its new server at boot, and meet its
peers' old ones at the rendezvous. With the recovery record, the transaction writes a drop-in
`<unit>.d/50-deployctl-pending.conf` holding `ConditionPathExists=/run/deployctl/<unit>.go`, and that
marker first. /run is a tmpfs, empty after a boot: systemd then skips the unit's start (a condition that
does not hold leaves it inactive, not failed, and Restart= does not fire; systemd >= 244 says "start
condition unmet", every version since 2010 honours the condition: the test host runs 252). Within the
boot the agent runs in, the marker is there, so its own starts and Restart= work as before. The agent's
recovery writes the marker before it acts, and the drop-in goes with the record (commit, restore).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from agent.host.units import fsync_dir

DROP_IN = "50-deployctl-pending.conf"
RUN_DIR = Path("/run/deployctl")


def guard_text(marker: Path) -> str:
    return (
        "# deployctl: a change of this unit is not decided yet; the agent allows its start (and removes\n"
        "# this file) once it has decided. /run is empty after a boot: no start at boot until then.\n"
        f"[Unit]\nConditionPathExists={marker}\n"
    )


@dataclass(frozen=True)
class BootGuard:
    unit_dir: Path
    unit: str
    run_dir: Path = RUN_DIR

    @property
    def path(self) -> Path:
        return self.unit_dir / f"{self.unit}.d" / DROP_IN

    @property
    def marker(self) -> Path:
        return self.run_dir / f"{self.unit}.go"

    def allow(self) -> None:
        """This boot's agent has taken the change over: its own starts pass the condition."""
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.marker.touch()

    def arm(self) -> None:
        """The marker first (this boot's starts pass), then the drop-in, written atomically."""
        self.allow()
        folder = self.path.parent
        folder.mkdir(exist_ok=True, mode=0o755)
        tmp = folder / f".{DROP_IN}.tmp.{os.getpid()}"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w", encoding="utf-8") as f:
            f.write(guard_text(self.marker))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        fsync_dir(folder)

    def disarm(self) -> bool:
        """The change is decided: the drop-in goes (an empty folder of ours with it). Whether there was
        one (systemd, which loaded it, then needs a reload)."""
        if not self.path.exists():
            return False
        self.path.unlink()
        fsync_dir(self.path.parent)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()
        return True

    def armed(self) -> bool:
        return self.path.is_file()
