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
member of its own group that holds it: that member waits for this one at the group's barrier, and the
group's own machine orders its members.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

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
    if not (pins_host_memory(new) or pins_host_memory(installed)) or own_group_holds(p):
        yield None
        return
    with _held(p, "starts") as waited:
        yield waited


def group_key(p: Ports) -> str | None:
    """The key of the group a node belongs to (its txn, which a [nodes] group shares, where unset)."""
    return None if p.req.group is None else p.req.group.key or p.txn


def own_group_holds(p: Ports) -> bool:
    """A group's node whose own group's member holds the host's lock (waiting would deadlock)."""
    key = group_key(p)
    lock = UnitLock(p.run_dir, LOCK_NAME)
    return key is not None and lock.is_held() and lock.holder().get("group") == key


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


@contextlib.contextmanager
def _held(p: Ports, doing: str) -> Iterator[Result | None]:
    """The host's lock, waited for at most bound_s; a LOCKED result when another kept it past that."""
    lock = UnitLock(p.run_dir, LOCK_NAME)
    me: Holder = {
        "pid": os.getpid(),
        "since": p.now().isoformat(),
        "verb": p.req.verb,
        "txn": p.txn,
        "unit": p.unit,
    }
    key = group_key(p)
    if key is not None:
        me["group"] = key
    if lock.is_held():
        other = lock.holder()
        p.log.emit(Stage.LOCK, "step", f"waiting for {other.get('unit', 'another service')}'s start on this "
                   "host to finish: no two services pin host memory at once (sglang#38156)")  # fmt: skip
    try:
        lock.wait(me, bound_s(p), p.wait, p.monotonic)
    except Locked as exc:
        msg = (
            f"another service's start on this host pins host memory ({describe_holder(exc.holder)}, "
            f"{exc.holder.get('unit', '?')}) for longer than this start may take; nothing changed: re-run"
        )
        yield Result(Outcome.LOCKED, msg)
        return
    p.log.emit(
        Stage.LOCK, "step", f"holding the host's memory lock while {p.unit} {doing}", lock=str(lock.path)
    )
    try:
        yield None
    finally:
        lock.release()
