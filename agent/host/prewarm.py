"""Read the new unit's weights into the page cache while the old server still serves.

A restart's longest phase is loading the weights; from the page cache that is a memory copy instead of
a disk read. The decision (what to read, whether it fits) is pure; the reading runs in a thread at idle
I/O priority, so the old server's own disk reads go first.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import stat
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.protocol.events import PrewarmData

GIB = 1 << 30
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MODEL_FLAGS = ("model-path", "speculative-draft-model-path")  # the target and its draft: read both
CHUNK = 16 << 20
# ioprio_set(2): the syscall's number per machine, and IOPRIO_CLASS_IDLE in the class bits.
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273, "s390x": 282}
_IOPRIO_IDLE = 3 << 13
_IOPRIO_WHO_PROCESS = 1  # with a thread id: that thread only


@dataclass(frozen=True)
class WeightFile:
    path: str
    size: int
    resident: int  # bytes already in the page cache


@dataclass(frozen=True)
class Decision:
    read: tuple[str, ...]  # the files to read, in order
    total_bytes: int
    missing_bytes: int  # not yet in the page cache
    skip: str | None  # why nothing is read, or None


@dataclass(frozen=True)
class Prewarmed:
    files: int
    total_bytes: int
    read_bytes: int
    seconds: float
    skip: str | None

    def to_dict(self) -> PrewarmData:
        return PrewarmData(
            files=self.files,
            total_bytes=self.total_bytes,
            read_bytes=self.read_bytes,
            seconds=self.seconds,
            skip=self.skip,
        )

    def describe(self) -> str:
        if self.skip:
            return f"pre-warm skipped: {self.skip}"
        rate = self.read_bytes / GIB / self.seconds if self.seconds > 0 else 0.0
        return (
            f"pre-warmed {self.read_bytes / GIB:.2f} GiB of weights ({self.files} files) into the page cache "
            f"in {self.seconds:.1f} s ({rate:.2f} GiB/s) while the old server served"
        )


def model_dirs(flags: Mapping[str, object]) -> list[str]:
    """The local folders the unit loads weights from (a hub name that is not a folder is skipped)."""
    return [
        str(flags[f]) for f in MODEL_FLAGS if isinstance(flags.get(f), str) and str(flags[f]).startswith("/")
    ]


def decide(files: Sequence[WeightFile], mem_available: int, margin: int) -> Decision:
    """Read what is not resident yet, if it fits in the memory the host can spare beyond the margin."""
    total = sum(f.size for f in files)
    missing = sum(max(0, f.size - f.resident) for f in files)
    paths = tuple(f.path for f in files if f.resident < f.size)
    if not files:
        return Decision((), 0, 0, "no weight files found in the model folders")
    if missing == 0:
        return Decision((), total, 0, f"the weights ({total / GIB:.2f} GiB) are already in the page cache")
    spare = mem_available - margin
    if missing > spare:
        return Decision(
            (),
            total,
            missing,
            f"{missing / GIB:.1f} GiB of weights do not fit in {max(spare, 0) / GIB:.1f} GiB of free memory "
            f"(MemAvailable less a {margin / GIB:.0f} GiB margin)",
        )
    return Decision(paths, total, missing, None)


def weight_files(folders: Iterable[str]) -> list[WeightFile]:
    """Each weight file under the folders (not recursive: checkpoints keep their shards at the top)."""
    found: list[WeightFile] = []
    for folder in folders:
        try:
            entries = sorted(Path(folder).iterdir())
        except OSError:
            continue
        for p in entries:
            if p.suffix in WEIGHT_SUFFIXES and p.is_file():
                size = p.stat().st_size
                found.append(WeightFile(str(p), size, resident_bytes(p, size)))
    return found


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    with open(meminfo, encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def resident_bytes(path: Path, size: int) -> int:
    """How much of a file is in the page cache: mincore(2) over a read-only mapping; 0 if unknown."""
    if size == 0:
        return 0
    libc = _libc()
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    try:
        with open(path, "rb") as f:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    except OSError:
        return 0
    if addr is None or addr == ctypes.c_void_p(-1).value:  # MAP_FAILED
        return 0
    try:
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            return 0
    finally:
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    return min(size, sum(b & 1 for b in vec) * page)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return libc


def read_into_cache(paths: Sequence[str], stop: threading.Event, done: list[int]) -> None:
    """Read the regular files sequentially at idle I/O priority, adding the bytes read to done[0].

    Each file is opened without blocking and read only if it is a regular file (a FIFO that the
    model's folder names would block the open forever); `stop` ends the reading between chunks.
    """
    _idle_io()
    buf = bytearray(CHUNK)
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        with open(fd, "rb", buffering=0) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while not stop.is_set() and (n := f.readinto(buf)):
                done[0] += n
        if stop.is_set():
            return


@dataclass
class _Found:
    """What the reading thread found, handed to the waiting one."""

    files: list[WeightFile] = field(default_factory=list)
    decision: Decision | None = None
    error: Exception | None = None


def prewarm(flags: Mapping[str, object], margin: int, timeout_s: float = 1800.0) -> Prewarmed:
    """List, decide and read in a thread of its own, waited for at most timeout_s.

    A stalled mount (NFS gone) blocks a listing or a read in the kernel, where no thread can be
    interrupted: past the limit the reads are abandoned to that thread, and the change goes on.
    """
    start = time.monotonic()
    stop, done = threading.Event(), [0]
    box = _Found()

    def work() -> None:
        try:
            files = weight_files(model_dirs(flags))
            box.files, box.decision = files, decide(files, mem_available(), margin)
            if box.decision.skip is None:
                read_into_cache(box.decision.read, stop, done)
        except Exception as exc:  # reported by the waiting thread
            box.error = exc

    worker = threading.Thread(target=work, name="prewarm", daemon=True)
    worker.start()
    worker.join(timeout_s)
    stop.set()
    if box.error is not None:
        raise box.error
    seconds = time.monotonic() - start
    decision = box.decision
    if worker.is_alive() or decision is None:
        why = (
            f"stopped at its limit of {timeout_s:g} s after {done[0] / GIB:.2f} GiB (a stalled or slow disk)"
        )
        total = decision.total_bytes if decision else 0
        return Prewarmed(len(box.files), total, done[0], seconds, why)
    return Prewarmed(len(box.files), decision.total_bytes, done[0], seconds, decision.skip)


def _idle_io() -> None:
    """This thread's disk reads at the idle class: they wait whenever anything else reads."""
    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        return
    _libc().syscall(number, _IOPRIO_WHO_PROCESS, threading.get_native_id(), _IOPRIO_IDLE)
