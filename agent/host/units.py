"""Unit files on the host: backups named <unit>.bak.<UTC>, atomic writes, restore, retention."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from agent.protocol.common import BACKUP_NAME


class UnitWriteError(OSError):
    """Writing failed; the unit that was there before is intact."""


@dataclass(frozen=True)
class Backup:
    name: str
    path: Path
    taken: datetime
    size: int


class UnitFiles:
    """One unit directory; every write lands inside it, never a partial or empty unit."""

    def __init__(self, directory: str | Path, mode: int | None = None) -> None:
        self.dir = Path(directory)
        self.mode = mode  # every file written here gets this mode (the secrets folder: 0600)

    def path(self, unit: str) -> Path:
        return self.dir / unit

    def read(self, unit: str) -> str | None:
        """The file's text, bytes-exact: a byte that is not UTF-8 (a hand edit) round-trips unchanged."""
        try:
            return self.path(unit).read_text(encoding="utf-8", errors="surrogateescape")
        except FileNotFoundError:
            return None

    def mtime_us(self, unit: str) -> int:
        return self.path(unit).stat().st_mtime_ns // 1000

    def write(self, unit: str, text: str, like: Path | None = None, mode: int | None = None) -> None:
        """Temp file in the same directory, fsync, rename, fsync the directory: all or nothing.

        The file gets `mode` (else the folder's own mode for it, else the mode and owner of `like`
        or of the file it replaces, else 0644); the temp file is 0600 until then, so no other user
        can open it and keep reading what it holds.
        """
        dest = self.path(unit)
        self._sweep_stale_temps()
        template = like if like is not None and like.exists() else dest
        tmp = self.dir / f".{unit}.deployctl-tmp.{os.getpid()}"  # a name systemd never loads
        try:
            tmp.unlink(missing_ok=True)  # our own pid's leftover (pid reuse): O_EXCL below needs it gone
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                data = text.encode("utf-8", "surrogateescape")
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if (mode := mode if mode is not None else self.mode) is not None:
                    os.fchmod(fd, mode)
                elif not _copy_owner_and_mode(template, fd):
                    os.fchmod(fd, 0o644)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, dest)
            fsync_dir(self.dir)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            reason = "no space left on the device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
            raise UnitWriteError(exc.errno or 0, f"cannot write {dest}: {reason}") from exc

    def _sweep_stale_temps(self) -> None:
        """A writer killed between its temp file and the rename leaves the file; its pid names it."""
        for p in self.dir.glob(".*.deployctl-tmp.*"):
            pid = p.name.rsplit(".", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                p.unlink(missing_ok=True)

    def backup(self, unit: str, now: datetime) -> Backup:
        """Copy the installed unit to <unit>.bak.<UTC YYYYmmddTHHMMSSZ>, root-only (0600).

        Root-only, whatever the unit's own mode: a unit written before secrets moved out of units (or
        by hand) may hold them inline, and a backup is read by nobody but the agent.
        """
        stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        name, n = f"{unit}.bak.{stamp}", 0
        while self.path(name).exists():
            n += 1
            name = f"{unit}.bak.{stamp}-{n}"
        self.write(name, self.read(unit) or "", mode=0o600)
        return self._describe(name)

    def backups(self, unit: str) -> list[Backup]:
        """Newest first."""
        found = []
        for p in self.dir.glob(f"{unit}.bak.*"):
            m = BACKUP_NAME.fullmatch(p.name)
            if m and m["unit"] == unit:
                found.append(self._describe(p.name))
        return sorted(found, key=lambda b: (b.taken, b.name), reverse=True)

    def prune(self, unit: str, keep: int, protect: Collection[str | None] = ()) -> list[str]:
        """Keep the newest `keep` distinct contents, with every copy of each; remove the rest.

        Identical copies count once, so a nightly change that keeps failing cannot push the distinct
        history out; they are kept all the same, because each name was printed by the apply that made
        it (`rollback --to NAME`) and must keep working while its content is kept. A backup in `protect`
        (the one being restored, the one a record points at) stays.
        """
        seen: set[bytes] = set()
        kept, removed = 0, []
        for b in self.backups(unit):
            content = b.path.read_bytes()
            if b.name in protect or content in seen or kept < keep:
                kept += content not in seen
                seen.add(content)
                continue
            b.path.unlink(missing_ok=True)
            removed.append(b.name)
        return removed

    def restore(self, unit: str, backup: str) -> None:
        """The backup's bytes back in place, with the mode and owner of the unit they replace."""
        self.write(unit, self.read(backup) or "")

    def remove(self, unit: str) -> None:
        self.path(unit).unlink(missing_ok=True)
        fsync_dir(self.dir)

    def _describe(self, name: str) -> Backup:
        m = BACKUP_NAME.fullmatch(name)
        assert m is not None
        taken = datetime.strptime(m["ts"], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
        p = self.path(name)
        return Backup(name=name, path=p, taken=taken, size=p.stat().st_size)


def _copy_owner_and_mode(template: Path, fd: int) -> bool:
    try:
        st = template.stat()
    except FileNotFoundError:
        return False
    os.fchmod(fd, st.st_mode & 0o7777)
    with contextlib.suppress(PermissionError):
        os.fchown(fd, st.st_uid, st.st_gid)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def fsync_dir(directory: Path) -> None:
    """A rename or an unlink in `directory` made durable (the unit files, the boot guard)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
