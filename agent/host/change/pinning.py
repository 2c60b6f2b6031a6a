"""One start that pins host memory at a time on a host: services that share a host start one after another.

SGLang checks a HiCache host pool against the host's free memory (srt/mem_cache/host_memory.py) and only then
allocates and pins it (srt/mem_cache/pool_host/base.py:247-281: the check, the `Allocating ... host pool`
line, then init_kv_buffer). Two services that start at once both pass the check on the same free memory and
then pin more than the host holds; ranks that check while another pins are charged twice (sglang#38156).
The host plan (plan/hostbudget.py) budgets the services as started one after another, so a change whose
new or old unit pins host memory (HiCache, or a disaggregated decode's default retraction pool,
srt/mem_cache/kv_cache_builder.py) holds a lock of the whole host from before its first write until it has
committed or rolled back (every start it makes, the old unit's too, has pinned by then); a second such
change on the host waits for it, at most as long as its own start may take, then stops with nothing changed.
A group's node takes it too (another service's change on the host may be pinning), but does not wait for a
member of its own group that holds it, asked at every try: that member waits for this one at the group's
barrier, and the group's own machine orders its members. It goes on as that holding's guest (Guests) to its
own end, which may come after the member's release (its rollback restarts the old unit): whoever takes the
lock next waits for every guest to leave, and says its group only then, so no other group's node joins it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from agent.host.change.ports import Ports, Result
from agent.host.change.record import CorruptRecord
from agent.host.lock import Locked, UnitLock, describe_holder
from agent.protocol.answers import Holder
from agent.protocol.events import Outcome, Stage
from agent.protocol.requests import host_start_wait_s
from agent.sglang.flags import FlagsError, FlagValue, parse_unit_flags

LOCK_NAME = "host-memory-start"  # <run dir>/host-memory-start.lock: no unit name ends so
OFF = (False, "false", "False", "0")


def _on(flags: dict[str, FlagValue], *names: str) -> bool:
    return any(name in flags and flags[name] not in OFF for name in names)


def pins_host_memory(unit_text: str | None) -> bool:
    """The unit's server pins a host pool at start: HiCache on, a decode's KV offload (its own host pool,
    srt/disaggregation/decode_kvcache_offload_manager.py:116), or a decode whose retraction backup is a host
    pool: asked for, or SGLang's default where it resolves so (kv_cache_builder.py:226-241: cpu_tensor under
    the decode radix cache or priority preemption; an MLA model's, not told by the unit, is taken to pin)."""
    if not unit_text:
        return False
    try:
        flags = parse_unit_flags(unit_text)
    except FlagsError:
        return False
    if _on(flags, "enable-hierarchical-cache", "enable-hicache"):
        return True
    if flags.get("disaggregation-mode") != "decode":
        return False
    if _on(flags, "disaggregation-decode-enable-offload-kvcache"):
        return True
    backup = flags.get("disaggregation-decode-retraction-backup")
    if backup is not None:
        return backup not in ("cpu_tensor", "none")
    preempts = _on(flags, "enable-priority-scheduling") and not _on(flags, "disable-priority-preemption")
    return not (preempts or _on(flags, "disaggregation-decode-enable-radix-cache"))


def bound_s(p: Ports) -> float:
    """How long a change waits for another's: as long as that one may hold the host's lock within these
    bounds, at least a minute (the laptop's conversation bound counts it: protocol/requests.py)."""
    return host_start_wait_s(p.req.timeouts, p.req.smoke.timeout_s)


@contextlib.contextmanager
def one_start_at_a_time(p: Ports, installed: str | None, new: str) -> Iterator[Result | None]:
    """Held around a change whose units pin host memory; yields a LOCKED result (nothing changed) when
    another service's change kept the host's lock past the bound, else None while held."""
    if not (pins_host_memory(new) or pins_host_memory(installed)):
        yield None
        return
    with _held(p, "starts") as waited:
        yield waited


class Guests:
    """The group's nodes that go on while a member of their own group holds the host's lock: each holds a
    shared flock of <run dir>/host-memory-start.guests.lock to its change's end (its rollback's start
    too); whoever takes the lock next waits until none is left (the kernel drops a dead one's)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / f"{LOCK_NAME}.guests.lock"
        self._fd: int | None = None

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def join(self) -> bool:
        """False while a holder is asking whether any guest is left."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def leave(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def empty(self) -> bool:
        """No guest left: an exclusive try, dropped at once."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True


def group_key(p: Ports) -> str | None:
    """The key of the group a node belongs to (its txn, which a [nodes] group shares, where unset)."""
    return None if p.req.group is None else p.req.group.key or p.txn


def own_group_holds(p: Ports, lock: UnitLock) -> bool:
    """A group's node whose own group's member holds the host's lock (waiting would deadlock)."""
    key = group_key(p)
    return key is not None and lock.is_held() and lock.holder().get("group") == key


def _taken(p: Ports, lock: UnitLock, guests: Guests) -> bool:
    """The host's lock taken within bound_s: True; False where this node joined a member of its own group
    that holds it (asked at every try: that member may take it while this node waits for another
    service's); Locked when another service's change keeps it, or its guests stay, past the bound."""
    end = p.monotonic() + bound_s(p)
    while not _joined(p, lock, guests):
        try:
            lock.acquire(_me(p))  # its group said only once no other group's guest is left
        except Locked:
            if p.monotonic() >= end:
                raise
        else:
            _drained(p, lock, guests, end)
            return True
        p.wait(min(1.0, max(0.0, end - p.monotonic())))
    return False


def _joined(p: Ports, lock: UnitLock, guests: Guests) -> bool:
    """A group's node joined its own member's holding: its guest's flock is taken before it asks who holds
    the lock, so whoever takes the lock after that answer waits for this node's end (_drained)."""
    if group_key(p) is None or not guests.join():
        return False
    if own_group_holds(p, lock):
        return True
    guests.leave()
    return False


def _drained(p: Ports, lock: UnitLock, guests: Guests, end: float) -> None:
    """Wait, holding the lock, for the guests of the group that held it before to end; then say this
    node's group (its own members may join from then on). Locked, the lock released, past `end`."""
    while not guests.empty():
        if p.monotonic() >= end:
            lock.release()
            raise Locked({"unit": "a member of the group that held it before"})
        p.wait(min(1.0, max(0.0, end - p.monotonic())))
    key = group_key(p)
    if key is not None:
        lock.rewrite({**_me(p), "group": key})


def recovery_pins(p: Ports) -> bool:
    """An earlier run's change left a record whose recovery may restart a unit that pins host memory (the
    installed unit, kept and started again, or its backup, restored and restarted); a group's node is
    ordered by its group's own machine."""
    if p.req.group is not None:
        return False
    try:
        record = p.state.load_record(p.unit)
    except CorruptRecord:
        return False  # nothing restarts: the verb stops on it
    if record is None:
        return False
    backup = p.files.read(record.backup) if record.backup else None
    return pins_host_memory(p.files.read(p.unit)) or pins_host_memory(backup)


@contextlib.contextmanager
def recovering(p: Ports) -> Iterator[Result | None]:
    """Held around a recovery that may restart a unit that pins host memory: the crash path's start waits
    for another service's start on the host as a change's does (LOCKED past the bound: nothing changed)."""
    if not recovery_pins(p):
        yield None
        return
    with _held(p, "is recovered") as waited:
        yield waited


def _me(p: Ports) -> Holder:
    return {
        "pid": os.getpid(),
        "since": p.now().isoformat(),
        "verb": p.req.verb,
        "txn": p.txn,
        "unit": p.unit,
    }


@contextlib.contextmanager
def _held(p: Ports, doing: str) -> Iterator[Result | None]:
    """The host's lock, waited for at most bound_s (or joined as its own group's guest); a LOCKED result
    when another kept it past that."""
    lock, guests = UnitLock(p.run_dir, LOCK_NAME), Guests(p.run_dir)
    if lock.is_held() and not own_group_holds(p, lock):
        other = lock.holder().get("unit", "another service")
        p.log.emit(Stage.LOCK, "step", f"waiting for {other}'s start on this host to finish: no two services "
                   "pin host memory at once (sglang#38156)")  # fmt: skip
    try:
        taken = _taken(p, lock, guests)
    except Locked as exc:
        msg = (
            f"another service's start on this host pins host memory ({describe_holder(exc.holder)}, "
            f"{exc.holder.get('unit', '?')}) for longer than this start may take; nothing changed: re-run"
        )
        yield Result(Outcome.LOCKED, msg)
        return
    if taken:
        p.log.emit(Stage.LOCK, "step", f"holding the host's memory lock while {p.unit} {doing}",
                   lock=str(lock.path))  # fmt: skip
    else:
        p.log.emit(Stage.LOCK, "step", f"{lock.holder().get('unit', 'a member')} of this node's group holds "
                   "the host's memory lock: it waits for this node at the group's barrier")  # fmt: skip
    try:
        yield None
    finally:
        lock.release()
        guests.leave()  # either: the one not taken is a no-op
