"""The exit codes: the contract that cron jobs and scripts rely on (documented in the README)."""

from enum import IntEnum, unique


@unique
class ExitCode(IntEnum):
    OK = 0  # applied, or already up to date
    INTERNAL = 1  # a bug in deployctl
    USAGE = 2  # bad input or usage: bad value, unknown host, missing or unreadable file
    UNREACHABLE = 3  # host unreachable or SSH authentication failed
    ROLLED_BACK = 4  # change rejected and rolled back; the old service is healthy
    ROLLBACK_FAILED = 5  # rollback failed: a person must act
    LOCKED = 6  # another deploy holds the unit's lock
    REFUSED = 7  # the host refused the change before touching it (unit edited by hand, disk full...)
    NOT_FEASIBLE = 8  # plan: the plan cannot reach the target (printed either way)
    OUTPUT_LOST = 9  # stdout could not be written (a full disk): the command ran, its output is incomplete
    INTERRUPTED = 130  # interrupted (Ctrl-C)
    PIPE_CLOSED = 141  # stdout's reader went away before the command knew its outcome
