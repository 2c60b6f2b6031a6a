"""Runs inside the oracle venv: SGLang 0.5.23's own sizing code on the CPU, answering JSON requests.

Usage: python _worker.py [--site SITE_PACKAGES] < {"requests": [...]} ; answers {"results": [...]} on the
original stdout (SGLang's own output goes to stderr). Every request in one call must name the same kind of
GPU (count, total memory, capability, name): SGLang caches some device facts at import. Each request runs in
a forked child, so SGLang's process-wide state never leaks from one sizing into the next.

Patched (GPU queries only, everything else is SGLang's code):
- torch.cuda: is_available, device_count, capability, name, properties, and mem_get_info, which answers the
  free memory before the weights during resolution and after them during sizing
  (SGLang reads it in utils/common.py get_available_gpu_memory);
- utils/common.py get_nvgpu_memory_capacity (it shells out to nvidia-smi): the card's total;
- torch.distributed collectives: no-ops, one process standing for every rank (all ranks are alike here);
- the WORLD group handle that kv_cache_configurator.py _profile_available_bytes passes to the MIN all-reduce.

No model is built, so what SGLang reads off the built model is given by a stand-in made with SGLang's own
code: a pipeline stage's layers (distributed/utils.py get_pp_indices, as make_layers takes them; each stage
is sized and the pool is the minimum, the MIN all-reduce of kv_cache_configurator.py
_apply_token_constraints) and the checkpoint's quant config (model_loader/weight_utils.py get_quant_config),
whose kv_cache_quant_algo decides --kv-cache-dtype auto (mem_cache/kv_cache_dtype.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any

GIB = 1 << 30
HERE = Path(__file__).resolve().parent


def _prepare_path(argv: list[str]) -> None:
    if "--site" in argv:
        import site

        where = argv[argv.index("--site") + 1]
        sys.path.insert(0, where)
        site.addsitedir(where)
    sys.path.insert(0, str(HERE))


class FakeGpus:
    """The simulated cards torch.cuda answers for; `free` moves from before-weights to after-weights."""

    def __init__(self, gpu: dict[str, Any]) -> None:
        self.count = int(gpu["count"])
        self.total = int(float(gpu["total_gib"]) * GIB)
        self.capability = tuple(gpu["capability"])
        self.name = str(gpu["name"])
        self.free = int(float(gpu["pre_gib"]) * GIB)

    def install(self) -> None:
        import torch

        cuda = torch.cuda
        props = types.SimpleNamespace(
            name=self.name, total_memory=self.total, major=self.capability[0], minor=self.capability[1],
            multi_processor_count=132, is_integrated=False, L2_cache_size=64 << 20, warp_size=32,
        )  # fmt: skip
        cuda.is_available = lambda: True
        cuda.device_count = lambda: self.count
        cuda.current_device = lambda: 0
        cuda.set_device = lambda *a, **k: None
        cuda.synchronize = lambda *a, **k: None
        cuda.empty_cache = lambda *a, **k: None
        cuda.get_device_capability = lambda *a, **k: self.capability
        cuda.get_device_name = lambda *a, **k: self.name
        cuda.get_device_properties = lambda *a, **k: props
        cuda.mem_get_info = lambda *a, **k: (self.free, self.total)
        torch.version.cuda = "12.9"  # utils/common.py is_cuda() also asks for a CUDA build
        import torch.distributed as dist

        dist.all_reduce = lambda *a, **k: None
        dist.barrier = lambda *a, **k: None
        dist.is_initialized = lambda: True
        dist.get_world_size = lambda *a, **k: 1
        dist.get_rank = lambda *a, **k: 0


def _import_sglang(gpus: FakeGpus) -> None:
    import _stubs

    _stubs.install()
    gpus.install()
    from sglang.srt.utils import common

    common.get_nvgpu_memory_capacity = lambda: gpus.total / (1 << 20)  # MiB, as nvidia-smi reports
    import sglang.srt.mem_cache.kv_cache_configurator
    import sglang.srt.model_executor.model_runner
    import sglang.srt.server_args  # noqa: F401


def _write_model(root: Path, name: str, config: dict[str, Any] | None) -> str | None:
    if config is None:
        return None
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < 200:
            self.lines.append(record.getMessage())


def size_one(req: dict[str, Any], gpus: FakeGpus) -> dict[str, Any]:
    """One sizing, as the scheduler's target worker does it, up to the pool-size resolution."""
    for key, value in req.get("env", {}).items():
        os.environ[key] = str(value)
    gpus.free = int(float(req["gpu"]["pre_gib"]) * GIB)
    root = Path(tempfile.mkdtemp(prefix="oracle-"))
    model = _write_model(root, "model", req["config"])
    draft = _write_model(root, "draft", req.get("draft_config"))
    argv = ["--model-path", str(model), *req.get("flags", [])]
    if draft:
        argv += ["--speculative-draft-model-path", draft]

    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import mm_runtime_reservation_gb
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
    from sglang.srt.runtime_context import get_context, get_mm, get_parallel, get_schedule, get_spec
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    collect = _Collect()
    server_args = prepare_server_args(argv)  # server_args.py; sets up logging, so attach after it
    logging.getLogger().addHandler(collect)
    server_args.resolve_once()  # arg_groups/pipeline.py: defaults, backend, page size, fraction
    get_context().set_server_args(server_args)
    model_config = ModelConfig.from_server_args(server_args)  # configs/model_config.py

    # model_executor/model_runner.py ModelRunner.__init__ / initialize, without NCCL, weights or streams
    runner = ModelRunner.__new__(ModelRunner)
    runner.server_args, runner.model_config, runner.is_draft_worker, runner.gpu_id = (
        server_args, model_config, False, 0,
    )  # fmt: skip
    runner.device, runner.model, runner.dtype = "cuda", None, model_config.dtype
    runner.memory_pool_config = runner.req_to_token_pool = runner.token_to_kv_pool_allocator = None
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    runner.page_size = get_schedule().page_size
    runner.is_hybrid_swa = model_config.is_hybrid_swa
    runner.is_hybrid_swa_compress = model_config.is_hybrid_swa_compress
    runner.use_mla_backend = model_config.attention_arch == AttentionArch.MLA
    runner.draft_model_idx = runner.draft_attention_backend = runner.forward_stream = None
    runner.sliding_window_size = getattr(model_config, "sliding_window_size", None)
    runner.init_spec_aux_hidden_state()
    runner.model = types.SimpleNamespace(quant_config=_quant_config(model_config))  # the built model's
    runner.configure_kv_cache_dtype()
    runner.model = None
    runner.pp_group = types.SimpleNamespace(world_size=1)
    runner.pre_model_load_memory = float(req["gpu"]["pre_gib"])
    get_parallel().override_permanently(
        world_group=types.SimpleNamespace(cpu_group=None, world_size=gpus.count)
    )
    gpus.free = int(float(req["gpu"]["post_gib"]) * GIB)  # the weights (and draft) are now loaded
    pool, kvc = _size_stages(runner, model_config, int(server_args.pp_size or 1))

    pool_configurator = create_memory_pool_configurator(kvc)
    schedule = get_schedule()
    return {
        "ok": True,
        "max_total_num_tokens": pool.max_total_num_tokens,
        "max_running_requests": pool.max_running_requests,
        "full_max_total_num_tokens": pool.full_max_total_num_tokens,
        "swa_max_total_num_tokens": pool.swa_max_total_num_tokens,
        "max_mamba_cache_size": getattr(schedule, "max_mamba_cache_size", None),
        "context_len": model_config.context_len,
        "mem_fraction_static": schedule.mem_fraction_static,
        "page_size": schedule.page_size,
        "chunked_prefill_size": resolution_result(server_args, "chunked_prefill_size"),
        "attention_backend": resolution_result(server_args, "attention_backend"),
        "kv_cache_dtype": str(runner.kv_cache_dtype).removeprefix("torch."),
        "cell_bytes": getattr(pool_configurator, "_cell_size", None),
        "draft_cell_bytes": kvc.dflash_draft_cell_size_per_token,
        "mm_reservation_gib": mm_runtime_reservation_gb(
            is_multimodal=model_config.is_multimodal, mm_feature_transport=get_mm().mm_feature_transport
        ),
        "is_multimodal": bool(model_config.is_multimodal),
        "attention_arch": model_config.attention_arch.name,
        "pool_configurator": type(pool_configurator).__name__,
        "logs": collect.lines,
    }


def _size_stages(runner: Any, model_config: Any, pp: int) -> tuple[Any, Any]:
    """Each pipeline stage sized with its own layers; the one with the fewest tokens, as the MIN all-reduce
    of kv_cache_configurator.py _apply_token_constraints leaves every stage."""
    from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices

    sized = []
    for stage in _stages(model_config, pp):
        runner.layer_info = resolve_layer_indices(
            model=stage, model_config=model_config, is_draft_worker=False
        )
        runner.init_kv_cache_configurator()
        kvc = runner.kv_cache_configurator
        sized.append((kvc._resolve_memory_pool_config(runner.pre_model_load_memory), kvc))
    return min(sized, key=lambda pk: pk[0].max_total_num_tokens)


def _stages(model_config: Any, pp: int) -> list[Any]:
    """One stand-in model per pipeline stage with the layers make_layers gives it (get_pp_indices)."""
    if pp <= 1:
        return [None]
    from sglang.srt.distributed.utils import get_pp_indices

    layers = model_config.num_hidden_layers
    out = []
    for rank in range(pp):
        start, end = get_pp_indices(layers, rank, pp)
        out.append(types.SimpleNamespace(start_layer=start, end_layer=end))
    return out


def _quant_config(model_config: Any) -> Any:
    """The checkpoint's quant config as the model loader builds it, None when it declares none."""
    if model_config.quantization is None:
        return None
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.weight_utils import get_quant_config

    return get_quant_config(model_config, LoadConfig(), {})


def _in_child(req: dict[str, Any], gpus: FakeGpus) -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = size_one(req, gpus)
        except BaseException as exc:  # SGLang's refusal is an answer too
            answer = {
                "ok": False,
                "error_type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc()[-4000:],
            }
        with os.fdopen(write, "w") as out:
            json.dump(answer, out, default=str)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"ok": False, "error_type": "Crash", "message": "child died"}


def _keep(path: Path, answer: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        tmp.write_text(json.dumps({"answer": answer}, sort_keys=True, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    _prepare_path(argv)
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # SGLang and torch print; only our JSON goes to the real stdout
    payload = json.load(sys.stdin)
    requests, store = payload["requests"], payload.get("store") or []
    results: list[dict[str, Any]] = []
    if requests:
        gpus = FakeGpus(requests[0]["gpu"])
        _import_sglang(gpus)
        for i, req in enumerate(requests):
            results.append(_in_child(req, gpus))
            if i < len(store):  # each answer is kept at once, even if whoever asked is gone by then
                _keep(Path(store[i]), results[-1])
    with os.fdopen(answer_fd, "w") as out:
        json.dump({"results": results}, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
