"""A temp file left by a writer killed before its rename is removed by the next write; a live one is not."""

from __future__ import annotations

import os
import subprocess
import sys

from agent.host.units import UnitFiles


def test_the_next_write_removes_temp_files_of_dead_writers_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    stale = tmp_path / f".sglang.service.deployctl-tmp.{int(dead.stdout)}"
    stale_backup = tmp_path / f".sglang.service.bak.20260101T000000Z.deployctl-tmp.{int(dead.stdout)}"
    live = tmp_path / f".other.service.deployctl-tmp.{os.getppid()}"
    for p in (stale, stale_backup, live):
        p.write_text("[Service]\nExecStart=/bin/tru")
    UnitFiles(tmp_path).write("sglang.service", "[Service]\nExecStart=/bin/true\n")
    assert not stale.exists() and not stale_backup.exists()
    assert live.exists()  # another unit's writer, still running
    assert (tmp_path / "sglang.service").read_text() == "[Service]\nExecStart=/bin/true\n"
