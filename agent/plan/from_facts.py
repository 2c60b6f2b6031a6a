"""The one planner: a PlanInput (a facts file, the host's facts, or the inventory) to a PoolModel and a Plan.

Follows SGLang 0.5.23 (files named per rule, relative to sglang/srt/). Every figure's origin goes into the
notes; a kind deployctl does not follow is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from agent.errors import UsageError
from agent.inventory import FlagValue, HostConfig
from agent.plan.calibrate import Fit, calibrated
from agent.plan.choose import Plan, Target, choose
from agent.plan.cpu import is_cpu, plan_cpu
from agent.plan.evidence import (
    CELL_FLAGS,
    NotEvidence,
    admitted,
    as_started,
    decode_note,
    partial,
)
from agent.plan.facts import ModelInput, PlanInput, parse_facts, service_gpus
from agent.plan.from_inventory import plan_input_from_host
from agent.plan.model import (
    PoolModel,
    Start,
    StartFigures,
    start_of,
)
from agent.plan.overhead import RankLayout, is_amd, outside_service, overhead_for
from agent.plan.replan import replanned
from agent.plan.synthetic import synthetic_host
from agent.sglang import kvpool, memory_defaults, pools
from agent.sglang.config_json import with_override
from agent.sglang.kvlayout import KVLayout, Unsupported, read_layout
from agent.sglang.kvpool import GIB
from agent.sglang.model_registry import transformers_fallback
from agent.sglang.pools import DsaBackends, Parallel

if TYPE_CHECKING:
    from agent.protocol import HostFacts

EAGLE_STYLE = kvpool.EAGLE_STYLE
DFLASH_FAMILY = kvpool.DFLASH_FAMILY
_OFF = ("0", "false", "False", "no")


@dataclass(frozen=True)
class FactsModel:
    pool: PoolModel
    layout: KVLayout
    kv_dtype: str
    fraction: float  # the running fraction: the flag, else SGLang's own default
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # earlier starts set aside (plan/evidence.py): said first


def _flag(flags: Mapping[str, FlagValue], *names: str) -> FlagValue | None:
    for name in names:
        if name in flags and flags[name] is not None:
            return flags[name]
    return None


def _int(flags: Mapping[str, FlagValue], *names: str) -> int | None:
    value = _flag(flags, *names)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise UsageError(f"flags: --{names[0]} {value!r} is not an integer") from None


def _float(flags: Mapping[str, FlagValue], *names: str) -> float | None:
    value = _flag(flags, *names)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(str(value))
    except ValueError:
        raise UsageError(f"flags: --{names[0]} {value!r} is not a number") from None


def _on(flags: Mapping[str, FlagValue], name: str) -> bool:
    value = flags.get(name)
    return value is True or str(value).lower() in ("true", "1", "yes", "")


def parallel(inp: PlanInput) -> Parallel:
    """TP (default every GPU... SGLang's default is 1; a facts file names it), PP, attention DP, DCP.

    --attn-dp-size (0.5.23), or the deprecated --enable-dp-attention with --dp-size
    (arg_groups/parallel_hook.py).
    """
    f = inp.flags
    tp = _int(f, "tp-size", "tp", "tensor-parallel-size") or 1
    pp = _int(f, "pp-size", "pp", "pipeline-parallel-size") or 1
    dp = _int(f, "attn-dp-size")
    if dp is None and "enable-dp-attention" in f and _on(f, "enable-dp-attention"):
        dp = _int(f, "dp-size", "dp")
    return Parallel(tp=tp, pp=pp, attn_dp=max(1, dp or 1), dcp=_int(f, "dcp-size") or 1)


def _draft_layers(inp: PlanInput, layout: KVLayout, algorithm: str) -> tuple[int, KVLayout | None]:
    """The draft's KV layers and layout: its config.json, else the target's MTP layers (NEXTN)."""
    if inp.draft is not None:
        draft = read_layout(inp.draft.config, is_draft=True)
        return len(draft.kv_layers) or draft.layers, draft
    if algorithm in ("NEXTN", "EAGLE", "FROZEN_KV_MTP") and layout.nextn_layers:
        return layout.nextn_layers, None
    raise UsageError(f"--speculative-algorithm {algorithm}: the facts need the draft's config.json (draft)")


def _cells(inp: PlanInput, layout: KVLayout, dtype: str, par: Parallel, notes: list[str]) -> pools.PoolSizer:
    """Bytes per pool token and the family's sizing rule (pool_configurator.py)."""
    f, sm = inp.flags, inp.sm_major
    algorithm = str(_flag(f, "speculative-algorithm") or "").upper() or None
    # PP: each stage sizes its own layers and the pool is the minimum over stages (kv_cache_configurator
    # _apply_token_constraints, all-reduce MIN): the stage with the most KV layers, weights being even.
    stages = pools.pp_stage_layers(layout.layers, par.pp)
    kv = set(layout.kv_layers)
    stage_kv = max(sum(1 for i in st if i in kv) for st in stages)
    if par.pp > 1:
        notes.append(
            f"pipeline parallel {par.pp}: the stage with the most KV layers ({stage_kv}) sets the pool"
        )
    swa_ratio = None
    if layout.family == "swa":
        how = (dtype, par, algorithm)  # PP: the stage with the largest blended cell sets the pool
        cell, swa_ratio = max(_swa_cell(inp, st, how, notes) for st in pools.stage_layouts(layout, par.pp))
    else:
        cell = _full_cell(inp, layout, (dtype, par, algorithm), stage_kv)
    if algorithm not in (None, "NGRAM", *EAGLE_STYLE, *DFLASH_FAMILY):
        raise Unsupported(f"--speculative-algorithm {algorithm}: its pool is not followed by deployctl")
    page = _int(f, "page-size") or _default_page(layout, f, sm)
    env, transport = _mm_transport(inp, layout)
    reserve = pools.mm_reservation_gib(layout, env, transport)
    if reserve:
        notes.append(
            f"multimodal model: SGLang reserves {reserve:.2f} GB of the KV budget "
            "(SGLANG_VLM_CACHE_SIZE_MB; mem_cache/kv_cache_configurator.py mm_runtime_reservation_gb)"
        )
    mamba = _mamba(inp, layout, par, algorithm, notes)
    return pools.PoolSizer(
        cell_bytes=cell,
        page_size=page,
        reserve_gib=reserve,
        mamba=mamba,
        max_total_tokens=_int(f, "max-total-tokens"),
        swa_ratio=swa_ratio,
    )


def _swa_cell(
    inp: PlanInput, layout: KVLayout, how: tuple[str, Parallel, str | None], notes: list[str]
) -> tuple[float, float]:
    """The hybrid sliding-window cell (full rows plus ratio x sliding rows) and the ratio
    (pool_configurator.py HybridSWAPoolConfigurator)."""
    (dtype, par, algorithm), f = how, inp.flags
    full_bytes, swa_bytes = pools.swa_cells(layout, dtype, par.attn_tp)
    ratio = _float(f, "swa-full-tokens-ratio") or pools.SWA_FULL_TOKENS_RATIO
    if not 0 < ratio <= 1:
        raise UsageError("--swa-full-tokens-ratio should be in range (0, 1.0] (arg_groups/kv_cache_hook.py)")
    if _on(f, "disable-radix-cache") and "disable-radix-cache" in f and _int(f, "max-running-requests"):
        raise Unsupported(
            f"{layout.arch}: the SWA request-cap pool (--disable-radix-cache with --max-running-requests, "
            "SWARequestCapPoolConfigurator) is not followed by deployctl"
        )
    full_layer = full_bytes // max(1, len(layout.kv_layers))
    if algorithm in EAGLE_STYLE:
        draft_layers, _ = _draft_layers(inp, layout, algorithm)
        full_bytes += full_layer * draft_layers  # draft layers are full-attention rows
    notes.append(
        f"hybrid sliding-window pool: {len(layout.kv_layers)} full and {len(layout.swa_layers)} sliding "
        f"layers, sliding tokens = {ratio:g} x full (pool_configurator.py HybridSWAPoolConfigurator)"
    )
    return full_bytes + ratio * swa_bytes, ratio


def _full_cell(inp: PlanInput, layout: KVLayout, how: tuple[str, Parallel, str | None], layers: int) -> float:
    """The cell of every other family over the stage's KV layers, with the draft's share."""
    (dtype, par, algorithm), f = how, inp.flags
    prefill, decode = _flag(f, "dsa-prefill-backend"), _flag(f, "dsa-decode-backend")
    backends = DsaBackends(
        None if prefill is None else str(prefill),
        None if decode is None else str(decode),
        inp.sm_major,
        hip=is_amd(inp.gpu.name),
    )
    cell: float = pools.full_cell(layout, dtype, layers, par, backends)
    if algorithm in EAGLE_STYLE:
        return _eagle_cell(inp, layout, int(cell), layers, algorithm)
    if algorithm in DFLASH_FAMILY:
        return _dflash_cell(inp, layout, int(cell), layers, par)
    return cell


def _mm_transport(inp: PlanInput, layout: KVLayout) -> tuple[dict[str, str], str | None]:
    """The environment and feature transport the multimodal reservation is sized with.

    arg_groups/serving_hook.py: an unset --mm-feature-transport is cpu on one node (the legacy
    SGLANG_USE_CUDA_IPC_TRANSPORT=1 means cuda_ipc). arg_groups/model_overrides/qwen3_vl.py: Qwen3-VL on a
    Hopper card of 60 GiB or more turns the embedding cache off (SGLANG_VLM_CACHE_SIZE_MB=0) and, without
    cache retention, picks cuda_ipc, whose feature pool is 1 GiB (3 GiB from 400 running requests).
    """
    f, env = inp.flags, dict(inp.env)
    transport = _flag(f, "mm-feature-transport")
    if transport is None and env.get("SGLANG_USE_CUDA_IPC_TRANSPORT"):
        transport = (
            "cuda_ipc" if env["SGLANG_USE_CUDA_IPC_TRANSPORT"] not in ("0", "false", "False") else "cpu"
        )
    hopper = inp.sm_major == 9 and inp.gpu.memory_total_mib >= 60 * 1024
    if layout.multimodal and hopper and layout.model_type in ("qwen3_vl", "qwen3_vl_moe"):
        env.setdefault("SGLANG_VLM_CACHE_SIZE_MB", "0")
        preprocess = _int(f, "mm-preprocess-cache-size-mb") or 0
        retention = preprocess > 0 or int(env["SGLANG_VLM_CACHE_SIZE_MB"]) > 0
        nodes = _int(f, "nnodes") or 1
        if transport is None and nodes == 1 and not retention:
            transport = "cuda_ipc"
        running = _int(f, "max-running-requests") or 0
        wide = running >= 400 and not retention and transport == "cuda_ipc"
        if wide and "SGLANG_MM_FEATURE_CACHE_MB" not in env:
            env["SGLANG_MM_FEATURE_CACHE_MB"] = str(3 * 1024)
    return env, None if transport is None else str(transport)


def _eagle_cell(inp: PlanInput, layout: KVLayout, cell: int, layers: int, algorithm: str) -> int:
    """DefaultPoolConfigurator: cell + int(cell * L_draft / L); DSA scales the latent part and adds the
    draft's own indexer rows."""
    draft_layers, _ = _draft_layers(inp, layout, algorithm)
    if layout.family == "dsa":
        par = parallel(inp)
        indexer = pools.dsa_indexer_bytes(layout, max(0, layers - layout.dsa_shared_layers)) * par.dcp
        latent = int(int(cell - indexer) * draft_layers / layers)
        return cell + latent * par.dcp + pools.dsa_indexer_bytes(layout, draft_layers) * par.dcp
    return cell + int(cell * draft_layers / layers)


def _dflash_cell(inp: PlanInput, layout: KVLayout, cell: int, layers: int, par: Parallel) -> int:
    """DFLASH/DSPARK from 0.5.18: the target cell plus the draft's own K and V (speculative/dflash_utils.py),
    times the DCP size (pool_configurator.py _dflash_draft_cell_size)."""
    if inp.draft is None:
        raise UsageError("DFLASH / DSPARK: the facts need the draft's config.json (draft)")
    draft = read_layout(inp.draft.config, is_draft=True)
    dflash = inp.draft.config.sub("dflash_config")
    ids = dflash.value("target_layer_ids") if dflash is not None else None
    if isinstance(ids, list) and any(not isinstance(i, int) or not 0 <= i < layout.layers for i in ids):
        # speculative/dflash_utils.py resolve_target_layer_ids: SGLang refuses the start.
        raise ValueError(
            f"the DFLASH draft reads target layers {ids}, but the target has {layout.layers}: SGLang refuses "
            "it (target_layer_ids contains an out-of-range layer id); is it the draft of another model?"
        )
    version = _version(inp)
    if version is not None and version < kvpool.DFLASH_EXACT_FROM:
        # 0.5.11-0.5.17: the target cell scaled by layers (the exact draft term starts at 0.5.18).
        return -(-cell * (layers + draft.layers) // layers)
    # mem_cache/draft_kv_budget.py: the draft resolves --speculative-draft-kv-cache-dtype, else
    # --kv-cache-dtype, against its own dtype and no quant config (auto = the draft's dtype); an fa4
    # draft backend keeps its compute dtype (mem_cache/kv_cache_dtype.py).
    flag = (
        _flag(inp.flags, "speculative-draft-kv-cache-dtype") or _flag(inp.flags, "kv-cache-dtype") or "auto"
    )
    draft_dtype = "auto" if _flag(inp.flags, "speculative-draft-attention-backend") == "fa4" else str(flag)
    if draft_dtype != "auto" and draft_dtype not in pools.KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {draft_dtype!r}: SGLang 0.5.23 refuses it")
    elem = pools.elem_bytes(draft_dtype, draft)
    heads = pools.heads_per_rank(draft.kv_heads, par.attn_tp)
    return cell + int(heads * (draft.head_dim + draft.v_head_dim) * draft.layers * elem) * par.dcp


def _version(inp: PlanInput) -> tuple[int, int, int, int] | None:
    try:
        return kvpool.parse_version(inp.sglang_version)
    except ValueError:
        return None


def _refusals(layout: KVLayout, flags: Mapping[str, FlagValue], dtype: str, sm: int | None) -> None:
    """KV dtypes SGLang 0.5.23 refuses at start on this hardware (ValueError, as SGLang raises)."""
    if _flag(flags, "kv-cache-dtype") == "mxfp8" and (sm or 0) < 10:
        # arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility
        raise ValueError("--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU (SGLang refuses it)")
    backend = _flag(flags, "decode-attention-backend", "attention-backend")
    trtllm_mla = backend == "trtllm_mla" or (backend is None and sm == 10 and layout.family == "mla")
    if trtllm_mla and dtype not in ("fp8_e4m3", "bf16", "bfloat16", "auto"):
        # arg_groups/overrides.py _mla_kv_cache_dtype_checks
        raise ValueError(
            f"--kv-cache-dtype {dtype}: SGLang's TensorRT-LLM MLA backend takes fp8_e4m3, bf16 or auto"
        )


def _default_page(layout: KVLayout, flags: Mapping[str, FlagValue], sm: int | None) -> int:
    """The page size SGLang resolves.

    arg_groups/overrides.py _mla_backend_page_constraints and _page_size_default, model_override_base.py
    get_default_attn_backend: DSA pages by 64; flashmla, trtllm_mla, cutedsl_mla and trtllm_mha need 32/64
    (64 when unset); SM100 defaults MHA to trtllm_mha (fa4 for unequal K/V widths) and DeepSeek/Kimi MLA
    to trtllm_mla; otherwise 1.
    """
    if layout.family == "dsa":
        return pools.DSA_PAGE
    backend = _flag(flags, "decode-attention-backend", "attention-backend")
    if backend is None and sm == 10:
        if layout.kv_lora_rank:
            backend = "trtllm_mla"
        elif layout.head_dim == layout.v_head_dim:
            backend = "trtllm_mha"
    return 64 if backend in ("flashmla", "trtllm_mla", "cutedsl_mla", "trtllm_mha") else 1


def _mamba(
    inp: PlanInput, layout: KVLayout, par: Parallel, algorithm: str | None, notes: list[str]
) -> pools.MambaShare | None:
    """kv_cache_configurator._handle_max_mamba_cache: the state cache takes rest x r/(1+r) (r =
    --mamba-full-memory-ratio, 0.9), or --max-mamba-cache-size slots; the KV pool gets the remainder."""
    if layout.linear is None:
        return None
    if algorithm not in (None, "NGRAM"):
        raise Unsupported(
            f"{layout.arch} with --speculative-algorithm {algorithm}: the state cache's intermediate share "
            "is not followed by deployctl"
        )
    linear = layout.linear
    per_req = linear.per_request_bytes(par.attn_tp)
    if par.pp > 1:  # the largest stage's share of the linear layers
        stages = pools.pp_stage_layers(layout.layers, par.pp)
        most = max(sum(1 for i in linear.layers if i in st) for st in stages)
        per_req = int(per_req * most / max(1, len(linear.layers)))
    f = inp.flags
    ratio = _float(f, "mamba-full-memory-ratio") or pools.MAMBA_FULL_MEMORY_RATIO
    size = _int(f, "max-mamba-cache-size")
    running = _int(f, "max-running-requests")
    if size is not None:
        size //= par.attn_dp
    elif "disable-radix-cache" in f and _on(f, "disable-radix-cache") and running:
        size = max(1, running // par.attn_dp)
    notes.append(
        f"{linear.kind} linear-attention state: {per_req / 2**20:.1f} MiB per request slot over "
        f"{len(linear.layers)} layers; only the {len(layout.kv_layers)} full-attention layers are in "
        "the KV cell; "
        + (
            f"{size} state slots (--max-mamba-cache-size)"
            if size is not None
            else f"the state cache takes {ratio:g}/(1+{ratio:g}) of the budget"
        )
    )
    return pools.MambaShare(per_slot_bytes=per_req, ratio=ratio, cache_size=size)


def _multimodal(inp: PlanInput, layout: KVLayout, notes: list[str]) -> KVLayout:
    """configs/model_config.py: --language-only (or language_model_only) serves the LM alone; Gemma 3,
    Llama 4 and Step3-VL serve text only unless --enable-multimodal."""
    f = inp.flags
    if not layout.multimodal:
        return layout
    lm_only = any(name in f and _on(f, name) for name in ("language-only", "language-model-only"))
    enabled = "enable-multimodal" in f and _on(f, "enable-multimodal")
    if lm_only or (layout.multimodal_off_by_default and not enabled):
        why = "--language-only" if lm_only else "SGLang disables it for this model unless --enable-multimodal"
        notes.append(f"{layout.arch} served as text only ({why}): no multimodal reservation")
        return replace(layout, multimodal=False)
    return layout


def _fraction(inp: PlanInput, layout: KVLayout, par: Parallel, notes: list[str]) -> float:
    """The running fraction: the flag, else SGLang's own default (arg_groups/memory_hook.py)."""
    given = _float(inp.flags, "mem-fraction-static")
    if given is not None:
        return given
    given_flags = memory_defaults.MemoryFlags(
        chunked_prefill=_int(inp.flags, "chunked-prefill-size"),
        decode_max_bs=_int(inp.flags, "cuda-graph-max-bs-decode"),
        max_running_requests=_int(inp.flags, "max-running-requests"),
        max_total_tokens=_int(inp.flags, "max-total-tokens"),
        cuda_graph=not (
            ("disable-cuda-graph" in inp.flags and _on(inp.flags, "disable-cuda-graph"))
            or _flag(inp.flags, "cuda-graph-backend-decode") == "disabled"
        ),
    )
    settings = memory_defaults.default_fraction(layout, inp.gpu.memory_total_mib, par, given_flags)
    notes.append(
        f"--mem-fraction-static is not set: SGLang 0.5.23 would use about {settings.fraction:.3f} on this "
        "card (arg_groups/memory_hook.py handle_gpu_memory_settings); the plan gives the unit its own, to "
        "three decimals"
    )
    return settings.fraction


def _aiter_scale(inp: PlanInput, arch: Sizing, context: int, notes: list[str]) -> float:
    """arg_groups/attention_hook.py: aiter above 8k context runs at 0.85 x the fraction."""
    backend = attention_backend(inp, arch.layout, arch.par)
    explicit = _flag(inp.flags, "mem-fraction-static") is not None
    honor = bool(inp.env.get("SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION"))
    scale = memory_defaults.aiter_fraction(
        1.0, backend=backend, context_len=context, explicit=explicit, honor=honor
    )
    if scale != 1.0:
        notes.append(
            "AMD aiter with a context above 8,192: SGLang runs at 0.85 x the given --mem-fraction-static "
            "(arg_groups/attention_hook.py); set SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION=1 in the unit to "
            "use the fraction as given. The plan accounts for the 0.85"
        )
    elif backend is not None and is_amd(inp.gpu.name) and _flag(inp.flags, "attention-backend") is None:
        notes.append(
            f"AMD: SGLang picks the {backend} attention backend for this model, so no 0.85 x fraction"
        )
    return scale


def attention_backend(inp: PlanInput, layout: KVLayout, par: Parallel) -> str | None:
    """The attention backend SGLang resolves where it changes the pool: the flag (or equal prefill and
    decode flags, arg_groups/overrides.py _attention_backend_default), else on AMD the ROCm default:
    dsa for DSA models (arg_groups/model_overrides/deepseek_v2.py), aiter for MHA, and for MLA aiter only
    with 16 or 128 KV heads per rank, else triton (model_override_base.py get_default_attn_backend)."""
    f = inp.flags
    prefill, decode = _flag(f, "prefill-attention-backend"), _flag(f, "decode-attention-backend")
    if prefill is not None and prefill == decode:
        return str(prefill)
    backend = _flag(f, "attention-backend")
    if backend is not None:
        return str(backend)
    if not is_amd(inp.gpu.name):
        return None
    if layout.family == "dsa":
        return "dsa"
    if layout.kv_lora_rank:
        heads = max(1, _total_kv_heads(inp.model) // max(1, par.tp))
        return "aiter" if heads in (16, 128) else "triton"
    return "aiter"


def _total_kv_heads(model: ModelInput) -> int:
    """configs/model_config.py get_total_num_kv_heads of the text config (MLA models list theirs too)."""
    text = model.config.sub("text_config") or model.config
    return int(text.number("num_key_value_heads") or text.number("num_attention_heads") or 0)


@dataclass(frozen=True)
class Sizing:
    """The architecture's side of a plan: the KV layout, dtype, parallelism and the pool's sizer."""

    layout: KVLayout
    dtype: str
    par: Parallel
    sizer: pools.PoolSizer
    notes: tuple[str, ...]


def pool_model(inp: PlanInput, context: int) -> FactsModel:
    """The PoolModel for this host: cold from the facts, or calibrated by the last start's memory lines."""
    arch = sizing(inp)
    layout, dtype, par, sizer, notes = arch.layout, arch.dtype, arch.par, arch.sizer, list(arch.notes)
    inp, aside = admitted(inp, par.tp, par.pp)  # only a start of this model, layout and cards calibrates
    fraction = _fraction(inp, layout, par, notes)
    scale = _aiter_scale(inp, arch, context, notes)
    # What every model of this host shares; the memory figures and the cell come from the starts or the card.
    shape = PoolModel(
        0.0, 0.0, sizer.cell_bytes, "architecture", 0.0, False, page_size=sizer.page_size,
        max_total_tokens=sizer.max_total_tokens, dp=par.attn_dp, sizer=sizer, fraction_scale=scale,
    )  # fmt: skip
    model, aside = _evidenced(inp, fraction, par, (shape, sizer), (notes, aside))
    return FactsModel(model, layout, dtype, fraction, tuple(notes), aside)


def _evidenced(
    inp: PlanInput,
    fraction: float,
    par: Parallel,
    shaped: tuple[PoolModel, pools.PoolSizer],
    said: tuple[list[str], tuple[str, ...]],
) -> tuple[PoolModel, tuple[str, ...]]:
    """The fitted model; a start whose cell is not this architecture's is set aside (plan/evidence.py)."""
    notes, aside = said
    try:
        return _fitted(inp, fraction, par, shaped, notes), aside
    except NotEvidence as exc:
        aside = (*aside, f"the earlier start is set aside: {exc}; it does not calibrate this plan")
        return _fitted(replace(inp, starts=(), start_ids=()), fraction, par, shaped, notes), aside


def _fitted(
    inp: PlanInput,
    fraction: float,
    par: Parallel,
    shaped: tuple[PoolModel, pools.PoolSizer],
    notes: list[str],
) -> PoolModel:
    """The pool model calibrated by the earlier starts, or by their memory lines, else cold."""
    shape = shaped[0]
    flags_for_start = {**inp.flags, "mem-fraction-static": fraction}
    starts = [s for s in (start_of(f, flags_for_start) for f in inp.starts) if s is not None]
    memory = [f for f in inp.starts if f.get("avail_mem_before_weights_gb") and _post(f)]
    if inp.starts and not starts and not memory:
        notes.append("the earlier start(s) given did not log a pool and the memory lines; not used")
    _refuse_gaps(inp, calibrated=bool(starts))
    if starts:
        return _calibrated_as_started(inp, starts, shaped, notes)
    elif memory:  # a start that died before its pool still tells pre and post
        pre, post = (
            float(memory[-1].get("avail_mem_before_weights_gb") or 0.0),
            float(_post(memory[-1]) or 0.0),
        )
        cut = partial(inp, post, par.tp)  # a start cut before the draft loaded (plan/evidence.py)
        post, why = cut if cut is not None else (post, None)
        notes.append(
            f"pre {pre:.2f} GiB and post {post:.2f} GiB from the last start's memory lines "
            "(it logged no pool: the cell is the architecture's)" + (f"; {why}" if why else "")
        )
        return replace(shape, pre_gib=pre, post_gib=post, basis="calibrated", partial=why)
    return _cold(inp, par, shape, notes)


def _calibrated_as_started(
    inp: PlanInput, starts: list[Start], shaped: tuple[PoolModel, pools.PoolSizer], notes: list[str]
) -> PoolModel:
    """Calibrated at the flags the starts ran with; a cell-changing flag since (KV dtype, page size, a draft)
    scales the measured cell by the architecture's ratio; the start's memory is kept (plan/evidence.py)."""
    fit = Fit(inp.flags, _origin(inp), _figure_gaps(inp))
    then = as_started(inp)
    if then is None:
        return calibrated(starts, shaped, notes, fit)
    shape, now = shaped
    was = sizing(then).sizer
    model = calibrated(starts, (replace(shape, cell_bytes=was.cell_bytes, sizer=was), was), notes, fit)
    ratio = now.cell_bytes / was.cell_bytes
    measured = model.sizer.cell_bytes if model.sizer is not None else model.cell_bytes
    sizer = replace(now, cell_bytes=measured * ratio)
    changed = ", ".join(f"--{k}" for k in CELL_FLAGS if then.flags.get(k) != inp.flags.get(k))
    notes.append(
        f"the start ran before {changed} changed: its cell times the architecture's ratio {ratio:.3f} "
        f"({was.cell_bytes:,.0f} to {now.cell_bytes:,.0f} B per token), its memory kept"
    )
    return replace(model, cell_bytes=sizer.cell_bytes, sizer=sizer, page_size=sizer.page_size)


def _origin(inp: PlanInput) -> str:
    """Where the architecture came from, in the words a note asks the reader to check."""
    return "the inventory" if inp.sources.get("architecture", "").startswith("inventory") else "the facts"


def _figure_gaps(inp: PlanInput) -> tuple[str, ...]:
    """The missing figures that shape the cell (the weights only matter before a first start)."""
    return tuple(g for g in inp.gaps if not g.endswith("weights_gib_per_gpu"))


def _refuse_gaps(inp: PlanInput, calibrated: bool) -> None:
    """Without a start that logged its pool, every figure the source lacks is needed: name them all."""
    if inp.gaps and not calibrated:
        raise UsageError(
            f"cannot plan {inp.name} without an earlier start: {_origin(inp)} lacks " + ", ".join(inp.gaps),
            hint="add them to the host's inventory file, or pass --from-log with a start-up log of this host",
        )


def sizing(inp: PlanInput) -> Sizing:
    """The layout and sizer of the host's model under its flags; a kind not followed is refused."""
    notes: list[str] = []
    try:
        layout = read_layout(with_override(inp.model.config, _flag(inp.flags, "json-model-override-args")))
        if layout.swa_disabled_by_sglang:
            notes.append(layout.swa_disabled_by_sglang)
        if (
            layout.family == "swa"
            and "disable-hybrid-swa-memory" in inp.flags
            and _on(inp.flags, "disable-hybrid-swa-memory")
        ):
            layout = replace(layout, family="mha", kv_layers=tuple(range(layout.layers)), swa_layers=())
            notes.append("--disable-hybrid-swa-memory: every layer holds full-size KV (model_config.py)")
        layout = _multimodal(inp, layout, notes)
        notes.extend(filter(None, [_backend(inp, layout)]))
        par = parallel(inp)
        if par.dcp > 1:
            raise Unsupported(
                "--dcp-size > 1: decode context parallel counts logical tokens over ranks, which deployctl "
                "does not follow yet"
            )
        dtype = pools.kv_dtype(str(_flag(inp.flags, "kv-cache-dtype") or "auto"), layout, inp.sm_major)
        _refusals(layout, inp.flags, dtype, inp.sm_major)
        sizer = _cells(inp, layout, dtype, par, notes)
    except Unsupported as exc:
        raise UsageError(f"cannot plan this model: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{inp.name}: {exc}") from None
    notes.append(
        f"{_label(inp, layout)}: {layout.family} pool, {sizer.cell_bytes:,.0f} B per token per GPU "
        f"(KV dtype {dtype if dtype != 'auto' else f'auto = {layout.dtype_bytes} B'}, "
        f"attention TP {par.attn_tp}, "
        f"page {sizer.page_size}); architecture from {inp.sources.get('architecture', 'config.json')}"
    )
    return Sizing(layout, dtype, par, sizer, tuple(notes))


def _backend(inp: PlanInput, layout: KVLayout) -> str | None:
    """SGLang's Transformers fallback for a model it has no class of (the inventory's figures name none)."""
    impl = str(_flag(inp.flags, "model-impl") or "auto")
    if _origin(inp) == "the inventory":
        return None
    return transformers_fallback(inp.model.config, impl, inp.sglang_version, layout.family)


def _label(inp: PlanInput, layout: KVLayout) -> str:
    """The model's name in the notes: its architecture, or the inventory's figures it was written from."""
    return "the inventory's figures" if _origin(inp) == "the inventory" else layout.arch


def _post(figures: StartFigures) -> float | None:
    value = figures.get("avail_mem_before_pool_gb") or figures.get("avail_mem_after_weights_gb")
    return None if value is None else float(value)


def _cold(inp: PlanInput, par: Parallel, shape: PoolModel, notes: list[str]) -> PoolModel:
    """No start yet: pre = card - overhead (overhead.py), post = pre - weights per GPU (target + draft:
    0.5.14+ loads the draft before sizing, Scheduler.init_model_worker)."""
    if inp.model.weights_bytes is None:
        raise UsageError(
            f"cannot plan {inp.name} without an earlier start: the facts lack model.weights_bytes",
            hint="add weights_bytes (the checkpoint's tensor bytes) or last_start (a start-up log)",
        )
    attn_tp = par.attn_tp if par.attn_dp > 1 else None
    layout = RankLayout(par.tp, par.pp, attn_tp, _custom_ar(inp), _quick_reduce_gib(inp))
    over = overhead_for(inp.gpu.name, inp.gpu.memory_gib, layout)
    others = outside_service([g.processes for g in inp.gpus])  # other processes on the service's GPUs
    pre = inp.gpu.memory_gib - over.gib - others.gib
    shards = par.tp * par.pp
    weights = inp.model.weights_bytes / shards / GIB
    draft = (inp.draft.weights_bytes or 0) / par.tp / GIB if inp.draft is not None else 0.0
    notes.append(
        f"cold estimate: {over.why}; weights {weights:.2f} GiB per GPU"
        + (f" + draft {draft:.2f} GiB" if draft else "")
        + (f"; less {others.why}" if others.why else "")
    )
    return replace(shape, pre_gib=pre, post_gib=pre - weights - draft, margin_gib=over.margin_gib)


def _custom_ar(inp: PlanInput) -> bool:
    """Whether SGLang sets up the (aiter, on ROCm) custom all-reduce: --disable-custom-all-reduce and
    SGLANG_USE_AITER_AR=0 (distributed/device_communicators/custom_all_reduce.py) turn the aiter one off."""
    off = "disable-custom-all-reduce" in inp.flags and _on(inp.flags, "disable-custom-all-reduce")
    return not off and inp.env.get("SGLANG_USE_AITER_AR", "true") not in _OFF


def _quick_reduce_gib(inp: PlanInput) -> float:
    """ROCm quick all-reduce: on with ROCM_QUICK_REDUCE_QUANTIZATION in FP/INT8/INT6/INT4; its max problem
    size is ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB, else 2 GiB (device_communicators/quick_all_reduce.py)."""
    if inp.env.get("ROCM_QUICK_REDUCE_QUANTIZATION", "NONE") not in ("FP", "INT8", "INT6", "INT4"):
        return 0.0
    try:
        mib = int(inp.env.get("ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB", "0"))
    except ValueError:
        mib = 0
    return mib / 1024 if mib > 0 else 2.0


def plan_from_facts(inp: PlanInput, asked: Target, replan: bool = True) -> Plan:
    """Plan a host from its PlanInput: a facts file, the host's own facts, or the inventory. The notes
    name every figure's origin."""
    origins = "figures from " + "; ".join(f"{k}: {v}" for k, v in inp.sources.items())
    if is_cpu(inp):
        arch = sizing(inp)
        return plan_cpu(inp, asked, arch.sizer, (*arch.notes, origins))
    fm = pool_model(inp, asked.context)
    # The running fraction as the unit is given it: three decimals (a VLM's SGLang default is unrounded).
    host = synthetic_host(inp, fm.layout, round(fm.fraction, 3), parallel(inp))
    plan = choose(host, asked, fm.pool, inp.starts, _estimate_notes(fm.pool, inp))
    extra = [*fm.notes, origins, *_attention_dp_note(inp, fm), *_state_notes(inp, fm, plan), decode_note(inp)]
    warnings = (*fm.warnings, *plan.warnings, *_version_warning(inp))
    plan = replace(plan, notes=(*extra, *plan.notes), warnings=warnings)
    # Each alternative as the planner plans it with its flags (plan/replan.py), not re-checked again.
    return replanned(inp, plan, asked, lambda i, t: plan_from_facts(i, t, replan=False)) if replan else plan


def _estimate_notes(model: PoolModel, inp: PlanInput) -> tuple[str, ...]:
    if model.basis != "architecture":
        return ()
    return (
        f"estimated from {_origin(inp)}: pre {model.pre_gib:.2f} GiB, post {model.post_gib:.2f} GiB, "
        f"{model.cell_bytes_effective():,.0f} B/token; the first real start will calibrate the plan",
    )


def _version_warning(inp: PlanInput) -> tuple[str, ...]:
    version = _version(inp)
    if version is not None and version[:3] == (0, 5, 23):
        return ()
    return (
        f"the host runs SGLang {inp.sglang_version}: this plan follows 0.5.23's sizing rules "
        "(the versions differ in drafts before 0.5.14, DFLASH before 0.5.18 and the hybrid pools); "
        "let the first start calibrate it",
    )


def _attention_dp_note(inp: PlanInput, fm: FactsModel) -> tuple[str, ...]:
    if parallel(inp).attn_dp > 1 and fm.pool.basis == "architecture":
        return ("attention DP replicates the attention weights on every rank: the cold post is optimistic",)
    return ()


def _state_notes(inp: PlanInput, fm: FactsModel, plan: Plan) -> list[str]:
    """What the hybrid pools hold besides the full-attention tokens: state slots, sliding-window tokens."""
    notes: list[str] = []
    sizer = fm.pool.sizer
    if sizer is not None and sizer.mamba is not None and plan.mem_fraction_static:
        rest = fm.pool.post_gib - fm.pool.pre_gib * (1 - plan.mem_fraction_static * fm.pool.fraction_scale)
        slots = sizer.mamba.slots(rest - sizer.reserve_gib)
        # kv_cache_configurator.resolve_max_num_reqs: 3 state slots per request (1 without radix cache).
        per = 1 if _on(inp.flags, "disable-radix-cache") and "disable-radix-cache" in inp.flags else 3
        notes.append(
            f"the state cache holds {slots:,} slots: SGLang caps --max-running-requests at {slots // per:,} "
            f"({per} slot(s) per request)"
        )
    if sizer is not None and sizer.swa_ratio is not None:
        swa = sizer.swa_tokens(plan.predicted_pool_tokens)
        window = fm.layout.sliding_window
        notes.append(f"the sliding-window layers hold {swa:,} tokens (window {window})")
        if window and swa is not None and swa <= window + fm.pool.page_size:
            notes.append("SGLang refuses this: 'SWA pool ... cannot hold even one request' (raise the ratio)")
    return notes


def plan_from_host_facts(
    host: HostConfig,
    facts: HostFacts,
    calibration: Sequence[StartFigures] | None,
    asked: Target,
) -> Plan | None:
    """The plan from what the host's agent read (config.json, safetensors headers, nvidia-smi), the
    inventory's figures overriding; None when the host gave no config.json (plan_for_host plans then)."""
    given = facts.get("model_facts")
    if not isinstance(given, Mapping):
        return None
    doc: dict[str, object] = dict(given)  # the facts document, as parse_facts reads it
    if not (given.get("sglang") or {}).get("version"):
        doc["sglang"] = {"version": host.sglang.version}
    rows = given.get("gpus")
    inventory_gpus = not rows
    if not rows:  # no nvidia-smi on the host: the inventory's cards
        card = {"name": host.gpus.name, "memory_total_mib": host.gpus.memory_gib * 1024}
        doc["gpus"] = [card] * host.gpus.count
    else:  # the host's GPUs: only this service's own
        doc["gpus"] = service_gpus(rows, host)
    inp = plan_input_from_host(host, parse_facts(doc, name=f"{host.name} (host facts)"),
                               starts=tuple(calibration or ()))  # fmt: skip
    if inventory_gpus:
        inp = replace(inp, sources={**inp.sources, "gpus": "inventory: gpus (no nvidia-smi rows)"})
    return plan_from_facts(inp, asked)
