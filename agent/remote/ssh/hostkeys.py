"""known_hosts checking: unknown keys refused unless accepted once, changed or revoked keys always refused."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from agent.errors import ConnectError
from agent.remote.ssh.config import SshTarget

ACCEPT_FLAG = "--accept-new-host-key"
log = logging.getLogger("deployctl.ssh")

# A revoked key's public blob (PKey.asbytes()) -> the known_hosts file that revokes it.
RevokedKeys = Mapping[bytes, Path]


class HostKeyError(ConnectError):
    """The host's key is unknown or differs from known_hosts: never worth a retry."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256:<base64, no padding> form, as `ssh-keygen -l` prints it."""
    return str(key.fingerprint)


def load_known_hosts(into: paramiko.HostKeys, files: Sequence[Path]) -> RevokedKeys:
    """Add the entries (plain and hashed) of those files that exist; return the keys they mark @revoked.

    Parsed here line by line: HostKeys.load fails on any @cert-authority or @revoked line.
    """
    entries: list[HostKeyEntry] = []
    revoked: dict[bytes, Path] = {}
    for path in files:
        if not path.is_file():
            continue
        for marker, entry in _read_entries(path):
            if marker == "@revoked":
                revoked.setdefault(entry.key.asbytes(), path)
            else:
                entries.append(entry)
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        # A revoked key is never trusted, even where listed for the host: leaving it out makes paramiko
        # ask the policy (or raise BadHostKeyException), and both paths check the revoked keys.
        if entry.key.asbytes() in revoked:
            continue
        for name in entry.hostnames:
            # The first entry of a type wins, as with HostKeys.load; HostKeys.add would let the last win.
            if (name, entry.key.get_name()) not in seen:
                seen.add((name, entry.key.get_name()))
                into.add(name, entry.key.get_name(), entry.key)
    return revoked


def _read_entries(path: Path) -> Iterator[tuple[str | None, HostKeyEntry]]:
    """(marker or None, entry) for each line of one file that holds a key paramiko can read."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker == "@cert-authority":
            # It trusts host certificates, which we do not check: skip it rather than fail every connect.
            log.debug(
                "%s:%d: skipping @cert-authority line: host certificates are not supported", path, lineno
            )
            continue
        if marker not in (None, "@revoked"):
            log.debug("%s:%d: skipping line with unknown marker %s", path, lineno, marker)
            continue
        try:
            # from_line splits on single blanks and wants no marker, so give it the three fields alone.
            entry = HostKeyEntry.from_line(" ".join(fields[:3]), lineno)
        except (InvalidHostKey, paramiko.SSHException, ValueError):
            entry = None
        if entry is None:  # too few fields, an unknown key type or a malformed key: ssh skips those too
            log.debug("%s:%d: skipping unreadable known_hosts line", path, lineno)
            continue
        yield marker, entry


def revoked_key_error(
    label: str, address: str, revoked: RevokedKeys, offered: paramiko.PKey
) -> HostKeyError | None:
    """The error for a key some known_hosts file marks @revoked (for any host, as OpenSSH does), else None."""
    where = revoked.get(offered.asbytes())
    if where is None:
        return None
    return HostKeyError(
        f"{label}: host key for {address} is revoked: it offers {offered.get_name()} {fingerprint(offered)}, "
        f"which {where} marks @revoked; refusing to connect",
        hint="the key was revoked on purpose: ask the host's administrator how to reach it now",
    )


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

    def __init__(
        self,
        label: str,
        hop: SshTarget,
        accept_new: bool,
        *,
        revoked: RevokedKeys | None = None,
        hash_names: bool = False,
    ) -> None:
        self.label = label
        self.address = hop.address
        self.record_in = hop.known_hosts[0]  # a key accepted once is recorded in the first file
        self.accept_new = accept_new
        self.revoked: RevokedKeys = revoked or {}
        self.hash_names = hash_names  # the ssh config's HashKnownHosts

    def revoked_error(self, key: paramiko.PKey) -> HostKeyError | None:
        return revoked_key_error(self.label, self.address, self.revoked, key)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        revoked = self.revoked_error(key)
        if revoked is not None:  # before accept_new: a revoked key is never worth trusting
            raise revoked
        if not self.accept_new:
            raise HostKeyError(
                f"{self.label}: unknown host key for {self.address}: {key.get_name()} {fingerprint(key)}",
                hint=f"check the fingerprint, then pass {ACCEPT_FLAG} to trust it once",
            )
        append_entry(self.record_in, hostname, key, hashed=self.hash_names)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "%s: trusted new host key %s %s for %s", self.label, key.get_name(), fingerprint(key), hostname
        )


def append_entry(path: Path, name: str, key: paramiko.PKey, *, hashed: bool = False) -> None:
    """Append one entry, plain or hashed (HashKnownHosts), leaving the rest of the file as it is, like ssh."""
    # Appending, rather than rewriting the whole file with HostKeys.save, keeps comments and marker lines.
    # Plain names stay readable; hashed ones (|1|salt|hmac-sha1) hide which hosts we reach, as ssh does.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = paramiko.HostKeys.hash_host(name) if hashed else name
    line = f"{written} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as out:
        if out.tell() > 0 and not _ends_with_newline(path):
            out.write("\n")
        out.write(line)


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as existing:
        existing.seek(-1, os.SEEK_END)
        return existing.read(1) == b"\n"
