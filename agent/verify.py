"""Check a rendered unit with `systemd-analyze verify`, where this machine has it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from agent.errors import RenderError
from agent.inventory import HostConfig
from agent.protocol.common import UNIT_NAME
from agent.render import render_unit, template_dir
from agent.sglang.flags import FlagInput

# The unit runs on the GPU server, so its executable is normally missing here. systemd-analyze reports
# that as "Command X is not executable: No such file or directory", which says nothing about the unit
# file itself. Only that complaint is dropped; every other line (unknown keys, bad values, unbalanced
# quotes, even the warnings systemd-analyze exits 0 on) is returned.
_MISSING_EXECUTABLE = re.compile(r": Command .* is not executable: No such file or directory$")
_TIMEOUT_S = 30.0


def verify_unit(text: str, unit_name: str) -> str | None:
    """The complaints of `systemd-analyze verify` about the unit; None when clean or not installed."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return None
    if not UNIT_NAME.fullmatch(unit_name):
        raise ValueError(f"not a unit file name: {unit_name!r}")
    with tempfile.TemporaryDirectory(prefix="deployctl-verify-") as tmp:
        # verify derives the unit's type from the file name: it must be the real name, e.g. sglang.service.
        path = Path(tmp) / unit_name
        path.write_text(text, encoding="utf-8")
        # Only this unit, not every unit it is ordered after (--recursive-errors=, systemd >= 250).
        try:
            proc = _run([analyze, "verify", "--recursive-errors=no", str(path)])
            if "recursive-errors" in proc.stdout + proc.stderr:
                proc = _run([analyze, "verify", str(path)])
        except subprocess.TimeoutExpired:
            return f"systemd-analyze verify did not finish in {_TIMEOUT_S:.0f} s"
    output = (proc.stderr + proc.stdout).replace(str(path), unit_name)  # no temporary paths in messages
    lines = [line for line in output.splitlines() if line.strip()]
    complaints = [line for line in lines if not _MISSING_EXECUTABLE.search(line)]
    if complaints:
        return "\n".join(complaints)
    if proc.returncode != 0 and not lines:
        return f"systemd-analyze verify exited with {proc.returncode} and said nothing"
    return None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL
    )


def render_checked(host: HostConfig, flags: Mapping[str, FlagInput], installed: str | None = None) -> str:
    """Render the unit and have systemd-analyze verify it where this machine has it.

    A rendering identical to the `installed` unit is not verified again: systemd already runs it, and
    skipping it saves a cron run that changes nothing a subprocess.
    """
    text = render_unit(host, flags, template_dir())
    if text == installed:
        return text
    complaint = verify_unit(text, host.unit.name)
    if complaint:
        said = "; ".join(complaint.splitlines())
        raise RenderError(f"systemd-analyze verify refused the rendered {host.unit.name}: {said}")
    return text
