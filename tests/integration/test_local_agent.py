"""The agent run on this machine (ssh.target = "local"): read-only verbs need no systemd."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from agent.cli import main
from agent.output import Output

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def unit(api_key: str, context: int) -> str:
    return (
        "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
        f"--context-length {context} --api-key {api_key}\n"
    )


def test_backups_over_the_local_agent_redact_secret_flags(tmp_path: Path) -> None:
    units_dir, unit_dir = tmp_path / "units", tmp_path / "systemd"
    units_dir.mkdir()
    unit_dir.mkdir()
    text = (REPO / "units" / "ct200-sim.toml").read_text()
    text = re.sub(r"(?m)^target = .*$", 'target = "local"', text)
    text = text.replace("[unit]\n", f'[unit]\ndirectory = "{unit_dir}"\n', 1)
    text = text.replace("[ssh]\n", f'[ssh]\nagent_dir = "{tmp_path / "state"}"\n', 1)
    (units_dir / "box.toml").write_text(text)
    (unit_dir / "sglang.service").write_text(unit("new-secret-456", 200000))
    (unit_dir / "sglang.service.bak.20261202T120000Z").write_text(unit("old-secret-123", 32768))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(units_dir), "backups", "box"], out=out)
    shown = out.stdout.getvalue() + out.stderr.getvalue()  # type: ignore[attr-defined]
    assert code == 0, shown
    assert "sglang.service.bak.20261202T120000Z" in shown
    assert "--context-length: 32768 in the backup, 200000 installed" in shown
    assert "--api-key: *** in the backup, *** installed" in shown
    assert "secret-123" not in shown and "secret-456" not in shown
