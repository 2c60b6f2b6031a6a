"""The fleet's view of the inventory: the hosts of units/*.toml and the groups they name."""

from __future__ import annotations

from pathlib import Path

from agent.errors import UsageError
from agent.inventory import HostConfig, check_services, load_services


def all_hosts(directory: Path) -> list[HostConfig]:
    """Every inventory file (a service; several may share a host), validated, in name order (the rollout
    order); services of one host that share a unit, a port or a GPU are refused here."""
    services = load_services(directory)
    check_services(services)
    return [s.config for s in services]


def group_hosts(directory: Path, group: str) -> list[HostConfig]:
    hosts = all_hosts(directory)
    found = [h for h in hosts if group in h.groups or group == "all"]
    if not found:
        known = sorted({g for h in hosts for g in h.groups})
        raise UsageError(
            f"no host in {directory} is in group {group!r}",
            hint=f"groups: {', '.join(known) or 'none (add groups = [...] to a host file)'}",
        )
    return found
