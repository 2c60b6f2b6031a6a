"""The fault matrix's multi-node cases: the link to node rank 1 drops in the middle of a group change.

The drop is real: rank 1's sshd is stopped and every SSH session on it killed (the coordinator's follow
of rank 1 included), at the moment rank 1's transaction logs the step, and started again after a while.
Each case then checks that the group converged: both nodes run the same unit generation (the old one or
the new one), both serve, no recovery record is left, and the old unit is still on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.sglang.flags import parse_unit_flags
from tests.grouphosts import NAME, Group
from tests.integration.conftest import DEPLOYCTL

STATE = "/var/lib/deployctl"
# (case, rank 1's event that triggers the drop, seconds the link stays down)
CASES: list[tuple[str, str, float]] = [
    ("group:link_drop_rank1:stopped", "stopped", 20.0),  # waiting for "go"
    ("group:link_drop_rank1:watch", "watch", 20.0),  # its new start in progress
    ("group:link_drop_rank1:ready", "ready", 20.0),  # voted, waiting for the decision
    # longer than its own wait: rank 0 took the commit first; rank 1 is told once its link is back
    ("group:link_drop_rank1:ready_long", "ready", 150.0),
]


@dataclass
class GroupCase:
    name: str
    survived: bool = False
    notes: tuple[str, ...] = ()


def _events(g: Group, rank: int) -> list[dict[str, object]]:
    root = g.nodes[rank].root / STATE.lstrip("/") / "txn"
    found = []
    for path in sorted(root.glob("*/events.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def _hit(event: dict[str, object], step: str) -> bool:
    data = event.get("data") or {}
    assert isinstance(data, dict)
    return data.get("vote") == step or (step == "watch" and event.get("stage") == "watch")


def drop_link(g: Group, rank: int, seconds: float) -> None:
    """No SSH to node `rank` for `seconds`: its sshd stopped, its sessions killed; then back."""
    node = g.nodes[rank]
    node.inside(["systemctl", "stop", "ssh.service", "ssh.socket"])
    node.inside(["pkill", "-KILL", "-f", "^sshd: root"])
    time.sleep(seconds)
    node.inside(["systemctl", "start", "ssh.service"])


def run_case(g: Group, step: str, seconds: float, wait: Callable[[], None]) -> GroupCase:
    old = [g.unit(r) for r in range(2)]
    seen = len(_events(g, 1))
    context = "150000" if parse_unit_flags(old[0])["context-length"] != "150000" else "120000"
    argv = [DEPLOYCTL, "apply", NAME, "--context", context, "--yes", "--json"]
    proc = subprocess.Popen(argv, env={**os.environ, **g.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 180
    while not any(_hit(e, step) for e in _events(g, 1)[seen:]):
        assert time.monotonic() < deadline and proc.poll() is None, f"rank 1 never logged {step}"
        time.sleep(0.05)
    drop_link(g, 1, seconds)
    _, err = proc.communicate(timeout=600)
    # rank 1 finishes on its own (its own wait, if it heard nothing): wait for its outcome
    deadline = time.monotonic() + 300
    while sum(e.get("kind") == "outcome" for e in _events(g, 1)[seen:]) < 1:
        assert time.monotonic() < deadline, "rank 1's transaction never ended"
        time.sleep(0.5)
    wait()
    ok, notes = converged(g, old, proc.returncode)
    return GroupCase("", ok, notes if ok else (*notes, (err.strip().splitlines() or [""])[-1][:300]))


def converged(g: Group, old: list[str], rc: int) -> tuple[bool, tuple[str, ...]]:
    """All new or all old, every node running, no record left, the old units kept."""
    units = [g.unit(r) for r in range(2)]
    contexts = {parse_unit_flags(u)["context-length"] for u in units}
    notes = [f"client exit {rc}", "new" if units != old else "old"]
    if len(contexts) != 1:
        notes.append(f"DIVERGED: contexts {sorted(contexts)}")
    for rank in range(2):
        if g.systemctl(rank, "is-active", "sglang.service") != "active":
            notes.append(f"rank {rank} not running")
        if (g.nodes[rank].root / STATE.lstrip("/") / "units/sglang.service/pending.json").exists():
            notes.append(f"rank {rank} has a recovery record left")
        folder = g.nodes[rank].root / "etc/systemd/system"
        kept = [p.read_text() for p in folder.glob("sglang.service*") if p.is_file()]
        if old[rank] not in kept:
            notes.append(f"rank {rank}'s old unit lost")
    return len(notes) == 2, tuple(notes)
