"""What a [pd] unit's host has for the transfer: the transfer backends installed for the unit's Python, and
the host's RDMA devices. agent/pd/refusals.py refuses a backend the host does not have, and NIXL with no
device chosen on a host with several (UCX picks one itself and each transfer hangs to the 300 s timeout).

Read first, never run as root (as model_facts.sglang_version): the unit's venv is the service user's to
write, and running its Python as root would run any .pth file planted in it. So a backend counts as installed
when its package or module is in the site-packages beside the unit's Python, the system's, or a PYTHONPATH
directory of the unit. A package on disk can still fail to import (mooncake's engine.so links libibverbs,
libnuma, libcurl: without them SGLang dies at its start), so the engine module SGLang imports for the unit's
own backend is then imported by the unit's Python as the unit's User= (host/argcheck.py: from /, the unit's
Environment= only, a time limit; a unit with no User= but root is not run, and says so).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from agent.host.argcheck import CheckCommand, command_for, last_line, run_as_user
from agent.host.model_facts import SYSTEM_PREFIXES, unit_environment, unit_python
from agent.protocol.answers import EngineImportData, PdFactsData
from agent.sglang.flags import FlagsError, FlagValue, parse_unit

# srt/disaggregation/*/conn.py import these (agent/pd/refusals.py BACKEND_MODULES)
TRANSFER_MODULES = ("mooncake", "nixl", "mori", "memfabric_hybrid")
INFINIBAND = "/sys/class/infiniband"  # the kernel's RDMA devices (mlx5_0, ...); absent: none
# What SGLang 0.5.23 imports for each backend's engine: srt/distributed/device_communicators/
# mooncake_transfer_engine.py:120 `from mooncake.engine import TransferEngine` (mooncake_tcp is mooncake
# with TCP forced, srt/arg_groups/pd_disaggregation_hook.py:27); srt/disaggregation/nixl/conn.py:543
# `from nixl._api import nixl_agent`; srt/disaggregation/mori/conn.py:17-18 `from mori.cpp`, `from mori.io`;
# srt/disaggregation/ascend/transfer_engine.py:14 `from memfabric_hybrid import TransferEngine`.
ENGINE_MODULES = {
    "mooncake": ("mooncake.engine",),
    "mooncake_tcp": ("mooncake.engine",),
    "nixl": ("nixl._api",),
    "mori": ("mori.cpp", "mori.io"),
    "ascend": ("memfabric_hybrid",),
}
DEFAULT_BACKEND = "mooncake"  # srt/arg_groups/fields/disagg.py: "Default is mooncake."
IMPORT_TIMEOUT_S = 30.0  # a native engine loads in about a second; past this the check is skipped
_IMPORT = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"


class Imported(str, Enum):
    YES = "importable"
    NO = "not_importable"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class EngineImport:
    imported: Imported
    detail: str  # the import's last error line, or why it was not tried


Importer = Callable[[CheckCommand, tuple[str, ...]], EngineImport]


def import_engine(
    cmd: CheckCommand, modules: tuple[str, ...], timeout_s: float = IMPORT_TIMEOUT_S
) -> EngineImport:
    """Import the modules with the unit's Python, as its user; a failure carries the error's last line."""
    done = run_as_user(cmd, ["-c", _IMPORT, *modules], timeout_s)
    if isinstance(done, str):
        return EngineImport(Imported.SKIPPED, done)
    if done.returncode == 0:
        return EngineImport(Imported.YES, f"{', '.join(modules)} imported (as {cmd.user})")
    return EngineImport(Imported.NO, last_line(done.stderr, done.returncode))


def collect(
    unit_text: str | None, secret_names: Iterable[str], run: Importer = import_engine
) -> PdFactsData | None:
    """For a unit that runs a prefill or a decode; None for any other unit."""
    if not unit_text or "--disaggregation-mode" not in unit_text:
        return None
    try:
        executable, flags = parse_unit(unit_text)
    except FlagsError:
        return None
    path = unit_environment(unit_text, secret_names).get("PYTHONPATH", "")
    found = installed(unit_python(executable), [p for p in path.split(":") if p])
    return {
        "importable": found,
        "rdma_devices": rdma_devices(),
        "engine": engine(unit_text, flags, found, run),
    }


def engine(
    unit_text: str, flags: dict[str, FlagValue], found: list[str] | None, run: Importer
) -> EngineImportData:
    """Whether the unit's own backend's engine imports: tried only where its package is installed."""
    backend = str(flags.get("disaggregation-transfer-backend") or DEFAULT_BACKEND)
    modules = ENGINE_MODULES.get(backend)
    said = EngineImport(Imported.SKIPPED, f"no engine to import for the {backend} backend")
    if modules is not None and (found is None or modules[0].partition(".")[0] not in found):
        said = EngineImport(Imported.SKIPPED, f"{modules[0].partition('.')[0]} is not installed")
    elif modules is not None:
        cmd = command_for(unit_text)
        said = EngineImport(Imported.SKIPPED, cmd) if isinstance(cmd, str) else run(cmd, modules)
    return {"backend": backend, "verdict": said.imported.value, "detail": said.detail}


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
