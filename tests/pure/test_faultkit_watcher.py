"""The fault watcher of tests.faultkit stops the runner of the unit it was armed for: on a host where two
units change in the same group (a [pd] prefill and the router beside it), each has a transaction of its own,
and the newest one may be the other unit's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.faultkit import WATCHER


def _txn(state: Path, name: str, unit: str, pid: int) -> None:
    folder = state / "txn" / name
    folder.mkdir(parents=True)
    lock = {"stage": "lock", "kind": "step", "message": f"locked {unit}", "data": {"pid": pid}}
    (folder / "events.jsonl").write_text(json.dumps(lock) + "\n")


def test_the_watcher_stops_the_runner_of_its_own_unit_not_the_newest_of_the_host(tmp_path: Path) -> None:
    script = tmp_path / "watcher.py"
    script.write_text(WATCHER)
    env = {**os.environ, "DEPLOYCTL_WATCH_STATE": str(tmp_path)}
    argv = [sys.executable, str(script), "", "1", "done=1", "sglang-prefill-0.service"]
    watcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    runners = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]  # the prefill's runner, the router's
    try:
        assert watcher.stdout is not None and watcher.stdout.readline().startswith("armed")
        record = tmp_path / "units/sglang-prefill-0.service/pending.json"
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"jobs": ["stop", "start"], "done": 1}))  # the prefill's stop is done
        _txn(tmp_path, "20261207T005805Z-10a063", "sglang-prefill-0.service", runners[0].pid)
        _txn(tmp_path, "20261207T005805Z-892fa4", "sglang-router.service", runners[1].pid)  # sorts last
        out, _ = watcher.communicate(timeout=60)
        hit = json.loads(out.strip().splitlines()[-1])
        assert hit["txn"] == "20261207T005805Z-10a063" and hit["pid"] == runners[0].pid
        state = Path(f"/proc/{runners[1].pid}/stat").read_text().split()[2]
        assert state != "T"  # the router's runner was never stopped
    finally:
        watcher.kill()
        for r in runners:
            r.kill()
            r.wait()
