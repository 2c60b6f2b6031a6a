"""Pre-warming: what is read and when it is skipped (pure), and the page-cache facts it relies on (real)."""

from __future__ import annotations

import os
from pathlib import Path

from agent.host.prewarm import GIB, WeightFile, decide, model_dirs, prewarm, resident_bytes, weight_files


def test_reads_only_what_is_not_resident_when_it_fits() -> None:
    files = [WeightFile("/m/a.safetensors", 4 * GIB, 4 * GIB), WeightFile("/m/b.safetensors", 4 * GIB, GIB)]
    d = decide(files, mem_available=20 * GIB, margin=8 * GIB)
    assert d.skip is None and d.read == ("/m/b.safetensors",)
    assert (d.total_bytes, d.missing_bytes) == (8 * GIB, 3 * GIB)


def test_skips_weights_that_do_not_fit_beside_the_margin() -> None:
    files = [WeightFile("/m/a.safetensors", 30 * GIB, 0)]
    d = decide(files, mem_available=36 * GIB, margin=8 * GIB)
    assert d.read == () and d.skip is not None and "do not fit in 28.0 GiB" in d.skip


def test_skips_when_everything_is_resident_or_nothing_is_found() -> None:
    resident = decide([WeightFile("/m/a.safetensors", GIB, GIB)], 100 * GIB, 0)
    assert resident.read == () and "already in the page cache" in str(resident.skip)
    assert decide([], 100 * GIB, 0).skip == "no weight files found in the model folders"


def test_model_dirs_are_the_local_target_and_draft_folders() -> None:
    flags = {"model-path": "/models/k", "speculative-draft-model-path": "/models/d", "tp-size": 8}
    assert model_dirs(flags) == ["/models/k", "/models/d"]
    assert model_dirs({"model-path": "moonshotai/Kimi-K2.6"}) == []  # a hub name: nothing local to read


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_a_cold_file_is_read_into_the_page_cache(tmp_path: Path) -> None:
    shard = tmp_path / "model-00001-of-00001.safetensors"
    shard.write_bytes(b"\1" * (8 << 20))
    (tmp_path / "config.json").write_text("{}")  # not a weight file: never read
    _evict(shard)
    assert resident_bytes(shard, shard.stat().st_size) < shard.stat().st_size
    done = prewarm({"model-path": str(tmp_path)}, margin=0)
    assert (done.files, done.read_bytes, done.skip) == (1, 8 << 20, None)
    assert resident_bytes(shard, shard.stat().st_size) == shard.stat().st_size
    again = prewarm({"model-path": str(tmp_path)}, margin=0)
    assert again.read_bytes == 0 and "already in the page cache" in str(again.skip)
    assert [f.path for f in weight_files([str(tmp_path)])] == [str(shard)]
