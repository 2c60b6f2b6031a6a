"""A stale lock cannot exist: the kernel drops a dead holder's flock, and a live one is named in full."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.host.lock import Locked, UnitLock

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Takes the lock, says so, then waits to be killed (or leaves by the given way without releasing).
HOLDER = """
import json, os, sys, time
from agent.host.lock import UnitLock
run_dir, unit, holder, leave = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
lock = UnitLock(run_dir, unit)
lock.acquire({**holder, "pid": os.getpid()})
print("locked", flush=True)
if leave == "exit":
    os._exit(3)  # no release(), no cleanup: only the kernel can drop the lock
if leave == "crash":
    raise SystemExit("crashed")
time.sleep(60)
"""


def hold(run_dir: Path, unit: str, holder: dict[str, str], leave: str = "wait") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir), unit, json.dumps(holder), leave],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


UNITS = st.from_regex(r"[a-z][a-z0-9_.@-]{0,20}\.service", fullmatch=True)
TXNS = st.from_regex(r"20[0-9]{6}T[0-9]{6}Z-[0-9a-f]{6}", fullmatch=True)
VERBS = st.sampled_from(["apply", "rollback", "recover"])
ENDS = st.sampled_from(["SIGKILL", "SIGTERM", "SIGSEGV", "exit", "crash"])


@settings(max_examples=12, deadline=None)
@given(UNITS, TXNS, VERBS, ENDS)
def test_a_dead_holder_never_leaves_a_stale_lock(
    tmp_path_factory: pytest.TempPathFactory, unit: str, txn: str, verb: str, end: str
) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    holder = {"txn": txn, "verb": verb, "since": "2026-01-01T00:00:00.000Z", "unit": unit}
    proc = hold(run_dir, unit, holder, leave="wait" if end.startswith("SIG") else end)
    if end.startswith("SIG"):
        # While it lives: the next acquire fails at once and names the holder.
        with pytest.raises(Locked) as caught:
            UnitLock(run_dir, unit).acquire({"pid": os.getpid(), "txn": "other", "verb": "apply"})
        assert caught.value.holder["pid"] == proc.pid
        assert (caught.value.holder["txn"], caught.value.holder["verb"]) == (txn, verb)
        assert (
            f"pid {proc.pid}" in str(caught.value) and txn in str(caught.value) and verb in str(caught.value)
        )
        assert UnitLock(run_dir, unit).is_held()
        proc.send_signal(getattr(signal, end))
    proc.wait(timeout=10)
    # Dead: its details are still in the file (it never released), yet the lock is free at once.
    lock = UnitLock(run_dir, unit)
    assert lock.holder()["pid"] == proc.pid
    assert not lock.is_held()
    started = time.monotonic()
    lock.acquire({"pid": os.getpid(), "txn": "next", "verb": "apply"})
    try:
        assert time.monotonic() - started < 0.5
        assert lock.holder()["pid"] == os.getpid()
    finally:
        lock.release()
    assert not lock.is_held() and lock.holder() == {}


def test_a_lock_in_another_process_blocks_only_its_own_unit(tmp_path: Path) -> None:
    proc = hold(tmp_path, "sglang.service", {"txn": "20260101T000000Z-abcdef", "verb": "apply"})
    try:
        other = UnitLock(tmp_path, "other.service")
        other.acquire({"pid": os.getpid()})
        other.release()
        with pytest.raises(Locked):
            UnitLock(tmp_path, "sglang.service").acquire({"pid": os.getpid()})
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_asking_whether_the_lock_is_held_never_makes_an_acquire_fail(tmp_path: Path) -> None:
    """A read-only `status` looks at the lock while a runner takes it: the runner must never see LOCKED."""
    stop = threading.Event()

    def look() -> None:
        lock = UnitLock(tmp_path, "sglang.service")
        while not stop.is_set():
            lock.is_held()

    lookers = [threading.Thread(target=look) for _ in range(2)]
    for t in lookers:
        t.start()
    failures = 0
    try:
        for _ in range(300):
            lock = UnitLock(tmp_path, "sglang.service")
            try:
                lock.acquire({"pid": os.getpid()})
            except Locked:
                failures += 1
                continue
            assert lock.is_held()
            lock.release()
    finally:
        stop.set()
        for t in lookers:
            t.join()
    assert failures == 0
