"""What a [pd] unit's host has for the transfer: the transfer backends installed for the unit's Python, and
the host's RDMA devices. agent/pd/refusals.py refuses a backend the host does not have, and NIXL with no
device chosen on a host with several (UCX picks one itself and each transfer hangs to the 300 s timeout).

Read, never run (as model_facts.sglang_version): the unit's venv is the service user's to write, and running
its Python as root would run any .pth file planted in it. So a backend counts as installed when its package
or module is in the site-packages beside the unit's Python, the system's, or a PYTHONPATH directory of the
unit; a package whose native library is missing (mooncake's engine.so links libibverbs) is not caught here.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from agent.host.model_facts import SYSTEM_PREFIXES, unit_environment, unit_python
from agent.protocol.answers import PdFactsData
from agent.sglang.flags import FlagsError, parse_unit

# srt/disaggregation/*/conn.py import these (agent/pd/refusals.py BACKEND_MODULES)
TRANSFER_MODULES = ("mooncake", "nixl", "mori", "memfabric_hybrid")
INFINIBAND = "/sys/class/infiniband"  # the kernel's RDMA devices (mlx5_0, ...); absent: none


def collect(unit_text: str | None, secret_names: Iterable[str]) -> PdFactsData | None:
    """For a unit that runs a prefill or a decode; None for any other unit."""
    if not unit_text or "--disaggregation-mode" not in unit_text:
        return None
    try:
        executable, _ = parse_unit(unit_text)
    except FlagsError:
        return None
    path = unit_environment(unit_text, secret_names).get("PYTHONPATH", "")
    return {
        "importable": installed(unit_python(executable), [p for p in path.split(":") if p]),
        "rdma_devices": rdma_devices(),
    }


def site_dirs(python: str, system: Sequence[str] = SYSTEM_PREFIXES) -> list[str]:
    """The site-packages beside the unit's Python (<venv>/bin/python -> <venv>), then the system's."""
    roots = (str(Path(python).parent.parent), *system)
    return [d for root in roots for d in sorted(glob.glob(f"{glob.escape(root)}/lib/python3*/*-packages"))]


def installed(
    python: str | None, extra: Sequence[str] = (), system: Sequence[str] = SYSTEM_PREFIXES
) -> list[str] | None:
    """The transfer modules found for that Python; None when the unit's Python is not known."""
    if python is None:
        return None
    dirs = [*extra, *site_dirs(python, system)]
    return [m for m in TRANSFER_MODULES if any(has_module(Path(d), m) for d in dirs)]


def has_module(site: Path, name: str) -> bool:
    """A package folder, a module file, or an extension module of that name."""
    if (site / name).is_dir() or (site / f"{name}.py").is_file():
        return True
    return bool(glob.glob(f"{glob.escape(str(site))}/{name}.*.so"))


def rdma_devices(root: str = INFINIBAND) -> list[str] | None:
    """The host's RDMA devices; [] without the folder (no RDMA driver), None when it cannot be read."""
    try:
        return sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    except OSError:
        return None
