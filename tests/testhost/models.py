"""Model folders of real files for the simulated SGLang to load: its weights are read, not slept through.

Made once per machine next to the test host's root filesystem and bind-mounted read-only into every
instance at the paths the ct200-sim inventory names. The bytes are zeros written out (not a sparse
file), so a cold read really goes to the disk and a warm one comes from the page cache.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tests.testhost.rootfs import STATE_DIR

MODELS = STATE_DIR / "models"
MIB = 1 << 20
# folder in the test host -> (shards, MiB per shard). The benchmark scales the shards up (a load that
# dominates the restart, as on a real host) with DEPLOYCTL_TESTHOST_WEIGHTS_SCALE; each scale has its own
# folder, so tests and benchmark never rewrite each other's files.
LAYOUT = {"/models/Kimi-K2.6": (8, 96), "/models/Kimi-K2.6-DFlash": (1, 32)}


def scale() -> int:
    return max(1, int(os.environ.get("DEPLOYCTL_TESTHOST_WEIGHTS_SCALE", "1")))


def shard_paths(inside: str) -> list[Path]:
    shards, _ = LAYOUT[inside]
    folder = MODELS / f"x{scale()}" / Path(inside).name
    return [folder / f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]


def ensure_models() -> dict[str, str]:
    """Create the folders once (a size that changed is rewritten); {folder here: folder in the host}.

    Under a file lock: hosts booted at once (make faults' workers) would write and rename one .part file
    each from under the other."""
    MODELS.mkdir(parents=True, exist_ok=True)
    with open(MODELS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_models()


def _ensure_models() -> dict[str, str]:
    binds = {}
    for inside, (_, shard_mib) in LAYOUT.items():
        mib = shard_mib * scale()
        for path in shard_paths(inside):
            if not path.exists() or path.stat().st_size != mib * MIB:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".part")
                with open(tmp, "wb") as f:
                    block = bytes(MIB)
                    for _ in range(mib):
                        f.write(block)
                os.replace(tmp, path)
        binds[str(shard_paths(inside)[0].parent)] = inside
    return binds


def evict(inside: str) -> None:
    """Drop a folder's files from the page cache (the next read goes to the disk)."""
    for path in shard_paths(inside):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
