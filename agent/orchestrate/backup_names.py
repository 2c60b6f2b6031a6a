"""The backup names deployctl last saw on each service's host, kept on this machine for shell completion.

Backups live on the host (agent/host/units.py). `deployctl backups` and `rollback` list them, `apply` and
`rollback` make one; each time the names are written here, one a line, newest first:
$XDG_STATE_HOME/deployctl/backups/<service> (else ~/.local/state/deployctl/backups/<service>). The
completer of `rollback --to` reads them without connecting; a name retention has removed since is refused by
the host as any unknown one is. Both ways are best effort: a read-only home never fails a command, and a
file that cannot be read offers nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from agent.protocol.common import BACKUP_NAME

KEEP = 100  # names per service; the host keeps keep_backups (at most 1000), the newest matter
SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")  # an inventory file's name, never a path


def _file(service: str) -> Path | None:
    if not SERVICE.fullmatch(service):
        return None
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "deployctl" / "backups" / service


def _newest_first(names: Iterable[str]) -> list[str]:
    found = {n: m for n in names if (m := BACKUP_NAME.fullmatch(n)) is not None}
    return sorted(found, key=lambda n: (found[n]["ts"], n), reverse=True)[:KEEP]


def remembered(service: str) -> list[str]:
    """The names last seen on this service's host, newest first; [] when none were, or on any failure."""
    path = _file(service)
    try:
        text = path.read_text(encoding="utf-8") if path is not None else ""
    except (OSError, UnicodeDecodeError):
        return []
    return _newest_first(text.splitlines())


def remember(service: str, names: Iterable[str | None], *, every: bool = False) -> None:
    """Record names seen on the host: `every`, a whole listing (it replaces what was known); else names
    added (a backup an apply or a rollback just made). Never raises."""
    path = _file(service)
    given = [n for n in names if n]
    if path is None or (not given and not every):
        return
    known = _newest_first([*given, *([] if every else remembered(service))])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text("".join(f"{n}\n" for n in known), encoding="utf-8")
        partial.replace(path)
    except OSError:
        return
