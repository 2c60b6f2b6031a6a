"""Runs inside the oracle venv: SGLang 0.5.23's own HiCache host-pool sizing, answering JSON cases.

Usage: python _hostpool_worker.py < {"cases": [...]} ; answers {"results": [...]} on stdout.

Everything that decides the answer is SGLang's code: HostKVCache.__init__ and _allocate_host_buffer
(pool_host/base.py: tokens, padding page, the budget check, its error and its log line),
host_memory_budget_bytes and ranks_per_host (base.py), available_host_memory_bytes and
_cgroup_memory_headroom (host_memory.py, reading a cgroup v2 tree written for the case), auto_size_hicache
(hicache_auto_size.py, with a device MHATokenToKVPool whose K/V buffers are meta tensors of the real shape),
resolve_decode_retraction_backup (kv_cache_builder.py) and MHATokenToKVPoolHost.get_size_per_token
(pool_host/mha.py).
Patched: psutil's available memory, /proc/self/{cgroup,mountinfo} (a folder per case), torch.distributed's
"initialized" and all_reduce (one process stands for every rank, all alike), get_parallel (launch world size,
nodes), the config bags SGLang reads its flags from, and uses_ssm_state (a model fact: dense attention here).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _cgroup_tree(root: Path, levels: list[dict[str, Any]]) -> Path:
    """A fake /proc and a cgroup2 mount: levels[0] is the top slice, the last holds the process."""
    proc = root / "proc/self"
    proc.mkdir(parents=True)
    mount = root / "cg"
    names = [f"l{i}" for i in range(len(levels))]
    (proc / "cgroup").write_text("0::/" + "/".join(names) + "\n")
    (proc / "mountinfo").write_text(f"30 1 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n")
    directory = mount
    directory.mkdir()
    for name, level in zip(names, levels, strict=True):
        directory = directory / name
        directory.mkdir()
        for key in ("max", "high"):
            value = level.get(key)
            (directory / f"memory.{key}").write_text(("max" if value is None else str(value)) + "\n")
        (directory / "memory.current").write_text(f"{level['usage']}\n")
        half = level["page_cache"] // 2
        (directory / "memory.stat").write_text(
            f"anon 1\nactive_file {half}\ninactive_file {level['page_cache'] - half}\n"
        )
        (directory / "memory.min").write_text("0\n")
    return root / "proc"


def _device_pool(geo: dict[str, Any]) -> tuple[Any, int]:
    """A device MHA (or MLA) pool with meta buffers of the real shape, and the host bytes per token."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dtype = getattr(torch, geo["dtype"])
    if geo.get("kv_cache_dim"):  # MLA: one latent row per token and layer (memory_pool.py MLATokenToKVPool)
        mla = object.__new__(MLATokenToKVPool)
        shape = (geo["device_tokens"] + geo["page_size"], 1, geo["kv_cache_dim"])
        mla.kv_buffer = [torch.empty(shape, dtype=dtype, device="meta") for _ in range(geo["layers"])]
        mla.size, mla.page_size, mla.dtype = geo["device_tokens"], geo["page_size"], dtype
        # pool_host/mla.py:195-197 computes it inside the host pool's constructor, which needs real buffers
        return mla, geo["kv_cache_dim"] * dtype.itemsize * geo["layers"]
    spec = types.SimpleNamespace(
        head_dim=geo["head_dim"], v_head_dim=geo["head_dim"], head_num=geo["heads"], layer_num=geo["layers"],
        dtype=dtype,
    )  # fmt: skip
    device = object.__new__(MHATokenToKVPool)
    shape = (geo["device_tokens"] + geo["page_size"], geo["heads"], geo["head_dim"])
    device.k_buffer = [torch.empty(shape, dtype=dtype, device="meta") for _ in range(geo["layers"])]
    device.v_buffer = [torch.empty(shape, dtype=dtype, device="meta") for _ in range(geo["layers"])]
    device.size, device.page_size, device.dtype = geo["device_tokens"], geo["page_size"], dtype
    return device, int(MHATokenToKVPoolHost.get_size_per_token(spec))


def _host(case: dict[str, Any], tmp: Path) -> None:
    """Ranks, available memory and the cgroup tree, as SGLang reads them."""
    import sglang.srt.mem_cache.hicache_auto_size as auto_mod
    import sglang.srt.mem_cache.host_memory as host_memory
    import sglang.srt.mem_cache.kv_cache_builder as builder
    import sglang.srt.mem_cache.pool_host.base as base
    import sglang.srt.runtime_context as runtime_context
    import torch.distributed as dist

    parallel = types.SimpleNamespace(
        launch_world_size=case["world_size"], nnodes=case["nnodes"], dcp_enabled=False,
        pp_group=types.SimpleNamespace(world_size=1), world_group=types.SimpleNamespace(cpu_group=None),
    )  # fmt: skip
    for module in (base, auto_mod, runtime_context, builder):
        module.get_parallel = lambda: parallel  # type: ignore[attr-defined]
    dist.is_initialized = lambda: True
    dist.all_reduce = lambda *a, **k: None
    host_memory.psutil = types.SimpleNamespace(  # type: ignore[attr-defined]
        virtual_memory=lambda: types.SimpleNamespace(available=case["available"])
    )
    original = getattr(host_memory, "_original_headroom", host_memory._cgroup_memory_headroom)
    host_memory._original_headroom = original  # type: ignore[attr-defined]
    proc_root = _cgroup_tree(tmp, case["cgroup"])
    host_memory._cgroup_memory_headroom = functools.partial(original, proc_root=proc_root)


def _decode_ratio(
    case: dict[str, Any], device: Any, size_gb: float, ratio: float | None
) -> tuple[str, float]:
    """resolve_decode_retraction_backup's backend and ratio for a decode server without HiCache."""
    import sglang.srt.mem_cache.kv_cache_builder as builder

    overrides: dict[str, Any] = {}
    memory = types.SimpleNamespace(
        enable_unified_memory=False, hicache_ratio=ratio, enable_hierarchical_cache=False,
        hicache_size=size_gb,
    )  # fmt: skip
    disagg = types.SimpleNamespace(
        disaggregation_decode_retraction_backup=None, disaggregation_mode="decode",
        disaggregation_decode_enable_radix_cache=False,
        disaggregation_decode_enable_offload_kvcache=False,
        disaggregation_decode_host_receive_threshold=case["decode"]["receive_threshold"],
    )  # fmt: skip
    context = types.SimpleNamespace(override=lambda source, **fields: overrides.update(fields))
    builder.get_memory, builder.get_disagg = (lambda: memory), (lambda: disagg)
    builder.get_context = lambda: context
    builder.get_schedule = lambda: types.SimpleNamespace(
        enable_priority_scheduling=False, disable_priority_preemption=False
    )
    builder.is_hip = lambda: False
    builder.uses_ssm_state = lambda config: False
    req_pool = types.SimpleNamespace(max_context_len=case["decode"]["context_len"] + 4)
    allocator = types.SimpleNamespace(get_kvcache=lambda: device)
    worker = types.SimpleNamespace(
        is_hybrid_swa=False, get_memory_pool=lambda: (req_pool, allocator),
        model_runner=types.SimpleNamespace(mtp_draft_device_pools=[], model_config=None),
    )  # fmt: skip
    backend = builder.resolve_decode_retraction_backup(tp_worker=worker)
    return backend, float(overrides.get("hicache_ratio", ratio or 0.0))


def _probe(layers: int, bytes_per_token: int) -> Any:
    """The abstract HostKVCache with SGLang's sizing and check, and no buffer."""
    import sglang.srt.mem_cache.pool_host.base as base

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    class Probe(base.HostKVCache):  # type: ignore[misc]
        def __init__(self, **kwargs: Any) -> None:
            self.layer_num = self.target_layer_num = layers
            super().__init__(**kwargs)

        def get_size_per_token(self) -> int:
            return bytes_per_token

        init_kv_buffer = clear = load_to_device_per_layer = backup_from_device_all_layer = nothing
        get_data_page = get_dummy_flat_data_page = set_from_flat_data_page = nothing

    return Probe


LOGGERS = (
    "sglang.srt.mem_cache.pool_host.base", "sglang.srt.mem_cache.hicache_auto_size",
    "sglang.srt.mem_cache.host_memory",
)  # fmt: skip


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def answer(case: dict[str, Any]) -> dict[str, Any]:
    import sglang.srt.mem_cache.hicache_auto_size as auto_mod

    geo = case["pool"]
    device, bytes_per_token = _device_pool(geo)
    flags = case["flags"]
    ratio, size_gb = flags.get("ratio"), float(flags.get("size_gb") or 0)
    fraction = flags.get("fraction", 0.8)
    if ratio is not None or size_gb > 0:  # hicache_hook.py: an explicit ratio or size turns auto off
        fraction = None
    if case.get("decode"):
        backend, ratio = _decode_ratio(case, device, size_gb, ratio)
        if backend != "host_pool":  # no host pool is built: the backup is a plain CPU tensor per request
            return {"bytes_per_token": bytes_per_token, "ok": True, "decode_backend": backend, "logs": []}
    elif ratio is None:
        ratio = 2.0
    overrides: dict[str, Any] = {}
    auto_mod.get_memory = lambda: types.SimpleNamespace(
        hicache_host_memory_fraction=fraction, hicache_ratio=ratio
    )
    auto_mod.get_context = lambda: types.SimpleNamespace(override=lambda source, **kw: overrides.update(kw))
    params = types.SimpleNamespace(
        token_to_kv_pool_allocator=types.SimpleNamespace(get_kvcache=lambda: device),
        req_to_token_pool=object(), mtp_draft_device_pools=[],
    )  # fmt: skip
    keep = _Keep()
    for name in LOGGERS:
        logging.getLogger(name).addHandler(keep)
        logging.getLogger(name).setLevel(logging.INFO)
    out: dict[str, Any] = {"bytes_per_token": bytes_per_token}
    with tempfile.TemporaryDirectory() as tmp:
        _host(case, Path(tmp))
        try:
            with auto_mod.auto_size_hicache(params, None, enabled=True):
                ratio = overrides.get("hicache_ratio", ratio)
                pool = _probe(geo["layers"], bytes_per_token)(
                    dtype=device.dtype, device_capacity_tokens=geo["device_tokens"],
                    size_per_token=bytes_per_token, start_layer=0, end_layer=geo["layers"],
                    host_to_device_ratio=ratio, host_size=size_gb,
                    page_size=geo["page_size"], layout="layer_first", pin_memory=False, device="cpu",
                )  # fmt: skip
            out.update(ok=True, tokens=pool.size, bytes=pool.size * pool.size_per_token, ratio=ratio)
        except ValueError as exc:  # SGLang's own refusal
            out.update(ok=False, error_type=type(exc).__name__, message=str(exc), ratio=ratio)
        finally:
            for name in LOGGERS:
                logging.getLogger(name).removeHandler(keep)
    out["logs"] = keep.lines
    return out


def main() -> int:
    import _stubs

    _stubs.install()
    cases = json.loads(sys.stdin.read())["cases"]
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    results = [answer(case) for case in cases]
    real_stdout.write(json.dumps({"results": results}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
