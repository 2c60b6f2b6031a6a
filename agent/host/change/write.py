"""The write step of the host transaction: back up, write (secrets, then the unit and the weight-cache
daemon's unit), reload, see that systemd loads what was written (else put it back and refuse), pre-warm."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

from agent.host.change.ports import Change, Ports, Result, Run
from agent.host.change.record import PHASE_RESTARTED, PHASE_WRITTEN
from agent.host.units import UnitWriteError
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Outcome, Stage
from agent.sglang.flags import parse_unit_flags, unit_lines

# systemd's unit folders searched before /etc/systemd/system (systemd.unit(5), "Unit File Load Path")
SEARCHED_BEFORE_ETC = ("system.control", "transient", "generator.early")


def write(p: Ports, run: Run, change: Change, secrets: dict[str, str | None]) -> Change | Result:
    """Back up, write (secrets, then the unit), reload: the change with its backup, ready to restart,
    or the Result of a write that failed or that systemd does not load."""
    new, current, live = change.new, p.files.read(p.unit), p.secrets.current()
    wrote = current != new or live != secrets or p.daemon.drift(p.req.daemon_text) is not None
    backup_name: str | None = None
    touched: dict[str, str | None] | None = None  # the live secrets, once this run began writing them
    try:
        if not wrote and p.req.group is None:
            # Written but not running as written: finish the start; go back to the last other unit.
            backup_name = last_different_backup(p, new)
            p.log.emit(Stage.COMPARE, "step", f"{p.unit} is installed but not running as written")
        if current is not None and backup_name is None:
            backup_name = backup(p)
        p.record(PHASE_WRITTEN, backup_name, new, wrote)
        if wrote:
            touched = live
            p.secrets.write(secrets)  # first: the unit that names them never runs without them
        write_units(p, current, new, backup_name, change.restored_from)
    except OSError as exc:
        return undo_write(p, exc, current, touched)
    p.files.prune(p.unit, p.req.keep_backups, protect=(backup_name, change.restored_from))
    p.secrets.prune({b.name for b in p.files.backups(p.unit)})
    p.log.emit(Stage.WRITE, "step", f"wrote {p.files.path(p.unit)}", sha256=sha256(new))
    p.systemd.daemon_reload()
    p.log.emit(Stage.RELOAD, "step", "systemd reloaded its units")
    elsewhere = loaded_elsewhere(p)
    if elsewhere is not None:
        return refuse_unloaded(p, elsewhere, backup_name, wrote)
    prewarm(p, run, new)
    p.record(PHASE_RESTARTED, backup_name, new, wrote)
    return replace(change, backup=backup_name)


def write_units(p: Ports, current: str | None, new: str, backup: str | None, restored: str | None) -> None:
    """The unit, atomically; with [weight_cache], its daemon's unit beside it (host/roles/daemon.py)."""
    if current != new:
        p.files.write(p.unit, new)
    p.daemon.write(current, new, backup, p.req.daemon_text, restored)


def backup(p: Ports) -> str:
    """The unit and its secrets copied under one backup name.

    A backup whose secrets could not be copied (disk full) is dropped before the error goes on:
    restoring it later would delete the secrets it lacks.
    """
    name = p.files.backup(p.unit, p.now()).name
    try:
        p.secrets.backup(name)
    except OSError:
        with contextlib.suppress(OSError):  # best effort: a read-only disk kept nothing to drop
            p.files.path(name).unlink(missing_ok=True)
            p.secrets.prune({b.name for b in p.files.backups(p.unit)})
        raise
    if p.req.group is not None and p.req.group.key:  # one change of several units: which one took it
        p.state.note_backup_group(p.unit, name, p.req.group.key, {b.name for b in p.files.backups(p.unit)})
    p.log.emit(Stage.BACKUP, "step", f"backed up to {name}", backup=name)
    return name


def undo_write(p: Ports, exc: OSError, current: str | None, live: dict[str, str | None] | None) -> Result:
    """A write failed (disk full, I/O error, read-only): put back what was there, from memory.

    Secrets are put back only if this run began writing them, and from the copy read before it
    did: a backup that failed half-way has missing copies, and a missing copy means "no such file".
    """
    reason = exc.strerror if isinstance(exc, UnitWriteError) else str(exc)
    if current is not None and p.files.read(p.unit) != current:  # never the case: atomic
        p.files.write(p.unit, current)
    if live is not None:
        try:
            p.secrets.write(live)
        except OSError as again:  # the record stays: the next run restores them from the backup
            return Result(Outcome.ERROR, f"{reason}; putting the secrets back failed too: {again}")
    p.clear_record()
    return Result(Outcome.ERROR, f"{reason}; {p.unit} left as it was")


def shadowed(p: Ports) -> Result | None:
    """Where systemd loads the unit from, before the first change: a drop-in that replaces ExecStart= would
    run its own command whatever we write (refused, nothing written); a copy in a folder it searches
    before ours would shadow whatever we write (refused, nothing written); one it searches after
    ours (/run/systemd/system, /usr/local/lib, /usr/lib) is overridden, and a rollback removes ours."""
    refused = overridden(p)
    if refused is not None:
        return refused
    state = p.systemd.unit_state(p.unit)
    loaded, ours = state.fragment_path, p.files.path(p.unit)
    if not loaded or loaded == str(ours):
        return None
    if Path(loaded).parent.name in SEARCHED_BEFORE_ETC:
        msg = f"systemd loads {p.unit} from {loaded}, which shadows {ours}"
        p.log.emit(Stage.COMPARE, "warning", f"refusing: {msg}")
        return Result(Outcome.ERROR, f"{msg}; nothing changed: remove that copy first")
    p.log.emit(Stage.COMPARE, "step", f"systemd loads {p.unit} from {loaded}; {ours} will override it")
    return None


def overridden(p: Ports) -> Result | None:
    """A drop-in that replaces ExecStart= runs its own command whatever the unit says: refused before
    anything (the comparison too: "up to date" would speak of a command systemd does not run)."""
    state = p.systemd.unit_state(p.unit)
    overriding = next((path for path in state.drop_in_paths if sets_exec_start(path)), None)
    if overriding is None:
        return None
    msg = f"the drop-in {overriding} sets ExecStart= for {p.unit}, overriding any unit written"
    p.log.emit(Stage.COMPARE, "warning", f"refusing: {msg}")
    return Result(Outcome.ERROR, f"{msg}; nothing changed: remove that drop-in's ExecStart= first")


def loaded_elsewhere(p: Ports) -> str | None:
    """Why what systemd loaded is not the file just written (another copy or a drop-in wins), or None.

    A unit of the same name in /run/systemd/system (or any folder before ours) shadows the file we
    wrote, and a drop-in that sets ExecStart= replaces our command: "applied" would be a lie.
    """
    state = p.systemd.unit_state(p.unit)
    ours = str(p.files.path(p.unit))
    if state.fragment_path and state.fragment_path != ours:
        return f"systemd loads {p.unit} from {state.fragment_path}, not from {ours}"
    for path in state.drop_in_paths:
        if sets_exec_start(path):
            return f"the drop-in {path} sets ExecStart= for {p.unit}, overriding the unit written"
    return None


def refuse_unloaded(p: Ports, why: str, backup: str | None, wrote: bool) -> Result:
    """Put the file back and reload; nothing was restarted, so nothing needs to be."""
    p.log.emit(Stage.RELOAD, "warning", f"refusing: {why}")
    if wrote:
        if backup is None:
            p.files.remove(p.unit)
        else:
            p.files.restore(p.unit, backup)
        p.secrets.restore(backup)
        p.daemon.restore(backup)  # [weight_cache]: the daemon's unit as it was
        p.systemd.daemon_reload()
    p.clear_record()
    return Result(Outcome.ERROR, f"{why}; {p.unit} put back as it was and nothing restarted")


def prewarm(p: Ports, run: Run, new: str) -> None:
    """Read the new unit's weights into the page cache while the old server still serves."""
    if not p.req.prewarm:
        return
    from agent.host.prewarm import GIB
    from agent.host.prewarm import prewarm as read_ahead

    try:
        margin = int(p.req.prewarm_margin_gib * GIB)
        # Bounded by the time the start itself may take to load the same weights.
        run.prewarmed = read_ahead(parse_unit_flags(new), margin, p.req.timeouts.weights_s)
    except Exception as exc:  # only ever a slower start: never a reason to stop the change
        p.log.emit(Stage.PREWARM, "warning", f"pre-warm failed: {type(exc).__name__}: {exc}")
        return
    p.log.emit(Stage.PREWARM, "step", run.prewarmed.describe(), **run.prewarmed.to_dict())


def last_different_backup(p: Ports, text: str) -> str | None:
    """The newest backup whose unit differs from `text`."""
    for b in p.files.backups(p.unit):
        if p.files.read(b.name) != text:
            return b.name
    return None


def sets_exec_start(path: str) -> bool:
    """Whether a drop-in file assigns ExecStart= (an empty assignment first, then its own command)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    # Read as systemd reads it: whitespace around "=", continuations, only the [Service] section.
    return any(section == "Service" and key == "ExecStart" for section, key, _ in unit_lines(text))
