"""Follow one unit's journal by polling journalctl; only lines of one invocation come through."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

FIELDS = "MESSAGE,_SYSTEMD_INVOCATION_ID,__REALTIME_TIMESTAMP"
CALL_TIMEOUT_S = 30.0


class JournalError(Exception):
    """journalctl could not be run or failed in a way that polling again will not fix."""


@dataclass(frozen=True)
class JournalLine:
    """One journal record of the followed unit."""

    message: str
    cursor: str
    realtime_us: int
    invocation_id: str


def _message(value: Any) -> str:
    # journalctl's JSON gives MESSAGE as a list of byte values when it is not valid UTF-8.
    if isinstance(value, list):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _parse(text: str) -> list[JournalLine]:
    lines = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        record = json.loads(raw)
        lines.append(
            JournalLine(
                message=_message(record.get("MESSAGE")),
                cursor=str(record["__CURSOR"]),
                realtime_us=int(record.get("__REALTIME_TIMESTAMP", 0)),
                invocation_id=str(record.get("_SYSTEMD_INVOCATION_ID", "")),
            )
        )
    return lines


class Journal:
    """The system journal, read with journalctl (optionally from a journal folder of another system)."""

    def __init__(
        self,
        directory: str | None = None,
        journalctl: str = "journalctl",
        poll_s: float = 0.02,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        # --all: `-o json` gives null for a field over 4096 bytes without it, and real SGLang's server_args=
        # line (its resolved mem_fraction_static among ~15 KB of settings) is one.
        self._base = [journalctl, "--no-pager", "-q", "--all"] + (
            [f"--directory={directory}"] if directory else []
        )
        self.poll_s = poll_s  # how long follow() waits after a poll that found nothing
        self.call_timeout_s = call_timeout_s  # one journalctl call, however it reads (a stalled disk)

    def cursor(self) -> str | None:
        """The cursor of the newest record in the whole journal; None when it is empty."""
        records = self._query(["-n", "1"])
        return records[-1].cursor if records else None

    def follow(
        self,
        unit: str,
        after_cursor: str | None,
        invocation_id: str | None,
        deadline_s: float,
        since_us: int | None = None,
    ) -> Iterator[JournalLine | None]:
        """Yield the unit's new lines as they come, and None after each poll that found nothing.

        deadline_s is a time.monotonic() value; the iterator ends there. With invocation_id only that
        start's lines pass, so the old process's last words never do. Without it, lines after
        after_cursor pass; since_us (realtime) is where to restart if that cursor has been rotated away.
        """
        matches = self._matches(unit, invocation_id)
        # --cursor, not --after-cursor: journalctl's --after-cursor skips the first entry after the
        # cursor even when the cursor's own entry does not match the filter, losing the first line
        # of the new start. We drop the cursor's own entry ourselves. The invocation id alone already
        # selects exactly the new start, so then no starting cursor is needed (nor can it go stale).
        position = [f"--cursor={after_cursor}"] if after_cursor and not invocation_id else []
        seen: set[str] = {after_cursor} if after_cursor else set()
        while time.monotonic() < deadline_s:
            try:
                records = self._query([*matches, *position])
            except JournalError:
                if not position:
                    raise
                # Our cursor no longer exists (journal vacuumed): restart from the time instead.
                position = [] if invocation_id else [f"--since=@{(since_us or 0) / 1e6:.6f}"]
                continue
            fresh = [r for r in records if r.cursor not in seen and self._wanted(r, invocation_id)]
            for record in fresh:
                seen.add(record.cursor)
                yield record
            if records:
                position = [f"--cursor={records[-1].cursor}"]
            if not fresh:
                yield None
                time.sleep(max(0.0, min(self.poll_s, deadline_s - time.monotonic())))

    def last_invocation_lines(self, unit: str, max_lines: int = 2000) -> list[str]:
        """The first max_lines messages of the unit's most recent start that logged anything."""
        newest = self._query([f"_SYSTEMD_UNIT={unit}", "-n", "1"])
        if not newest or not newest[0].invocation_id:
            return []
        matches = self._matches(unit, newest[0].invocation_id)
        return [r.message for r in self._query(matches, head=max_lines)]

    def invocation_tail(self, unit: str, invocation_id: str, max_lines: int) -> list[str]:
        """The last max_lines messages of one start of the unit (how an old server's stop ended)."""
        try:
            return [
                r.message for r in self._query([*self._matches(unit, invocation_id), "-n", str(max_lines)])
            ]
        except JournalError:
            return []  # only a drain count is read from it: without it the watch's own count stands

    @staticmethod
    def _matches(unit: str, invocation_id: str | None) -> list[str]:
        # Fields of different names are ANDed by journalctl; -u would also pull in systemd's own
        # lines about the unit, which carry no _SYSTEMD_INVOCATION_ID.
        matches = [f"_SYSTEMD_UNIT={unit}"]
        return [*matches, f"_SYSTEMD_INVOCATION_ID={invocation_id}"] if invocation_id else matches

    @staticmethod
    def _wanted(record: JournalLine, invocation_id: str | None) -> bool:
        return invocation_id is None or record.invocation_id == invocation_id

    def _query(self, args: list[str], head: int | None = None) -> list[JournalLine]:
        argv = [*self._base, "-o", "json", f"--output-fields={FIELDS}", *args]
        if head is not None:
            return _parse("\n".join(self._head(argv, head)))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.call_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JournalError(f"journalctl failed to run: {exc}") from exc
        if done.returncode != 0:
            raise JournalError(f"journalctl exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return _parse(done.stdout)

    def _head(self, argv: list[str], count: int) -> list[str]:
        """The first count output lines of argv, stopping journalctl once they are read.

        A journalctl that stalls (a journal file on a hung disk) is killed at the call's timeout: its
        pipe then ends, so the read below cannot wait longer than that.
        """
        out: list[str] = []
        fired = threading.Event()
        try:
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:

                def stop() -> None:
                    fired.set()
                    proc.kill()

                timer = threading.Timer(self.call_timeout_s, stop)
                timer.start()
                try:
                    assert proc.stdout is not None
                    for raw in proc.stdout:
                        out.append(raw)
                        if len(out) >= count:
                            break
                finally:
                    timer.cancel()
                    proc.kill()
        except OSError as exc:
            raise JournalError(f"journalctl failed to run: {exc}") from exc
        if fired.is_set() and len(out) < count:
            raise JournalError(f"journalctl did not finish in {self.call_timeout_s:g} s: stopped it")
        return out


def stop_when(should_stop: Callable[[], bool], lines: Iterator[JournalLine | None]) -> Iterator[JournalLine]:
    """The lines of a follow() until should_stop() says so (checked on every tick)."""
    for line in lines:
        if should_stop():
            return
        if line is not None:
            yield line
