"""One deploy per unit at a time: flock(2) on a file under /run, released by the kernel if we die."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any


class Locked(Exception):
    """Another process holds the unit's lock; `holder` says who, since when, doing what."""

    def __init__(self, holder: dict[str, Any]) -> None:
        super().__init__(describe_holder(holder))
        self.holder = holder


def describe_holder(holder: dict[str, Any]) -> str:
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

    def acquire(self, holder: dict[str, Any]) -> None:
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

    def holder(self) -> dict[str, Any]:
        """The details the current holder wrote; {} when free or unreadable."""
        try:
            raw = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def is_held(self) -> bool:
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
