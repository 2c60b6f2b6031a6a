"""Turn a target (alias, user@host[:port] or host) into connection settings, honouring ~/.ssh/config."""

from __future__ import annotations

import getpass
import glob
import importlib
import os
import re
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import paramiko

from agent.errors import UsageError

CONFIG_ENV = "DEPLOYCTL_SSH_CONFIG"
DEFAULT_PORT = 22
MAX_INCLUDE_DEPTH = 16  # OpenSSH's own limit (READCONF_MAX_DEPTH)
MAX_JUMPS = 8
DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")
DEFAULT_KNOWN_HOSTS = ("known_hosts", "known_hosts2")

_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(?P<args>.+?)\s*$", re.IGNORECASE)
_BLOCK = re.compile(r"^\s*(?:host|match)(?:\s*=\s*|\s+)\S", re.IGNORECASE)
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class SshTarget:
    """Where and how to connect to one hop: the alias as typed, the address, the user, keys, jumps."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...]
    known_hosts: tuple[Path, ...]
    identities_only: bool = False
    jumps: tuple[SshTarget, ...] = ()

    @property
    def address(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"

    def describe(self) -> str:
        return f"{self.user}@{self.address}"

    def hop(self) -> SshTarget:
        """This target alone, as one hop of a chain."""
        return replace(self, jumps=())


def ssh_dir() -> Path:
    return Path(os.path.expanduser("~")) / ".ssh"


def default_config_path() -> Path:
    """The ssh config to read: $DEPLOYCTL_SSH_CONFIG, else ~/.ssh/config."""
    override = os.environ.get(CONFIG_ENV)
    return Path(override) if override else ssh_dir() / "config"


def split_target(target: str) -> tuple[str | None, str, int | None]:
    """Split 'user@host:port' (each part but host optional; IPv6 as [addr]:port) into its parts."""
    user, _, rest = target.rpartition("@")
    port_text: str | None = None
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise UsageError(
                f"bad SSH target {target!r}", hint="use user@host, user@host:port or [v6addr]:port"
            )
        port_text = tail[1:] or None
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
    else:
        host = rest
    if not host or (user == "" and "@" in target):
        raise UsageError(f"bad SSH target {target!r}", hint="use an ssh config alias, user@host or host:port")
    return user or None, host, _port(port_text, target) if port_text else None


def _port(text: str, where: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"bad SSH port {text!r} in {where!r}")
    return int(text)


def expand_includes(text: str, base: Path, depth: int = 0) -> str:
    """Inline every Include (globs; relative to ~/.ssh), since paramiko's parser ignores them."""
    if depth > MAX_INCLUDE_DEPTH:
        raise UsageError(f"ssh config Include nested deeper than {MAX_INCLUDE_DEPTH} levels")
    out: list[str] = []
    block = "Host *"  # lines before any Host/Match belong to every host
    for line in text.splitlines():
        found = _INCLUDE.match(line)
        if not found:
            if _BLOCK.match(line):
                block = line.strip()
            out.append(line)
            continue
        for pattern in shlex.split(found["args"]):
            path = Path(os.path.expanduser(pattern))
            matches = sorted(glob.glob(str(path if path.is_absolute() else base / path)))
            for included in matches:
                out.append(expand_includes(Path(included).read_text(), base, depth + 1))
        # An included file may open Host blocks of its own; reopen ours for the lines after Include.
        out.append(block)
    return "\n".join(out) + "\n"


def load_config(path: Path) -> paramiko.SSHConfig:
    """Parse one ssh config file with its Includes; a missing file is an empty config."""
    if not path.exists():
        return paramiko.SSHConfig()
    try:
        text = expand_includes(path.read_text(), ssh_dir())
        if _MATCH_EXEC.search(text):
            _load_invoke()
        return paramiko.SSHConfig.from_text(text)
    except (OSError, UnicodeDecodeError, paramiko.ConfigParseError) as exc:
        raise UsageError(f"cannot read ssh config {path}: {exc}") from exc


def _load_invoke() -> None:
    """`Match exec` runs its command through invoke, which agent.remote.ssh kept from loading."""
    if sys.modules.get("invoke", False) is None:
        del sys.modules["invoke"]
    try:
        paramiko.config.invoke = importlib.import_module("invoke")  # type: ignore[attr-defined]
    except ImportError as exc:
        raise UsageError(f"the ssh config uses Match exec, which needs the invoke package: {exc}") from None


def resolve(target: str, config: paramiko.SSHConfig, depth: int = 0) -> SshTarget:
    """Settings for target: explicit user/port win over the config, the config over defaults."""
    if depth > MAX_JUMPS:
        raise UsageError(f"ProxyJump chain for {target!r} is longer than {MAX_JUMPS} hops (a loop?)")
    user, host, port = split_target(target)
    found = config.lookup(host)
    jump_spec = found.get("proxyjump")
    jumps: list[SshTarget] = []
    if jump_spec and jump_spec.lower() != "none":
        for hop in jump_spec.split(","):
            resolved = resolve(hop.strip(), config, depth + 1)
            # A hop's own ProxyJump is reached first, as OpenSSH does.
            jumps.extend((*resolved.jumps, resolved.hop()))
    return SshTarget(
        alias=host,
        hostname=found["hostname"],
        port=port or _port(found.get("port", str(DEFAULT_PORT)), f"Port for {host}"),
        user=user or found.get("user") or getpass.getuser(),
        identity_files=_identities(found),
        known_hosts=_known_hosts(found),
        identities_only=found.get("identitiesonly", "no").lower() == "yes",
        jumps=tuple(jumps),
    )


def _identities(found: paramiko.SSHConfigDict) -> tuple[Path, ...]:
    configured = found.get("identityfile")
    if configured:
        return tuple(Path(os.path.expanduser(p)) for p in configured)
    return tuple(p for p in (ssh_dir() / name for name in DEFAULT_IDENTITIES) if p.exists())


def _known_hosts(found: paramiko.SSHConfigDict) -> tuple[Path, ...]:
    configured = found.get("userknownhostsfile")
    if configured:
        return tuple(Path(os.path.expanduser(p)) for p in shlex.split(configured))
    return tuple(ssh_dir() / name for name in DEFAULT_KNOWN_HOSTS)
