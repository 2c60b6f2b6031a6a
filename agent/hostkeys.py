"""known_hosts checking: unknown keys refused unless accepted once, changed keys always refused."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import paramiko

from agent.errors import ConnectError

ACCEPT_FLAG = "--accept-new-host-key"
log = logging.getLogger("deployctl.ssh")


class HostKeyError(ConnectError):
    """The host's key is unknown or differs from known_hosts: never worth a retry."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256:<base64, no padding> form, as `ssh-keygen -l` prints it."""
    return str(key.fingerprint)


def known_hosts_name(hostname: str, port: int) -> str:
    """The name known_hosts files use: bare for port 22, [host]:port otherwise."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def load_known_hosts(into: paramiko.HostKeys, files: Sequence[Path]) -> None:
    """Add the entries (plain and hashed) of those files that exist."""
    for path in files:
        if path.is_file():
            into.load(str(path))


def changed_key_error(
    label: str, address: str, known: Sequence[Path], offered: paramiko.PKey
) -> HostKeyError:
    """The error for a key that differs from the recorded one, whatever the caller asked."""
    where = ", ".join(str(p) for p in known)
    return HostKeyError(
        f"{label}: host key for {address} changed: it now offers {offered.get_name()} "
        f"{fingerprint(offered)}, which differs from {where}; possible man-in-the-middle attack, "
        "refusing to connect",
        hint=f"if the host was reinstalled, remove the old entry (ssh-keygen -R '{address}') and reconnect",
    )


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for hosts with no known_hosts entry: refuse, or record and go on."""

    def __init__(self, label: str, address: str, record_in: Path, accept_new: bool) -> None:
        self.label = label
        self.address = address
        self.record_in = record_in
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise HostKeyError(
                f"{self.label}: unknown host key for {self.address}: {key.get_name()} {fingerprint(key)}",
                hint=f"check the fingerprint, then pass {ACCEPT_FLAG} to trust it once",
            )
        append_entry(self.record_in, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "%s: trusted new host key %s %s for %s", self.label, key.get_name(), fingerprint(key), hostname
        )


def append_entry(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append one plain (unhashed) entry, keeping the rest of the file untouched, like ssh does."""
    # Plain names keep the file readable and `ssh-keygen -R/-F` handles them; rewriting the whole file
    # (paramiko's HostKeys.save) would drop comments and @cert-authority lines.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as out:
        if out.tell() > 0 and not _ends_with_newline(path):
            out.write("\n")
        out.write(line)


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as existing:
        existing.seek(-1, os.SEEK_END)
        return existing.read(1) == b"\n"
