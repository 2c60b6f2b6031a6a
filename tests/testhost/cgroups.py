"""A control group of its own for each test host's systemd-nspawn.

Without a service manager on this machine, `nspawn --keep-unit` puts the container in a "payload" group
below the group it was started in, and moves itself to "supervisor" beside it. Two test hosts started from
the same group so share one "payload": both containers' systemd then manage the very same
system.slice/sglang.service group, and one host's stop kills the other's server or removes the group its
start attaches to (seen as a start failing with 219/CGROUP, and as "Failed to kill control group ...:
Input/output error"). Real hosts never share a group; each test host gets its own here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUP = Path("/proc/self/cgroup")


def hierarchies(mountinfo: str, own: str) -> list[Path]:
    """The folders of this process's group in the hierarchies nspawn uses: cgroup2, and cgroup v1's
    name=systemd when the machine mixes both (read from mountinfo and /proc/self/cgroup)."""
    paths: dict[str, str] = {}
    for line in own.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            paths["cgroup2"] = path
        elif "name=systemd" in controllers.split(","):
            paths["name=systemd"] = path
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        fstype, options = fields[dash + 1], fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        key = "cgroup2" if fstype == "cgroup2" else ("name=systemd" if "name=systemd" in options else "")
        if key in paths:
            found.append(Path(fields[4]) / paths.pop(key).lstrip("/"))
    return found


def named(name: str) -> list[Path]:
    """The group `name` below this process's own, in each hierarchy (whether it exists or not)."""
    try:
        return [base / name for base in hierarchies(MOUNTINFO.read_text(), OWN_CGROUP.read_text())]
    except OSError:
        return []


def make_own(name: str) -> list[Path]:
    """A new group named `name` in each hierarchy (none where this machine does not allow it)."""
    made = []
    for group in named(name):
        with contextlib.suppress(OSError):
            group.mkdir(exist_ok=True)
            made.append(group)
    return made


def enter_then_exec(groups: list[Path], argv: list[str]) -> list[str]:
    """argv run from a shell that first moves itself into `groups` (exec keeps its pid)."""
    if not groups:
        return argv
    moves = "".join(f"echo $$ > {shlex.quote(str(g / 'cgroup.procs'))} 2>/dev/null; " for g in groups)
    return ["/bin/sh", "-c", moves + 'exec "$@"', "sh", *argv]


def remove(groups: list[Path]) -> None:
    """Remove the groups once their processes are gone (innermost first: only empty groups go)."""
    for group in groups:
        if not group.is_dir():
            continue
        for folder, _dirs, _files in os.walk(group, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
