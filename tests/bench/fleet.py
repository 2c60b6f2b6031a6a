"""The fleet figure of make bench: simulated hosts rolled out on Ansible, a canary batch then batches.

Against one host's `deployctl apply` measured in the same run on one of those hosts (before and after
the rollout): a rollout of B batches should take about B single applies. deployctl's own time per host
is the rollout's wall time less the simulated servers' own starts (from each host's journal, as
hostlog reads them), the slowest start of each batch since a batch waits for its last host.

    python -m tests.bench.fleet [--hosts 16] [--batch 4]    # this section alone; ends with one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests import fleethosts
from tests.bench import hostlog
from tests.bench.tools import DEPLOYCTL
from tests.fleethosts import Fleet, HostSpec
from tests.integration.conftest import wait_pool
from tests.simhost import SimHost

GROUP = "bench-fleet"
CONTEXT = "200k"  # the rollout's change, and the single apply's before it
SINGLE_AFTER = "100k"  # the single apply after the rollout: another restart to a new context
INOTIFY = Path("/proc/sys/fs/inotify/max_user_instances")
# Each test host's systemd, journald, logind and dbus hold 11 inotify instances, all counted against
# root here (no private users): the kernel's default of 128 stops the 11th host's systemd at boot.
INOTIFY_PER_HOST = 16


def _view(f: Fleet, name: str) -> SimHost:
    """One fleet host as the journal readers and wait_pool see a sim host (they use .host and the unit)."""
    return SimHost(f.hosts[name], f.work, f.units_dir, f.ssh_config, name=name, env=f.env)


def _run(f: Fleet, *args: str) -> tuple[float, str]:
    """deployctl as an operator runs it; its wall time. A failure stops the bench: figures would lie."""
    t0 = time.time()
    proc = subprocess.run(
        [DEPLOYCTL, *args], env={**os.environ, **f.env}, capture_output=True, text=True, timeout=900
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench: deployctl {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}")
    return wall, proc.stdout + proc.stderr


def batches(names: Sequence[str], canary: int, batch: int) -> list[list[str]]:
    """The rollout's batches in order: the canary batch, then the rest `batch` at a time."""
    rest = names[canary:]
    return [list(names[:canary])] + [list(rest[i : i + batch]) for i in range(0, len(rest), batch)]


def start_seconds(f: Fleet, names: Sequence[str], since: float) -> dict[str, float]:
    """Each host's first start of SGLang since `since`: its own time from first record to ready."""
    found = {}
    for name in names:
        launched = [s for s in hostlog.starts_since(_view(f, name), since) if s.launched]
        own = launched[0].start_s if launched else None
        if own is None:
            raise SystemExit(f"bench: no ready start of SGLang on {name} after the change")
        found[name] = own
    return found


def figures(
    wall: float,
    single: Sequence[tuple[float, float]],
    starts: dict[str, float],
    plan: list[list[str]],
    batch: int,
) -> dict[str, Any]:
    """The rollout against len(plan) single applies (wall, own time each); its own time per host."""
    waited = sum(max(starts[h] for h in b) for b in plan)
    hosts = sum(len(b) for b in plan)
    one = sum(w for w, _ in single) / len(single)
    return {
        "fleet_hosts": hosts,
        "fleet_batch": batch,
        "fleet_wall_s": round(wall, 2),
        "single_apply_s": round(one, 2),
        "single_own_s": round(sum(o for _, o in single) / len(single), 3),  # the same measure, one host
        "fleet_vs_4_single": round(wall / (len(plan) * one), 3),
        "fleet_own_overhead_per_host_s": round((wall - waited) / hosts, 3),
    }


def _inotify_room(hosts: int, say: Callable[[str], None]) -> None:
    """Raise root's inotify instance limit (until the next reboot) when it is too low for `hosts`."""
    limit = int(INOTIFY.read_text())
    in_use = sum(1 for fd in Path("/proc").glob("[0-9]*/fd/*") if _is_inotify(fd))
    need = in_use + hosts * INOTIFY_PER_HOST
    if limit < need:
        raised = max(need, 512)  # a round figure, so that the next run finds room too
        say(f"fleet: fs.inotify.max_user_instances {limit} -> {raised} ({in_use} in use, {hosts} hosts)")
        INOTIFY.write_text(f"{raised}\n")


def _is_inotify(fd: Path) -> bool:
    try:
        return os.readlink(fd) == "anon_inode:inotify"
    except OSError:
        return False


def measure(hosts: int = 16, batch: int = 4, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Boot `hosts` sim hosts, time one host's apply, the rollout (canary `batch`, then batches of
    `batch`), and one host's apply again; the figures, keys fleet_*."""
    names = [f"fb{i:02d}" for i in range(1, hosts + 1)]
    _inotify_room(hosts, say)
    t0 = time.monotonic()
    f = fleethosts.boot([HostSpec(n, (GROUP,)) for n in names])
    try:
        say(f"fleet: {hosts} hosts booted in {time.monotonic() - t0:.1f} s; waiting for their servers")
        for name in names:
            wait_pool(_view(f, name), timeout=180)
        return _timed(f, names, batch, say)
    finally:
        f.stop()


def _single(f: Fleet, name: str, context: str) -> tuple[float, float]:
    """One host's apply alone: its wall time, and that less its server's own start."""
    since = time.time()
    wall, _ = _run(f, "apply", name, "--context", context, "--yes")
    return wall, wall - start_seconds(f, [name], since)[name]


def _timed(f: Fleet, names: list[str], batch: int, say: Callable[[str], None]) -> dict[str, Any]:
    _run(f, "fleet", "status", GROUP)  # the agent bundle reaches every host: not part of any figure
    before = _single(f, names[0], CONTEXT)
    _run(f, "rollback", names[0], "--yes")
    say(f"fleet: one host's apply {before[0]:.2f} s; the rollout, canary {batch} then batches of {batch}")
    since = time.time()
    rollout = ["fleet", "apply", GROUP, "--context", CONTEXT, "--canary", str(batch), "--batch", str(batch)]
    wall, _ = _run(f, *rollout, "--yes")
    plan = batches(names, batch, batch)
    starts = start_seconds(f, names, since)
    after = _single(f, names[0], SINGLE_AFTER)
    result = figures(wall, [before, after], starts, plan, batch)
    say(
        f"fleet: {len(names)} hosts in {len(plan)} batches {wall:.2f} s wall, one host's apply "
        f"{before[0]:.2f} s before and {after[0]:.2f} s after: {result['fleet_vs_4_single']} x "
        f"({len(plan)} x one apply); own time per host {result['fleet_own_overhead_per_host_s']} s "
        f"(one host alone: {result['single_own_s']} s)"
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.fleet", description=__doc__)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4, help="the canary batch and each later batch")
    a = ap.parse_args()
    print(json.dumps(measure(a.hosts, a.batch), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
