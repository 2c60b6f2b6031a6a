"""The fault matrix's multi-node cases: a link, a node's agent, a node's host or the laptop is lost in the
middle of a group change.

Each fault is real: a dropped link stops the node's sshd and kills every SSH session on it (the
coordinator's follow included) and starts it again after a while; a killed agent is its transient unit
SIGKILLed; a rebooted host is powered off and booted again; a killed laptop is the deployctl process
SIGKILLed, then `deployctl apply` is run again, as the report tells a person to. Each is injected at the
moment a node's transaction logs the step. Each case then checks that the group converged: both nodes run
the same unit generation (the old one or the new one), both serve, no recovery record is left, and the old
unit is still on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.sglang.flags import parse_unit_flags
from tests.grouphosts import NAME, Group
from tests.integration.conftest import DEPLOYCTL

STATE = "/var/lib/deployctl"


@dataclass(frozen=True)
class Case:
    name: str
    rank: int  # the node whose event triggers the fault (and that it hits)
    step: str  # a vote ("stopped", "ready"), "watch" (its new start), "commit" (its decision file) or "go"
    fault: str  # "drop" (its link, for `seconds`), "kill_agent", "reboot", "kill_laptop"
    seconds: float = 0.0


CASES: list[Case] = [
    Case("group:link_drop_rank1:stopped", 1, "stopped", "drop", 20.0),  # waiting for "go"
    Case("group:link_drop_rank1:watch", 1, "watch", "drop", 20.0),  # its new start in progress
    Case("group:link_drop_rank1:ready", 1, "ready", "drop", 20.0),  # voted, waiting for the decision
    # longer than its own wait: rank 0 took the commit first; rank 1 is told once its link is back
    Case("group:link_drop_rank1:ready_long", 1, "ready", "drop", 150.0),
    # the commit point written, the coordinator loses rank 0 before rank 1 hears
    Case("group:link_drop_rank0:between_commits", 0, "commit", "drop", 20.0),
    Case("group:agent_killed_rank1:watch", 1, "watch", "kill_agent"),
    Case("group:agent_killed_rank0:ready", 0, "ready", "kill_agent"),
    Case("group:host_rebooted_rank1:watch", 1, "watch", "reboot"),
    Case("group:laptop_killed_after_go", 1, "go", "kill_laptop"),
    # the boot guard (agent/host/change/bootguard.py): a node rebooted mid-change must not start its new
    # server at boot; systemd skips the start (an unmet ConditionPathExists=) until the agent has decided
    Case("group:boot_guard_rank1:stopped", 1, "stopped", "reboot"),
    Case("group:boot_guard_rank1:ready", 1, "ready", "reboot"),
    Case("group:boot_guard_rank0:watch", 0, "watch", "reboot"),
]
GUARD = "etc/systemd/system/sglang.service.d/50-deployctl-pending.conf"


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


def _hit(g: Group, case: Case, event: dict[str, object]) -> bool:
    data = event.get("data") or {}
    assert isinstance(data, dict)
    if case.step == "watch":
        return event.get("stage") == "watch"
    if case.step == "go":
        return str(event.get("message", "")).startswith("every rank stopped: starting")
    if case.step == "commit":
        return data.get("decision") == "commit" or any(
            "commit" in p.read_text() for p in _txn_dirs(g, case.rank, "group-decision")
        )
    return data.get("vote") == case.step


def _txn_dirs(g: Group, rank: int, name: str) -> list[Path]:
    root = g.nodes[rank].root / STATE.lstrip("/") / "txn"
    return sorted(root.glob(f"*/{name}"))


def _newest_txn(g: Group, rank: int) -> str:
    return _txn_dirs(g, rank, "events.jsonl")[-1].parent.name


def drop_link(g: Group, rank: int, seconds: float) -> None:
    """No SSH to node `rank` for `seconds`: its sshd stopped, its sessions killed; then back."""
    node = g.nodes[rank]
    node.inside(["systemctl", "stop", "ssh.service", "ssh.socket"])
    node.inside(["pkill", "-KILL", "-f", "^sshd: root"])
    time.sleep(seconds)
    node.inside(["systemctl", "start", "ssh.service"])


def inject(g: Group, case: Case, proc: subprocess.Popen[str]) -> list[str]:
    """The fault; what it saw (a reboot: whether the boot guard held)."""
    node = g.nodes[case.rank]
    if case.fault == "drop":
        drop_link(g, case.rank, case.seconds)
    elif case.fault == "kill_agent":
        unit = f"deployctl-{_newest_txn(g, case.rank)}.service"
        node.inside(["systemctl", "kill", "--signal=SIGKILL", unit])
    elif case.fault == "reboot":
        guarded = (node.root / GUARD).is_file()
        node.restart()
        return boot_guard_held(g, case.rank) if guarded else []
    elif case.fault == "kill_laptop":
        proc.kill()
    else:
        raise ValueError(case.fault)
    return []


def boot_guard_held(g: Group, rank: int) -> list[str]:
    """A node rebooted with its change undecided: this boot's journal has systemd skipping the unit's
    start on its unmet condition (systemd 252: "was skipped because of an unmet condition check")."""
    log = g.nodes[rank].ssh(["journalctl", "-b", "--no-pager", "-u", "sglang.service"]).stdout.decode()
    if "unmet condition" in log:
        return ["boot guard held"]
    return ["BOOT GUARD FAILED: no skipped start at boot"]


def run_case(g: Group, case: Case, wait: Callable[[], None]) -> GroupCase:
    old = [g.unit(r) for r in range(2)]
    seen = [len(_events(g, r)) for r in range(2)]
    context = "150000" if parse_unit_flags(old[0])["context-length"] != "150000" else "120000"
    argv = [DEPLOYCTL, "apply", NAME, "--context", context, "--yes", "--json"]
    proc = subprocess.Popen(argv, env={**os.environ, **g.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 180
    while not any(_hit(g, case, e) for e in _events(g, case.rank)[seen[case.rank] :]):
        assert time.monotonic() < deadline and proc.poll() is None, (
            f"rank {case.rank} never logged {case.step}"
        )
        time.sleep(0.05)
    saw = inject(g, case, proc)
    out, err = proc.communicate(timeout=900)
    notes: list[str] = [_reason(out)] if proc.returncode not in (0, 4) else []
    notes += saw
    # every node finishes on its own (its own wait, if it heard nothing): wait for its outcome
    deadline = time.monotonic() + 420
    for rank, before in enumerate(seen):
        while not any(e.get("kind") == "outcome" for e in _events(g, rank)[before:]):
            assert time.monotonic() < deadline, f"rank {rank}'s transaction never ended"
            time.sleep(0.5)
    if case.fault == "kill_laptop":  # the nodes ended in doubt, stopped: what the report tells a person
        again = subprocess.run(argv, env={**os.environ, **g.env}, capture_output=True, text=True, timeout=900)
        notes.append(f"re-run exit {again.returncode}")
        if again.returncode:
            notes.append(f"re-run {_reason(again.stdout)}")
        err = again.stderr
    try:
        wait()
    except AssertionError as exc:
        return GroupCase("", False, (*notes, f"the group does not serve: {exc}"))
    ok, found = converged(g, old, proc.returncode)
    ok = ok and not any(n.startswith("BOOT GUARD FAILED") for n in notes)
    notes += found
    return GroupCase("", ok, tuple(notes) if ok else (*notes, (err.strip().splitlines() or [""])[-1][:300]))


def _reason(stdout: str) -> str:
    """The group report's reason, for a case whose client did not end applied or rolled back."""
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"host"'):
            report = json.loads(line)
            return f"{report.get('outcome')}: {str(report.get('reason', ''))[:200]}"
    return "no report"


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
