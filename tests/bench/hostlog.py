"""The test host's own record of each start: journal timestamps per invocation, and deployctl's events."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.sglang.logs.summary import StartSummary, SummaryBuilder
from tests.simhost import SimHost

UNIT = "sglang.service"
# systemd's own records that the main process of a start is gone.
_DEATH = ("Main process exited", "Failed with result", "Scheduled restart job")


@dataclass
class Start:
    """One invocation of the unit: its journal records as (epoch seconds, message, from systemd)."""

    invocation: str
    records: list[tuple[float, str, bool]] = field(default_factory=list)

    @property
    def first(self) -> float:
        return self.records[0][0]

    def when(self, test: Callable[[StartSummary], bool]) -> float | None:
        """Journal time of the first SGLang line after which the summary passes `test`."""
        builder = SummaryBuilder()
        for at, message, from_systemd in self.records:
            if from_systemd:
                continue
            builder.feed(message)
            if test(builder.summary()):
                return at
        return None

    @property
    def launched(self) -> bool:
        """Whether SGLang itself started in this invocation (not only stopped in it)."""
        return any("server_args=" in msg for _, msg, sd in self.records if not sd)

    def summary(self) -> StartSummary:
        builder = SummaryBuilder()
        for _, message, from_systemd in self.records:
            if not from_systemd:
                builder.feed(message)
        return builder.summary()

    @property
    def pool_at(self) -> float | None:
        return self.when(lambda s: s.kv_tokens is not None)

    @property
    def ready_at(self) -> float | None:
        return self.when(lambda s: s.ready)

    @property
    def crash_at(self) -> float | None:
        """The first sign of a crash: a fatal line, or systemd seeing the main process die."""
        fatal = self.when(lambda s: s.failure is not None)
        died = [at for at, msg, sd in self.records if sd and msg.startswith(_DEATH)]
        times = [t for t in (fatal, min(died, default=None)) if t is not None]
        return min(times) if times else None

    @property
    def start_s(self) -> float | None:
        """The simulated server's own start time: its first record to 'fired up'."""
        ready = self.ready_at
        return None if ready is None else ready - self.first


def _message(value: Any) -> str:
    if isinstance(value, list):  # journald keeps invalid UTF-8 as a byte array
        return bytes(value).decode("utf-8", "replace")
    return str(value or "")


def starts_since(sim: SimHost, since: float) -> list[Start]:
    """The unit's invocations with records at or after `since` (epoch seconds), oldest first."""
    argv = ["journalctl", "-u", UNIT, "-o", "json", "--all", "--no-pager", f"--since=@{int(since)}"]
    out = sim.host.ssh(argv, timeout=60).stdout.decode("utf-8", "replace")
    by_id: dict[str, Start] = {}
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        inv = rec.get("_SYSTEMD_INVOCATION_ID") or rec.get("INVOCATION_ID")
        at = int(rec["__REALTIME_TIMESTAMP"]) / 1e6
        if not inv or at < since:
            continue
        from_systemd = rec.get("_PID") == "1" or "_SYSTEMD_INVOCATION_ID" not in rec
        by_id.setdefault(inv, Start(inv)).records.append((at, _message(rec.get("MESSAGE")), from_systemd))
    starts = list(by_id.values())
    for s in starts:
        s.records.sort(key=lambda r: r[0])
    return sorted(starts, key=lambda s: s.first)


def start_of(sim: SimHost, invocation: str, since: float) -> Start | None:
    return next((s for s in starts_since(sim, since) if s.invocation == invocation), None)


def events(sim: SimHost, txn: str) -> list[dict[str, Any]]:
    path = sim.host.root / f"var/lib/deployctl/txn/{txn}/events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def event_time(event: dict[str, Any]) -> float:
    """An event's ts (UTC, milliseconds) as epoch seconds."""
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def txns(sim: SimHost) -> set[str]:
    """The transactions the host has a folder for."""
    root = sim.host.root / "var/lib/deployctl/txn"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()
