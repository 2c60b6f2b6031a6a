"""A change's recovery record: written before its first job, cleared at commit, read by whoever recovers it.

StateDir (host/state.py) keeps it as `<state>/units/<unit>/pending.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.host.change.jobs import Job

# A recovery record's phase says what `recover` must do after a crash.
PHASE_WRITTEN = "written"  # the new unit is on disk: restore the backup
PHASE_RESTARTED = "restarted"  # the new unit was started: restore, restart, verify the old one
PHASE_VERIFIED = "verified"  # the new unit passed the gate: keep it, just commit
PHASE_ROLLING_BACK = "rolling_back"  # a rollback had begun: finish it
PHASES = (PHASE_WRITTEN, PHASE_RESTARTED, PHASE_VERIFIED, PHASE_ROLLING_BACK)


@dataclass(frozen=True)
class Record:
    txn: str
    unit: str
    phase: str
    backup: str | None  # file name of the backup in the unit directory; None: there was no unit
    new_sha256: str
    verb: str = "apply"
    started: str = ""
    wrote: bool = True  # whether the change wrote the unit file (not when it was already installed)
    # The service's invocation when the record was written: the same one at recovery time means the
    # service was never restarted since, so putting the file back is enough (no model load for nothing).
    invocation: str = ""
    # The change's unit jobs in order (host/change/jobs.py), written before the first runs, and how many
    # are done; a record from an agent before them has none.
    jobs: tuple[Job, ...] = ()
    done: int = 0


class CorruptRecord(Exception):
    """A recovery record that cannot be read: nothing may change until a person has looked."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"the recovery record {path} is unreadable ({detail})")
        self.path = path
