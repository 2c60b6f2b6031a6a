"""One deploy per unit at a time: flock(2) on a file under /run, released by the kernel if we die."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from agent.protocol.answers import Holder

PROC_LOCKS = "/proc/locks"


class Locked(Exception):
    """Another process holds the unit's lock; `holder` says who, since when, doing what."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(describe_holder(holder))
        self.holder = holder


def describe_holder(holder: Holder) -> str:
    if not holder:
        return "held by another process"
    return (
        f"held by pid {holder.get('pid')} since {holder.get('since')} "
        f"({holder.get('verb')}, transaction {holder.get('txn')})"
    )


class UnitLock:
    """Non-blocking by default: cron must never queue up behind a stuck deploy."""

    def __init__(self, run_dir: str | Path, unit: str) -> None:
        self.path = Path(run_dir) / f"{unit}.lock"
        self._fd: int | None = None

    def acquire(self, holder: Holder) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Locked(self.holder()) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder, sort_keys=True).encode(), 0)
        self._fd = fd

    def rewrite(self, holder: Holder) -> None:
        """Say who holds it anew (the lock is held: acquire wrote the first word)."""
        assert self._fd is not None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(holder, sort_keys=True).encode(), 0)

    def wait(
        self, holder: Holder, bound_s: float, sleep: Callable[[float], None], clock: Callable[[], float]
    ) -> None:
        """Blocking, up to `bound_s` (by `clock`): Locked when the holder still has it then."""
        end = clock() + bound_s
        while True:
            try:
                return self.acquire(holder)
            except Locked:
                if clock() >= end:
                    raise
            sleep(min(1.0, max(0.0, end - clock())))

    def holder(self) -> Holder:
        """The details the current holder wrote; {} when free or unreadable."""
        try:
            raw = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return cast(Holder, raw) if isinstance(raw, dict) else {}

    def is_held(self) -> bool:
        """Whether a process holds the lock, read from /proc/locks: asking must never take the lock,
        or a runner's exclusive try could fail as LOCKED while a read-only `status` looks."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        try:
            table = Path(PROC_LOCKS).read_text()
        except OSError:  # no /proc: fall back to a brief shared probe
            return self._probe()
        return _flock_held(table, st)

    def _probe(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _flock_held(table: str, st: os.stat_result) -> bool:
    """An exclusive flock on this file (device and inode) in a /proc/locks table.

    Lines read `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF` (the device as hex major:minor);
    a blocked waiter's line has `->` after the number and does not count.
    """
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == dev:
            return True
    return False
