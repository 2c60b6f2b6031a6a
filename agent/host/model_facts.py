"""On the GPU host: the facts a plan needs (deployctl-facts/1), read without loading anything big.

config.json (with text_config and quantization_config inside), the checkpoint's tensor bytes from the
safetensors headers (dtype x shape; the tensor data is never read), the draft's likewise, nvidia-smi's
cards, and the SGLang version installed for the unit's Python (its dist-info, never run). Every reader
returns None (or []) when it cannot tell, never raises: the facts verb must answer whatever the host looks
like.
"""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import re
import shutil
import stat
import struct
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from agent.host.watch.gpu_at_start import AtStart, fill
from agent.host.watch.gpu_procs import processes
from agent.protocol.answers import FactsDoc, GpuCard, ModelFact
from agent.sglang.flags import FlagsError, parse_unit, unit_lines
from agent.sglang.redact import SECRET_FLAG, is_secret_env, redact_log_line
from agent.sglang.unitfile import AdoptError, split_environment

FORMAT = "deployctl-facts/1"


MAX_CONFIG_BYTES = 4 * 2**20
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit on the JSON header
MAX_METADATA_BYTES = 64 * 2**10  # the headers of a dist-info METADATA come first; the long description after
SYSTEM_PREFIXES = ("/usr/local", "/usr")  # where pip and Debian put a system-wide SGLang
# safetensors dtype names -> bytes per element (sub-byte types as fractions: F4 packs two per byte).
DTYPE_BYTES: Mapping[str, float] = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5, "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}  # fmt: skip
# Start-up lines worth carrying (the planner's parser reads these; the rest is noise and maybe private).
_KEEP = re.compile(
    r"avail mem|KV Cache|Mamba Cache|max_total_num_tokens|server_args|Memory pool|Load weight|CUDA graph|"
    r"cuda graph|Not enough|OutOfMemory|out of memory|mem_fraction_static|Reserving|SWA|#tokens|Scheduler hit"
)


def open_regular(path: Path) -> BinaryIO:
    """The file for reading, if it is a regular file; OSError for anything else.

    Opened without blocking, then checked: a FIFO (or a device) named by a model's folder or its index
    would block the open or the read forever, and facts runs as root on every apply.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def safetensors_bytes(path: Path) -> int | None:
    """Tensor bytes of one .safetensors file from its header: sum of dtype size x product of the shape."""
    try:
        with open_regular(path) as f:
            head = f.read(8)
            if len(head) != 8:
                return None
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER_BYTES:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError, RecursionError):  # RecursionError: a hostile deeply nested JSON
        return None
    if not isinstance(header, dict):
        return None
    total = 0.0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        per = DTYPE_BYTES.get(str(info.get("dtype")))
        shape = info.get("shape")
        if per is None or not isinstance(shape, list):
            return None
        total += per * math.prod(int(d) for d in shape)
    return int(total)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The shards the safetensors index names, else every *.safetensors in the folder."""
    index = model_dir / "model.safetensors.index.json"
    try:
        with open_regular(index) as f:
            weight_map = json.loads(f.read(MAX_CONFIG_BYTES + 1).decode("utf-8")).get("weight_map")
        if isinstance(weight_map, dict):
            return sorted({model_dir / str(f) for f in weight_map.values()})
    except (OSError, ValueError, AttributeError, RecursionError):  # UnicodeDecodeError is a ValueError
        pass
    return sorted(model_dir.glob("*.safetensors"))


def weights_bytes(model_dir: Path) -> int | None:
    files = checkpoint_files(model_dir)
    sizes = [safetensors_bytes(f) for f in files]
    if not files or any(s is None for s in sizes):
        return None
    return sum(s for s in sizes if s is not None)


def read_config(model_dir: Path) -> dict[str, object] | None:
    path = model_dir / "config.json"
    try:
        with open_regular(path) as f:
            text = f.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            return None
        data = json.loads(text.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: a hostile deeply nested JSON
        return None
    return data if isinstance(data, dict) else None


def model_fact(path: str | None) -> ModelFact | None:
    """{"config", "weights_bytes", "path"} for a local checkpoint folder; None for a hub id or no config."""
    if not path:
        return None
    folder = Path(path)
    config = read_config(folder)
    if config is None:
        return None
    return {"config": config, "weights_bytes": weights_bytes(folder), "path": str(folder)}


def parse_gpus(csv: str) -> list[GpuCard]:
    """nvidia-smi --query-gpu=name,memory.total,memory.free,compute_cap,index --format=csv,noheader,nounits;
    the index lets the laptop keep the rows of a service's own GPUs ([gpus] indices)."""
    gpus = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            card: GpuCard = {"name": parts[0], "memory_total_mib": float(parts[1]),
                                    "memory_free_mib": float(parts[2])}  # fmt: skip
        except ValueError:
            continue
        if len(parts) > 3 and re.fullmatch(r"[0-9]+\.[0-9]+", parts[3]):
            card["compute_capability"] = parts[3]
        if len(parts) > 4 and parts[4].isdigit():
            card["index"] = int(parts[4])
        gpus.append(card)
    return gpus


def gpus(own_unit: str | None = None, at_start: AtStart | None = None) -> list[GpuCard]:
    """nvidia-smi's cards, each with the processes on it, those of `own_unit` (the service) marked, and
    what each held at the running start where the agent recorded that start (host/watch/gpu_at_start.py)."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,memory.total,memory.free,compute_cap,index"
    argv = ["nvidia-smi", query, "--format=csv,noheader,nounits"]
    try:
        text = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    cards = parse_gpus(text)
    held = processes(own_unit)
    if held is not None:
        for card in cards:
            card["processes"] = held.get(card.get("index", -1), [])
        fill(cards, at_start)
    return cards


def parse_host_ram(
    meminfo: str, cgroup_max: str | None = None, cgroup_current: str | None = None, numa_nodes: int = 1
) -> GpuCard | None:
    """The RAM SGLang's CPU backend sizes from, as a facts `gpus` row (srt/utils/common.py): free is
    MemAvailable (psutil's available), or less where the cgroup's memory.max - memory.current is lower
    (get_free_cpu_memory), shared by the NUMA nodes (get_available_gpu_memory, device "cpu")."""
    kib = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name in ("MemTotal", "MemAvailable") and fields and fields[0].isdigit():
            kib[name] = int(fields[0])
    if len(kib) < 2 or kib["MemTotal"] <= 0:
        return None
    free = kib["MemAvailable"] * 1024
    if cgroup_max and cgroup_current and cgroup_max.strip().isdigit() and cgroup_current.strip().isdigit():
        free = min(free, max(0, int(cgroup_max) - int(cgroup_current)))
    nodes = max(1, numa_nodes)
    return {
        "name": f"host RAM ({nodes} NUMA node{'s' if nodes > 1 else ''})",
        "memory_total_mib": round(kib["MemTotal"] / 1024 / nodes, 1),
        "memory_free_mib": round(free / 2**20 / nodes, 1),
    }


def host_ram() -> GpuCard | None:
    """parse_host_ram of this host: /proc/meminfo, the cgroup's memory files, /sys's NUMA nodes."""

    def read(path: str) -> str | None:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read(65536)
        except OSError:
            return None

    nodes = [n for n in _listdir("/sys/devices/system/node") if re.fullmatch(r"node[0-9]+", n)]
    meminfo = read("/proc/meminfo")
    if meminfo is None:
        return None
    return parse_host_ram(
        meminfo, read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current"), len(nodes) or 1
    )


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def unit_python(executable: Sequence[str]) -> str | None:
    """The Python the unit runs SGLang with: the command itself, or a console script's shebang."""
    if not executable:
        return None
    first = executable[0]
    if re.search(r"python[0-9.]*$", first):
        return first
    try:
        with open_regular(Path(first)) as f:
            line = f.readline(256).decode("utf-8", errors="replace")
    except OSError:
        return None
    if line.startswith("#!") and "python" in line:
        return line[2:].split()[0]
    return None


def sglang_version(python: str | None, system: Sequence[str] = SYSTEM_PREFIXES) -> str | None:
    """SGLang's version from the dist-info METADATA beside the unit's Python (<venv>/bin/python -> <venv>),
    else in the system's site-packages: read, never run. The venv is the service user's to write, and
    running its Python as root would run any .pth file planted in it (-I does not stop those)."""
    if python is None:
        return None
    for root in (str(Path(python).parent.parent), *system):
        for meta in sorted(
            glob.glob(f"{glob.escape(root)}/lib/python3*/*-packages/sglang-*.dist-info/METADATA")
        ):
            version = _metadata_version(meta)
            if version is not None:
                return version
    return None


def _metadata_version(path: str) -> str | None:
    """The `Version:` header of a METADATA file; never blocks on a FIFO, never reads a whole big file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = f.read(MAX_METADATA_BYTES).decode("utf-8", "replace")
    for line in head.split("\n"):
        if not line.strip():
            break  # the headers end at the first blank line
        if line.startswith("Version:"):
            version = line.partition(":")[2].strip()
            return version if re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version) else None
    return None


def unit_environment(unit_text: str, secret_names: Iterable[str]) -> dict[str, str]:
    """Environment= assignments of the unit, secret-looking names and the inventory's secret ones left out."""
    secret = tuple(secret_names)
    env: dict[str, str] = {}
    try:
        for section, key, value in unit_lines(unit_text):
            if section == "Service" and key == "Environment":
                pairs = split_environment(value) if value else []  # unquoted as systemd does
                env.update((name, val) for name, val in pairs if not is_secret_env(name, secret))
    except (FlagsError, AdoptError):
        return {}
    return env


def start_excerpt(lines: Iterable[str]) -> str | None:
    """SGLang's own memory and pool lines of the newest start, as the facts' last_start text; secret values
    (the API key in the server_args= line) replaced by ***."""
    kept = [redact_log_line(line) for line in lines if _KEEP.search(line)]
    return "\n".join(kept[-2000:]) + "\n" if kept else None


def collect(
    unit_text: str | None,
    journal_lines: Sequence[str],
    secret_names: Iterable[str],
    unit: str | None = None,
    at_start: AtStart | None = None,
) -> FactsDoc | None:
    """The facts document for the unit's model, or None when the unit names no local config.json."""
    if not unit_text:
        return None
    try:
        executable, flags = parse_unit(unit_text)
    except FlagsError:
        return None
    path = flags.get("model-path") or flags.get("model")
    model = model_fact(str(path)) if isinstance(path, str) else None
    if model is None:
        return None
    draft_path = flags.get("speculative-draft-model-path")
    cpu = str(flags.get("device") or "").lower() == "cpu"  # SGLang's CPU backend: no nvidia-smi, RAM
    ram = host_ram() if cpu else None
    return {
        "format": FORMAT,
        **({"device": "cpu"} if cpu else {}),
        "gpus": [ram] if ram else [] if cpu else gpus(unit, at_start),
        "sglang": {"version": sglang_version(unit_python(executable))},
        "model": model,
        "draft": model_fact(str(draft_path)) if isinstance(draft_path, str) else None,
        "flags": {
            k: " ".join(v) if isinstance(v, tuple) else v
            for k, v in flags.items()
            if not SECRET_FLAG.search(k)
        },
        "env": unit_environment(unit_text, secret_names),
        "last_start": start_excerpt(journal_lines),
    }
