"""Where a transaction's events go: its JSON-lines log (for re-attach), a live copy, and the journal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from agent.protocol.events import Event, Stage

try:
    import syslog
except ImportError:  # pragma: no cover - not on Linux
    syslog = None  # type: ignore[assignment]


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventLog:
    """Appends each event to events.jsonl; an outcome is fsynced and also logged as `deployctl`."""

    def __init__(self, txn: str, path: Path | None, echo: TextIO | None = None) -> None:
        self.txn = txn
        self.path = path
        self.echo = echo
        self.seq = 0
        self.listeners: list[Callable[[Event], None]] = []
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the log

    def emit(self, stage: Stage | str, kind: str, message: str, **data: Any) -> Event:
        self.seq += 1
        event = Event(self.txn, self.seq, utc_now(), str(getattr(stage, "value", stage)), kind, message, data)
        line = event.to_json() + "\n"
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
            if kind in ("step", "outcome"):
                os.fsync(self._file.fileno())
        if self.echo is not None:
            self.echo.write(line)
            self.echo.flush()
        if kind == "outcome":
            journal_note(f"{message} (transaction {self.txn})")
        for listener in self.listeners:
            listener(event)
        return event

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def journal_note(message: str) -> None:
    """`journalctl -t deployctl` shows every outcome on the host, also of runs from cron."""
    if syslog is None:
        return
    try:
        syslog.openlog("deployctl", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_NOTICE, message)
    except OSError:  # no /dev/log: the events file still has it
        print(f"deployctl: {message}", file=sys.stderr)
