"""Secret values on the host: root-only files next to (never inside) the unit, backed up and restored with it.

A unit file is world-readable and so is what systemd reports over D-Bus (`systemctl show -p Environment`),
so secrets live in a 0700 folder of 0600 files:
  <unit>.env          secret environment variables, through EnvironmentFile= (read by systemd as root)
  <unit>.flags.yaml   secret SGLang flags (--api-key...), through LoadCredential= and SGLang's --config
                      (readable by the service alone, under /run/credentials/<unit>/)
A backup of the unit takes copies named after it (<backup>.env, <backup>.flags.yaml), so restoring a unit
restores the secrets it ran with, and a unit that had none gets none.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from agent.host.units import UnitFiles

KINDS = ("env", "flags.yaml")  # the file name suffixes; see protocol/common.py secret_path


def env_file_text(env: Mapping[str, str]) -> str | None:
    """EnvironmentFile= lines, double-quoted with \\, ", $ and ` escaped (systemd's own unquoting)."""
    if not env:
        return None
    lines = []
    for name, value in env.items():
        quoted = "".join("\\" + c if c in '\\"$`' else c for c in value)
        lines.append(f'{name}="{quoted}"\n')
    return "# secret environment of the unit, written by deployctl: root-only\n" + "".join(lines)


def flags_yaml_text(flags: Mapping[str, str]) -> str | None:
    """SGLang's --config YAML: one `flag: "value"` per line (a JSON string is a YAML double-quoted one)."""
    if not flags:
        return None
    lines = (f"{name}: {json.dumps(value)}\n" for name, value in flags.items())
    return "# secret SGLang flags, written by deployctl: readable by the service alone\n" + "".join(lines)


class SecretFiles:
    """The secret files of one unit in a root-only folder; all writes atomic and 0600 from the first byte."""

    def __init__(self, directory: str | Path, unit: str) -> None:
        self.files = UnitFiles(directory, mode=0o600)
        self.unit = unit

    def wanted(self, env: Mapping[str, str], flags: Mapping[str, str]) -> dict[str, str | None]:
        return {"env": env_file_text(env), "flags.yaml": flags_yaml_text(flags)}

    def current(self) -> dict[str, str | None]:
        return {kind: self._read(f"{self.unit}.{kind}") for kind in KINDS}

    def write(self, texts: Mapping[str, str | None]) -> None:
        """Make the files what `texts` says (None: no such file)."""
        for kind, text in texts.items():
            self._put(f"{self.unit}.{kind}", text)

    def backup(self, backup: str) -> None:
        """Copies of the current files named after the unit's backup."""
        for kind, text in self.current().items():
            self._put(f"{backup}.{kind}", text)

    def of_backup(self, backup: str) -> dict[str, str | None]:
        return {kind: self._read(f"{backup}.{kind}") for kind in KINDS}

    def restore(self, backup: str | None) -> None:
        """The secrets the unit in `backup` ran with (none at all for no backup)."""
        self.write(self.of_backup(backup) if backup else dict.fromkeys(KINDS))

    def prune(self, kept_backups: set[str]) -> None:
        """Drop the copies whose unit backup is gone."""
        with contextlib.suppress(FileNotFoundError):
            for p in self.files.dir.glob(f"{self.unit}.bak.*"):
                if not any(p.name == f"{b}.{kind}" for b in kept_backups for kind in KINDS):
                    p.unlink(missing_ok=True)

    def api_key(self) -> str | None:
        """The --api-key the installed secrets give SGLang (the probes must send it), if any."""
        return self._flag("api-key")

    def admin_api_key(self) -> str | None:
        """The --admin-api-key, if any: SGLang's admin endpoints (/pd_role_switch) take it alone."""
        return self._flag("admin-api-key")

    def _flag(self, flag: str) -> str | None:
        for line in (self.current()["flags.yaml"] or "").splitlines():
            name, sep, value = line.partition(": ")
            if sep and name == flag:
                with contextlib.suppress(ValueError):
                    key = json.loads(value)
                    return key if isinstance(key, str) else None
        return None

    def _read(self, name: str) -> str | None:
        return self.files.read(name)

    def _put(self, name: str, text: str | None) -> None:
        if text is None:
            with contextlib.suppress(FileNotFoundError):
                self.files.path(name).unlink()
            return
        if self.files.read(name) == text:
            return
        self.files.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.files.dir, 0o700)  # never readable by others, even if made by hand
        self.files.write(name, text)
