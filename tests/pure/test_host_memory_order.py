"""Services that share a host start one after another when their units pin host memory (HiCache's host
pool, a decode's default retraction pool): no two pin at once (sglang#38156). A change holds the host's
lock from before its first write to its end, every start it makes (the rollback's too) inside it; a second
change waits, and stops with nothing changed when the first outlasts its own start's bound."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.change.pinning import LOCK_NAME, bound_s, pins_host_memory
from agent.host.lock import UnitLock
from agent.protocol.events import Outcome
from agent.protocol.requests import HOST_START_WAIT_MIN_S as MIN_WAIT_S
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, Timeouts, conversation_bound_s
from tests.pure.txnfakes import UNIT, Host, Script, unit_text

OLD, NEW, CRASH = 100_000, 200_000, 300_000


def hicache(context: int) -> str:
    return unit_text(context).replace("--context-length", "--enable-hierarchical-cache --context-length")


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
    h.install(h.etc, hicache(OLD))
    return h


def lock_of(host: Host) -> UnitLock:
    return UnitLock(host.root / "run/deployctl", LOCK_NAME)


def other_service_starts(host: Host) -> UnitLock:
    """Another service of the host in the middle of its own HiCache start: it holds the host's lock."""
    other = lock_of(host)
    other.acquire({"pid": 4242, "unit": "code.service", "verb": "apply", "txn": "t-other"})
    return other


def watch_starts(host: Host) -> list[str]:
    """At each start this change makes, who holds the host's lock."""
    seen: list[str] = []
    restart, start = host.systemd.restart, host.systemd.start

    def holder() -> str:
        lock = lock_of(host)
        return str(lock.holder().get("unit")) if lock.is_held() else "nobody"

    def on_restart(unit: str, timeout: float):  # type: ignore[no-untyped-def]
        seen.append(holder())
        return restart(unit, timeout)

    def on_start(unit: str, timeout: float):  # type: ignore[no-untyped-def]
        seen.append(holder())
        return start(unit, timeout)

    host.systemd.restart, host.systemd.start = on_restart, on_start  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("context", [NEW, CRASH], ids=["applied", "rolled back"])
def test_every_start_of_a_hicache_change_holds_the_hosts_lock(host: Host, context: int) -> None:
    seen = watch_starts(host)
    result = host.transaction(host.request(context, unit_text=hicache(context))).apply()
    assert result.outcome is (Outcome.APPLIED if context == NEW else Outcome.ROLLED_BACK), result.message
    assert seen and set(seen) == {UNIT}  # the new start and the rollback's start of the old one alike
    assert not lock_of(host).is_held()  # released at the end, however it ended


def test_a_second_service_waits_for_the_first_to_finish_pinning_then_starts(host: Host) -> None:
    other = other_service_starts(host)
    seen = watch_starts(host)
    order: list[str] = []
    t = host.transaction(host.request(NEW, unit_text=hicache(NEW)))

    def wait(seconds: float) -> None:  # the first service's start ends while this one waits
        order.append("waited")
        other.release()

    t.ports.wait = wait
    result = t.apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert order == ["waited"] and seen == [UNIT]  # its start came after the other's, under its own hold
    assert any("waiting for code.service" in e.message for e in t.events)


def test_a_first_service_that_outlasts_the_bound_stops_the_second_with_nothing_changed(host: Host) -> None:
    other_service_starts(host)
    t = host.transaction(host.request(NEW, unit_text=hicache(NEW)))
    clock = [0.0]
    t.ports.monotonic = lambda: clock[0]
    t.ports.wait = lambda s: clock.__setitem__(0, clock[0] + max(s, 1.0))
    result = t.apply()
    assert result.outcome is Outcome.LOCKED and "code.service" in result.message, result.message
    assert "nothing changed" in result.message
    assert host.systemd.restarts == 0 and (host.etc / UNIT).read_text() == hicache(OLD)
    assert not list(host.etc.glob(f"{UNIT}.bak.*"))  # not even a backup: it stopped before the first write
    # the request's timeouts are 0 here: the other's two restart jobs and its smoke test, at least a minute
    smoke = t.ports.req.smoke.timeout_s
    assert clock[0] >= bound_s(t.ports) == max(MIN_WAIT_S, 2 * RESTART_JOB_TIMEOUT_S + smoke)
    long = replace(t.ports, req=replace(t.ports.req, timeouts=Timeouts()))
    one_start = RESTART_JOB_TIMEOUT_S + 1800 + 600 + 900
    # otherwise as long as the other may hold the lock: its pre-warm, its start, the rollback's, its smoke
    assert bound_s(long) == 1800 + 2 * one_start + smoke
    # the laptop waits for the agent's answer that long more (its conversation bound counts the wait)
    assert (
        conversation_bound_s(long.req)
        - conversation_bound_s(replace(long.req, timeouts=Timeouts(0, 0, 0, 0)))
        > 3300
    )


def test_a_change_that_pins_nothing_does_not_wait(tmp_path: Path) -> None:
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, unit_text(OLD))
    other_service_starts(host)
    t = host.transaction(host.request(NEW))
    t.ports.wait = lambda s: pytest.fail("a change without a host pool waited")
    assert t.apply().outcome is Outcome.APPLIED


@given(
    st.sampled_from(["", "--enable-hierarchical-cache", "--enable-hicache"]),
    st.sampled_from(["", "--disaggregation-mode decode", "--disaggregation-mode prefill"]),
    st.sampled_from(["", "cpu_tensor", "none", "host_pool"]),
)
def test_what_pins_host_memory(hc: str, mode: str, backup: str) -> None:
    flags = " ".join(
        x for x in (hc, mode, f"--disaggregation-decode-retraction-backup {backup}" if backup else "") if x
    )
    text = unit_text(NEW).replace("--context-length", f"{flags} --context-length")
    decode_pool = "decode" in mode and backup not in ("cpu_tensor", "none")
    assert pins_host_memory(text) == (bool(hc) or decode_pool)


def test_a_group_node_does_not_wait_for_its_own_groups_member(tmp_path: Path) -> None:
    """Two members of one [pd] group on one host: the one holding the host's lock waits at the group's
    barrier for the other, so the other must not wait for the lock (a deadlock until the bound), while a
    node of another group still waits for it (its holder named by its group's key)."""
    from agent.host.change import pinning
    from agent.protocol.requests import Group

    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, hicache(OLD))
    member = lock_of(host)
    member.acquire(
        {"pid": 4242, "unit": "pd-decode-1.service", "verb": "apply", "txn": "t-1", "group": "g-1"}
    )
    waits: list[float] = []
    for key, waited in (("g-1", False), ("g-2", True)):
        t = host.transaction(host.request(NEW, unit_text=hicache(NEW), group=Group(0, 2, 60.0, key=key)))
        t.ports.wait = waits.append
        t.ports.monotonic = lambda: 1e9 if waits else 0.0  # the bound passes at the first wait
        with pinning.one_start_at_a_time(t.ports, hicache(OLD), hicache(NEW)) as locked:
            assert (locked is not None) is waited and bool(waits) is waited
    member.release()


def test_a_guest_of_its_groups_holding_keeps_the_next_holder_waiting_until_its_own_end(
    tmp_path: Path,
) -> None:
    """A group's node that went on under its own member's lock may still be starting (its rollback restarts
    the old unit) when that member releases: another service's change that takes the lock then waits for it
    (LOCKED past its bound, nothing changed), and goes on once it has ended."""
    from agent.host.change import pinning
    from agent.protocol.requests import Group

    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, hicache(OLD))
    member = lock_of(host)
    member.acquire({"pid": 4242, "unit": "pd-prefill.service", "verb": "apply", "txn": "t-1", "group": "g-1"})
    guest = host.transaction(host.request(NEW, unit_text=hicache(NEW), group=Group(1, 2, 60.0, key="g-1")))
    waits: list[float] = []

    def other() -> object:
        t = host.transaction(host.request(NEW, unit_text=hicache(NEW)), txn="t-other")
        t.ports.wait = waits.append
        t.ports.monotonic = lambda: 1e9 if waits else 0.0  # the bound passes at the first wait
        return t.ports

    with pinning.one_start_at_a_time(guest.ports, hicache(OLD), hicache(NEW)) as joined:
        assert joined is None and not waits  # went on beside its member, without waiting
        member.release()  # the member has ended; the guest has not
        with pinning.one_start_at_a_time(other(), hicache(OLD), hicache(NEW)) as locked:  # type: ignore[arg-type]
            assert locked is not None and locked.outcome is Outcome.LOCKED
        assert waits and not lock_of(host).is_held()  # it gave the lock back
    waits.clear()
    with pinning.one_start_at_a_time(other(), hicache(OLD), hicache(NEW)) as locked:  # type: ignore[arg-type]
        assert locked is None and not waits and lock_of(host).holder().get("unit") == UNIT


def test_a_holder_names_its_group_only_once_no_other_groups_guest_is_left(tmp_path: Path) -> None:
    """Group g-2's node takes the lock while g-1's guest is still on: it waits for that guest before it
    says g-2 in the lock (a g-2 node joins only then), and a g-1 node never joins g-2's holding."""
    from agent.host.change import pinning
    from agent.protocol.requests import Group

    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    run = host.root / "run/deployctl"
    old_guest = pinning.Guests(run)
    assert old_guest.join()
    node = host.transaction(host.request(NEW, unit_text=hicache(NEW), group=Group(0, 2, 60.0, key="g-2")))
    said: list[object] = []

    def wait(_: float) -> None:  # while it waits, the lock names no group yet; then the guest ends
        said.append(lock_of(host).holder().get("group"))
        old_guest.leave()

    node.ports.wait, node.ports.monotonic = wait, lambda: 0.0
    with pinning.one_start_at_a_time(node.ports, hicache(OLD), hicache(NEW)) as locked:
        assert locked is None and said == [None] and lock_of(host).holder().get("group") == "g-2"
        stranger = host.transaction(
            host.request(NEW, unit_text=hicache(NEW), group=Group(1, 2, 60.0, key="g-1"))
        )
        stranger.ports.wait, stranger.ports.monotonic = said.append, lambda: 1e9 if len(said) > 1 else 0.0
        with pinning.one_start_at_a_time(stranger.ports, hicache(OLD), hicache(NEW)) as refused:
            assert refused is not None and refused.outcome is Outcome.LOCKED
