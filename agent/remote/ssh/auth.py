"""Public-key authentication from IdentityFile keys and ssh-agent: never a password, never a prompt."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import paramiko
from paramiko.auth_strategy import AuthSource, AuthStrategy, InMemoryPrivateKey, OnDiskPrivateKey


class KeyAuth(AuthStrategy):
    """Try each IdentityFile key in order, then the agent's keys; remember what was tried for the error."""

    def __init__(self, user: str, identity_files: Sequence[Path], use_agent: bool) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.user = user
        self.identity_files = tuple(identity_files)
        self.use_agent = use_agent
        self.tried: list[str] = []

    def get_sources(self) -> Iterator[AuthSource]:
        for path in self.identity_files:
            pkey = self._load(path)
            if pkey is not None:
                self.tried.append(f"{path} ({pkey.get_name()} {pkey.fingerprint})")
                yield OnDiskPrivateKey(self.user, "ssh-config", path, pkey)
        if self.use_agent:
            yield from self._agent_sources()

    def _load(self, path: Path) -> paramiko.PKey | None:
        try:
            return paramiko.PKey.from_path(path)
        except FileNotFoundError:
            return None  # OpenSSH skips missing identity files too
        except (paramiko.PasswordRequiredException, TypeError):
            # Prompting would hang cron; an agent can hold the decrypted key instead. (For new-format
            # OpenSSH keys, cryptography reports a missing passphrase as TypeError, unwrapped by paramiko.)
            self.tried.append(f"{path} (encrypted, skipped: add it to ssh-agent)")
        except (OSError, paramiko.SSHException, paramiko.pkey.UnknownKeyType, ValueError) as exc:
            self.tried.append(f"{path} (unreadable, skipped: {exc})")
        return None

    def _agent_sources(self) -> Iterator[AuthSource]:
        try:
            keys = paramiko.Agent().get_keys()
        except paramiko.SSHException:
            keys = ()
        self.tried.append(f"ssh-agent ({len(keys)} keys)")
        for key in keys:
            yield InMemoryPrivateKey(self.user, key)

    def describe_tried(self) -> str:
        return ", ".join(self.tried) or "none: no IdentityFile found and no agent"
