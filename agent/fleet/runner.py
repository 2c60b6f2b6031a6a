"""Run the collection's playbooks with ansible-playbook and follow their events: the fleet front end."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from agent.errors import DeployError, UsageError
from agent.fleet import events
from agent.fleet.results import FleetEvent

COLLECTIONS = Path(__file__).resolve().parent  # holds ansible_collections/deployctl/sglang
POLL_S = 0.1


@dataclass(frozen=True)
class Run:
    rc: int
    events: list[FleetEvent]
    log: str


def ansible_playbook() -> str:
    """ansible-playbook next to this Python (the fleet extra installs it there), else on PATH."""
    beside = Path(sys.executable).with_name("ansible-playbook")
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise UsageError(
            "ansible-playbook not found: deployctl fleet runs on Ansible",
            hint="pip install 'deployctl[fleet]'",
        )
    return found


def forks_for(hosts: int, canary: int, batch: str) -> int:
    """Enough forks for the largest batch, so a batch runs at once (Ansible's default is 5)."""
    rest = max(0, hosts - canary)
    size = math.ceil(rest * float(batch[:-1]) / 100) if batch.endswith("%") else int(batch)
    return max(1, min(64, max(canary, size)))


def run_playbook(  # noqa: PLR0913 - check mode is the one switch beside the playbook's inputs
    playbook: str,
    units: Path,
    extra_vars: Mapping[str, Any],
    forks: int,
    on_event: Callable[[FleetEvent], None],
    check: bool = False,
) -> Run:
    """ansible-playbook deployctl.sglang.<playbook>, its events passed to on_event as they come; `check`:
    Ansible's check mode (fleet apply --dry-run), in which every host plans and renders only."""
    with tempfile.TemporaryDirectory(prefix="deployctl-fleet-") as tmp:
        work = Path(tmp)
        inventory = work / "fleet.deployctl.yml"
        inventory.write_text(
            f"plugin: deployctl.sglang.units\nunits_dir: {json.dumps(str(units.resolve()))}\n"
        )
        feed = work / "events.jsonl"
        feed.touch(mode=0o600)
        env = _ansible_env(work, feed)
        argv = [
            ansible_playbook(), "-i", str(inventory), "--forks", str(forks),
            "-e", json.dumps(dict(extra_vars)), *(["--check"] if check else []),
            f"deployctl.sglang.{playbook}",
        ]  # fmt: skip
        log_path = work / "ansible.log"
        with open(log_path, "wb") as log, open(feed, "rb") as follow:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            seen = _follow(proc, follow, on_event)
        return Run(proc.returncode, seen, log_path.read_text(errors="replace"))


def _ansible_env(work: Path, feed: Path) -> dict[str, str]:
    """ansible-playbook's environment: this collection found first, no retry files or colour, the feed."""
    return {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(
            [str(COLLECTIONS), *filter(None, [os.environ.get("ANSIBLE_COLLECTIONS_PATH")])]
        ),
        "ANSIBLE_RETRY_FILES_ENABLED": "false",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
        events.ENV: str(feed),
    }


def _follow(
    proc: subprocess.Popen[bytes], follow: BinaryIO, on_event: Callable[[FleetEvent], None]
) -> list[FleetEvent]:
    """The events the run writes, each passed to on_event as it comes, until the run ends; an interrupt
    ends the run too."""
    seen: list[FleetEvent] = []
    pending = bytearray()
    try:
        while True:
            done = proc.poll() is not None
            for event in _complete_lines(follow, pending):
                seen.append(event)
                on_event(event)
            if done:
                return seen
            time.sleep(POLL_S)
    except BaseException:
        proc.terminate()
        proc.wait()
        raise


def _complete_lines(follow: BinaryIO, pending: bytearray) -> list[FleetEvent]:
    """The events whose whole line has been written: a read can end inside a line a worker is writing."""
    pending += follow.read()
    *whole, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    found: list[FleetEvent] = []
    for line in whole:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def ansible_failed(run: Run) -> DeployError:
    tail = " | ".join(run.log.strip().splitlines()[-6:]) or "no output"
    return DeployError(f"ansible-playbook ended with {run.rc} before any host ran: {tail}")
