"""On the GPU host: the processes holding memory on each card, and the systemd unit each belongs to.

A card another process shares has that much less free memory when SGLang starts; the plan subtracts what
processes outside the service hold (agent/plan/overhead.py outside_service). Stdlib only; every reader
returns what it can tell and never raises.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from agent.protocol.answers import GpuProcess

APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
_UNIT = re.compile(r"([^/\s]+\.(?:service|scope))\s*$")


App = tuple[str, int, str, float]  # gpu uuid, pid, process name, used MiB


def parse_compute_apps(csv: str) -> list[App]:
    """nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits."""
    apps = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        try:
            used = float(parts[3])
        except ValueError:
            continue  # "[N/A]" where the driver does not say (MIG, some WSL)
        apps.append((parts[0], int(parts[1]), parts[2], used))
    return apps


def unit_of_cgroup(text: str) -> str | None:
    """The systemd unit of a process from /proc/PID/cgroup (its last .service or .scope), else None."""
    for line in text.splitlines():
        path = line.rsplit(":", 1)[-1]
        found = _UNIT.search(path)
        if found:
            return found.group(1)
    return None


def by_card(
    uuids: Mapping[str, int], apps: Sequence[App], unit_of: Callable[[int], str | None], own_unit: str | None
) -> dict[int, list[GpuProcess]]:
    """The apps on each card (nvidia-smi's index, from the app's gpu uuid), each marked own or not."""
    out: dict[int, list[GpuProcess]] = {}
    for uuid, pid, name, used in apps:
        index = uuids.get(uuid)
        if index is None:
            continue
        unit = unit_of(pid)
        proc: GpuProcess = {
            "pid": pid,
            "name": name,
            "used_mib": used,
            "unit": unit,
            "service": unit == own_unit,
        }
        out.setdefault(index, []).append(proc)
    return out


def _run(*argv: str) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _unit_of_pid(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as f:
            return unit_of_cgroup(f.read(65536))
    except OSError:
        return None


def processes(own_unit: str | None) -> dict[int, list[GpuProcess]] | None:
    """by_card of this host (nvidia-smi and /proc); None when nvidia-smi cannot tell."""
    listed = _run("nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader,nounits")
    apps = _run("nvidia-smi", APPS_QUERY, "--format=csv,noheader,nounits")
    if listed is None or apps is None:
        return None
    uuids = {}
    for line in listed.splitlines():
        uuid, _, index = (p.strip() for p in line.partition(","))
        if index.isdigit():
            uuids[uuid] = int(index)
    return by_card(uuids, parse_compute_apps(apps), _unit_of_pid, own_unit)
