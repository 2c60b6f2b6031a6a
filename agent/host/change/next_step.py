"""The decider of the single-host change: what the driver does next, from what the steps observed.

Pure: no ports, no clock. The driver (host/change/transaction.py) runs the step this returns, records what
the step saw in a new `Observed`, and asks again, until a step ends the change (commit or roll back). A
group's node runs the same steps, but the group machine (protocol/groupmachine.py, through
host/roles/groupstep.py) decides how it ends: `after_group` names the step for the phase the machine ended in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from agent.host.change.decide import Action
from agent.protocol.groupmachine import Phase


class Step(Enum):
    RESTART = "restart"  # restart the unit (drained where it serves), watch it, gate it
    VERIFY = "verify"  # the request's checks against the server the watch found ready
    COMMIT = "commit"  # keep the new unit; clear the recovery record
    ROLL_BACK = "roll back"  # restore the backup and prove the old unit again
    STAY_STOPPED = "stay stopped"  # a group's node in doubt: stopped, with its record, for the next run


class Seen(Enum):
    NOT_YET = "not yet"
    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class Observed:
    """What the steps have seen so far: the watch's verdict (READY passed, anything else failed) and the
    verification's result."""

    watch: Seen = Seen.NOT_YET
    verify: Seen = Seen.NOT_YET


def watched(action: Action) -> Observed:
    """What a finished watch tells: READY passed, any other end failed."""
    return Observed(Seen.PASSED if action is Action.READY else Seen.FAILED)


def verified(seen: Observed, failure: str | None) -> Observed:
    """What the verification tells: no failure passed."""
    return replace(seen, verify=Seen.PASSED if failure is None else Seen.FAILED)


def next_step(seen: Observed) -> Step:
    """Restart first; a failed watch or a failed verification rolls back; a verified unit is committed."""
    if seen.watch is Seen.NOT_YET:
        return Step.RESTART
    if seen.watch is Seen.FAILED or seen.verify is Seen.FAILED:
        return Step.ROLL_BACK
    if seen.verify is Seen.NOT_YET:
        return Step.VERIFY
    return Step.COMMIT


def after_group(phase: Phase) -> Step:
    """A group's node once the group machine has spoken: committed keeps the new unit, in doubt stays
    stopped (never a generation of its own), anything else rolls back."""
    if phase is Phase.COMMITTED:
        return Step.COMMIT
    if phase is Phase.IN_DOUBT:
        return Step.STAY_STOPPED
    return Step.ROLL_BACK
