"""The agent run on this machine (ssh.target = "local"): read-only verbs need no systemd."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output

REPO = Path(__file__).resolve().parents[2]
DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))
pytestmark = pytest.mark.integration


def unit(api_key: str, context: int) -> str:
    return (
        "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
        f"--context-length {context} --api-key {api_key}\n"
    )


def local_inventory(tmp_path: Path) -> tuple[Path, Path]:
    """units/box.toml for the ct200 sim run by the local agent, with its unit folder under tmp_path."""
    units_dir, unit_dir = tmp_path / "units", tmp_path / "systemd"
    units_dir.mkdir()
    unit_dir.mkdir()
    text = (REPO / "units" / "ct200-sim.toml").read_text()
    text = re.sub(r"(?m)^target = .*$", 'target = "local"', text)
    text = text.replace("[unit]\n", f'[unit]\ndirectory = "{unit_dir}"\n', 1)
    text = text.replace("[ssh]\n", f'[ssh]\nagent_dir = "{tmp_path / "state"}"\n', 1)
    (units_dir / "box.toml").write_text(text)
    return units_dir, unit_dir


def test_no_code_from_the_operators_folder_runs(tmp_path: Path) -> None:
    """An `agent` package planted where the operator stands must never be what the local agent runs."""
    units_dir, unit_dir = local_inventory(tmp_path)
    (unit_dir / "sglang.service").write_text(unit("k", 32768))
    marker = tmp_path / "planted-ran"
    plant = tmp_path / "cwd"
    for pkg in ("agent", "agent/host", "agent/sglang"):
        (plant / pkg).mkdir(parents=True)
        (plant / pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write({pkg!r})\n")
    (plant / "agent/host/__main__.py").write_text(f"open({str(marker)!r}, 'a').write('main')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(plant)  # the operator's environment cannot bring it in either
    r = subprocess.run(
        [DEPLOYCTL, "--units", str(units_dir), "backups", "box"],
        cwd=plant,
        env={**env, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "box: no backups" in r.stdout
    assert not marker.exists(), marker.read_text()
    r = subprocess.run(
        [sys.executable, "-I", "-m", "agent.host", "status"],
        cwd=plant,
        env=env,
        input="{}",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not marker.exists(), "the host agent's own argv imported the planted package"


def test_backups_over_the_local_agent_redact_secret_flags(tmp_path: Path) -> None:
    units_dir, unit_dir = local_inventory(tmp_path)
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
