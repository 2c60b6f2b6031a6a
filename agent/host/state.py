"""The agent's own state under /var/lib/deployctl: recovery records, history, transaction logs."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.host.change.jobs import Job
from agent.host.change.record import PHASES, CorruptRecord, Record
from agent.protocol.answers import HistoryEntry
from agent.protocol.common import BACKUP_NAME


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write, fsync, rename: mode 0600 in a 0700 folder (request.json holds the unit; the staged secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(payload, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateDir:
    """Per-unit records and per-transaction event logs; everything written here survives a reboot."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def unit_dir(self, unit: str) -> Path:
        return self.root / "units" / unit

    def txn_dir(self, txn: str) -> Path:
        return self.root / "txn" / txn

    # recovery record -------------------------------------------------------------------------
    def save_record(self, record: Record) -> None:
        write_json_atomic(self.unit_dir(record.unit) / "pending.json", asdict(record))

    def record_path(self, unit: str) -> Path:
        return self.unit_dir(unit) / "pending.json"

    def load_record(self, unit: str) -> Record | None:
        """The unit's recovery record; CorruptRecord when one is there but unreadable (never "none")."""
        path = self.record_path(unit)
        try:
            raw = json.loads(path.read_bytes())
            jobs = tuple(Job.parse(j) for j in raw.pop("jobs", []))
            record = Record(**raw, jobs=jobs)
        except FileNotFoundError:
            return None
        except (
            ValueError,
            TypeError,
            AttributeError,
            OSError,
        ) as exc:  # atomic writes make this rare: a disk fault, a hand
            raise CorruptRecord(path, f"{type(exc).__name__}: {exc}") from None
        backup_ok = record.backup is None or (
            isinstance(record.backup, str)
            and (m := BACKUP_NAME.fullmatch(record.backup))
            and m["unit"] == unit
        )
        done_ok = isinstance(record.done, int) and 0 <= record.done <= len(record.jobs)
        if record.phase not in PHASES or not backup_ok or not done_ok:
            raise CorruptRecord(path, "a phase or backup name deployctl never writes")
        return record

    def clear_record(self, unit: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.record_path(unit).unlink()

    # history: one JSON line per verified start, newest last ----------------------------------
    def append_history(self, unit: str, entry: HistoryEntry) -> None:
        path = self.unit_dir(unit) / "history.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def history(self, unit: str, limit: int = 20) -> list[HistoryEntry]:
        path = self.unit_dir(unit) / "history.jsonl"
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out: list[HistoryEntry] = []
        for line in lines[-limit:]:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    # the router: a worker this host took out and has not put back yet ---------------------------
    def mark_router_out(self, unit: str, worker: str) -> None:
        write_json_atomic(self.unit_dir(unit) / "router_out.json", {"worker": worker})

    def router_left_out(self, unit: str) -> str | None:
        try:
            value = json.loads((self.unit_dir(unit) / "router_out.json").read_text()).get("worker")
            return value if isinstance(value, str) else None
        except (FileNotFoundError, ValueError, AttributeError):
            return None

    def clear_router_out(self, unit: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.unit_dir(unit) / "router_out.json").unlink()

    # backups' group changes ------------------------------------------------------------------
    def note_backup_group(self, unit: str, backup: str, key: str, kept: Collection[str]) -> None:
        """The group change (its key, the same on every member) that took this backup: a [pd] rollback
        takes every unit back to one change's backups (agent/group/pdrollback.py). Only `kept` backups'."""
        groups = {name: k for name, k in self.backup_groups(unit).items() if name in kept} | {backup: key}
        write_json_atomic(self.unit_dir(unit) / "backup_groups.json", groups)

    def backup_groups(self, unit: str) -> dict[str, str]:
        try:
            raw = json.loads((self.unit_dir(unit) / "backup_groups.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        ok = isinstance(raw, dict)
        return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)} if ok else {}

    # transactions ----------------------------------------------------------------------------
    def set_last_txn(self, unit: str, txn: str) -> None:
        write_json_atomic(self.unit_dir(unit) / "last_txn.json", {"txn": txn})

    def last_txn(self, unit: str) -> str | None:
        try:
            value = json.loads((self.unit_dir(unit) / "last_txn.json").read_text()).get("txn")
            return value if isinstance(value, str) else None
        except (FileNotFoundError, ValueError):
            return None

    def set_starting_txn(self, unit: str, txn: str) -> None:
        """A runner was asked for: it may not hold the lock yet (last_txn is only ever the lock's winner)."""
        write_json_atomic(self.unit_dir(unit) / "starting_txn.json", {"txn": txn})

    def starting_txn(self, unit: str) -> str | None:
        try:
            value = json.loads((self.unit_dir(unit) / "starting_txn.json").read_text()).get("txn")
            return value if isinstance(value, str) else None
        except (FileNotFoundError, ValueError):
            return None

    def events_path(self, txn: str) -> Path:
        return self.txn_dir(txn) / "events.jsonl"

    def has_outcome(self, txn: str, tail: int = 1 << 16) -> bool:
        """Whether the transaction logged its outcome. The outcome is its last event, so only the file's
        tail is read: read-only calls (cron's included) ask this of every finished transaction."""
        try:
            with open(self.events_path(txn), "rb") as f:
                start = max(0, f.seek(0, os.SEEK_END) - tail)
                f.seek(start)
                data = f.read()
        except OSError:
            return False
        lines = data.split(b"\n")[1 if start else 0 : -1]  # whole lines only, at both ends
        return any(b'"kind": "outcome"' in line for line in lines)

    def read_events(self, txn: str) -> Iterator[str]:
        try:
            with open(self.events_path(txn), encoding="utf-8") as f:
                yield from (line.rstrip("\n") for line in f if line.endswith("\n"))
        except FileNotFoundError:
            return
