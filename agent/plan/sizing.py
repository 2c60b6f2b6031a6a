"""The architecture's side of a plan: the KV layout, dtype and parallelism of the host's model under its
flags, and the pool's sizer (bytes per token per GPU and the family's sizing rule). The first step of the
planner: what the evidence (plan/evidence.py) and the prediction (plan/predict.py) build on.

Follows SGLang 0.5.23 (files named per rule, relative to sglang/srt/); a kind deployctl does not follow is
refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.errors import UsageError
from agent.inventory import FlagValue
from agent.plan.facts import ModelInput, PlanInput
from agent.plan.inputs import float_of, int_of, is_on, origin, sglang_version, value_of
from agent.plan.overhead import is_amd
from agent.plan.startrefusals import start_refusals
from agent.sglang import kvpool, pools
from agent.sglang.config_json import with_override
from agent.sglang.kvlayout import KVLayout, Unsupported, read_layout
from agent.sglang.model_registry import transformers_fallback
from agent.sglang.pools import DsaBackends, Parallel

EAGLE_STYLE = kvpool.EAGLE_STYLE
DFLASH_FAMILY = kvpool.DFLASH_FAMILY


def parallel(inp: PlanInput) -> Parallel:
    """TP (default every GPU... SGLang's default is 1; a facts file names it), PP, attention DP, DCP.

    --attn-dp-size (0.5.23), or the deprecated --enable-dp-attention with --dp-size
    (arg_groups/parallel_hook.py).
    """
    f = inp.flags
    tp = int_of(f, "tp-size", "tp", "tensor-parallel-size") or 1
    pp = int_of(f, "pp-size", "pp", "pipeline-parallel-size") or 1
    dp = int_of(f, "attn-dp-size")
    if dp is None and "enable-dp-attention" in f and is_on(f, "enable-dp-attention"):
        dp = int_of(f, "dp-size", "dp")
    return Parallel(tp=tp, pp=pp, attn_dp=max(1, dp or 1), dcp=int_of(f, "dcp-size") or 1)


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
    algorithm = str(value_of(f, "speculative-algorithm") or "").upper() or None
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
    page = _page(layout, f, sm)
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
        max_total_tokens=int_of(f, "max-total-tokens"),
        swa_ratio=swa_ratio,
    )


def _swa_cell(
    inp: PlanInput, layout: KVLayout, how: tuple[str, Parallel, str | None], notes: list[str]
) -> tuple[float, float]:
    """The hybrid sliding-window cell (full rows plus ratio x sliding rows) and the ratio
    (pool_configurator.py HybridSWAPoolConfigurator)."""
    (dtype, par, algorithm), f = how, inp.flags
    full_bytes, swa_bytes = pools.swa_cells(layout, dtype, par.attn_tp)
    ratio = float_of(f, "swa-full-tokens-ratio") or pools.SWA_FULL_TOKENS_RATIO
    if not 0 < ratio <= 1:
        raise UsageError("--swa-full-tokens-ratio should be in range (0, 1.0] (arg_groups/kv_cache_hook.py)")
    if is_on(f, "disable-radix-cache") and "disable-radix-cache" in f and int_of(f, "max-running-requests"):
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
    prefill, decode = value_of(f, "dsa-prefill-backend"), value_of(f, "dsa-decode-backend")
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
    transport = value_of(f, "mm-feature-transport")
    if transport is None and env.get("SGLANG_USE_CUDA_IPC_TRANSPORT"):
        transport = (
            "cuda_ipc" if env["SGLANG_USE_CUDA_IPC_TRANSPORT"] not in ("0", "false", "False") else "cpu"
        )
    hopper = inp.sm_major == 9 and inp.gpu.memory_total_mib >= 60 * 1024
    if layout.multimodal and hopper and layout.model_type in ("qwen3_vl", "qwen3_vl_moe"):
        env.setdefault("SGLANG_VLM_CACHE_SIZE_MB", "0")
        preprocess = int_of(f, "mm-preprocess-cache-size-mb") or 0
        retention = preprocess > 0 or int(env["SGLANG_VLM_CACHE_SIZE_MB"]) > 0
        nodes = int_of(f, "nnodes") or 1
        if transport is None and nodes == 1 and not retention:
            transport = "cuda_ipc"
        running = int_of(f, "max-running-requests") or 0
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
    version = sglang_version(inp)
    if version is not None and version < kvpool.DFLASH_EXACT_FROM:
        # 0.5.11-0.5.17: the target cell scaled by layers (the exact draft term starts at 0.5.18).
        return -(-cell * (layers + draft.layers) // layers)
    # mem_cache/draft_kv_budget.py: the draft resolves --speculative-draft-kv-cache-dtype, else
    # --kv-cache-dtype, against its own dtype and no quant config (auto = the draft's dtype); an fa4
    # draft backend keeps its compute dtype (mem_cache/kv_cache_dtype.py).
    flag = (
        value_of(inp.flags, "speculative-draft-kv-cache-dtype")
        or value_of(inp.flags, "kv-cache-dtype")
        or "auto"
    )
    draft_dtype = "auto" if value_of(inp.flags, "speculative-draft-attention-backend") == "fa4" else str(flag)
    if draft_dtype != "auto" and draft_dtype not in pools.KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {draft_dtype!r}: SGLang 0.5.23 refuses it")
    elem = pools.elem_bytes(draft_dtype, draft)
    heads = pools.heads_per_rank(draft.kv_heads, par.attn_tp)
    return cell + int(heads * (draft.head_dim + draft.v_head_dim) * draft.layers * elem) * par.dcp


def _refusals(layout: KVLayout, inp: PlanInput, dtype: str) -> None:
    """KV dtypes SGLang 0.5.23 refuses at start on this hardware (ValueError, as SGLang raises)."""
    flags, sm = inp.flags, inp.sm_major
    if value_of(flags, "kv-cache-dtype") == "mxfp8" and (sm or 0) < 10:
        # arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility
        raise ValueError("--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU (SGLang refuses it)")
    if dtype == "nvfp4" and sm is not None and sm not in (10, 12) and not is_amd(inp.gpu.name):
        # arg_groups/kv_cache_hook.py:125-131 handle_kv4_compatibility (CUDA only; fp4_mx_block16 is not)
        raise ValueError(
            f"--kv-cache-dtype nvfp4 requires Blackwell SM100 or SM120, not compute capability {sm}.x "
            "(SGLang refuses it and points to --kv-cache-dtype fp4_mx_block16)"
        )
    backend = value_of(flags, "decode-attention-backend", "attention-backend")
    trtllm_mla = backend == "trtllm_mla" or (backend is None and sm == 10 and layout.family == "mla")
    if trtllm_mla and dtype not in ("fp8_e4m3", "bf16", "bfloat16", "auto"):
        # arg_groups/overrides.py _mla_kv_cache_dtype_checks
        raise ValueError(
            f"--kv-cache-dtype {dtype}: SGLang's TensorRT-LLM MLA backend takes fp8_e4m3, bf16 or auto"
        )


# arg_groups/overrides.py:1143-1199 _mla_backend_page_constraints: the page sizes each backend keeps; any
# other, a given --page-size included, becomes 64 (FlashMLA keeps 64 only).
_KEPT_PAGES: Mapping[str, tuple[int, ...]] = {
    "flashmla": (64,),
    "trtllm_mla": (32, 64),
    "cutedsl_mla": (32, 64),
    "trtllm_mha": (16, 32, 64, 128),
}


def _page(layout: KVLayout, flags: Mapping[str, FlagValue], sm: int | None) -> int:
    """The page size SGLang resolves: --page-size within what the backend keeps (_KEPT_PAGES), else the
    default (_default_page)."""
    given = int_of(flags, "page-size")
    if given is None:
        return _default_page(layout, flags, sm)
    kept = _KEPT_PAGES.get(_page_backend(layout, flags, sm) or "")
    return 64 if kept is not None and given not in kept else given


def _default_page(layout: KVLayout, flags: Mapping[str, FlagValue], sm: int | None) -> int:
    """The page size SGLang resolves when --page-size is unset.

    arg_groups/overrides.py _mla_backend_page_constraints and _page_size_default: DSA pages by 64; flashmla,
    trtllm_mla, cutedsl_mla and trtllm_mha need 32/64 (64 when unset); otherwise 1.
    """
    if layout.family == "dsa":
        return pools.DSA_PAGE
    return 64 if _page_backend(layout, flags, sm) in _KEPT_PAGES else 1


def _page_backend(layout: KVLayout, flags: Mapping[str, FlagValue], sm: int | None) -> str | None:
    """The decode attention backend the page size follows: the flags', else SGLang's default where it
    constrains pages (model_override_base.py get_default_attn_backend: SM100 defaults MHA to trtllm_mha,
    fa4 for unequal K/V widths, and DeepSeek/Kimi MLA to trtllm_mla)."""
    backend = value_of(flags, "decode-attention-backend", "attention-backend")
    if backend is None and sm == 10:
        if layout.kv_lora_rank:
            return "trtllm_mla"
        if layout.head_dim == layout.v_head_dim:
            return "trtllm_mha"
    return None if backend is None else str(backend)


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
    ratio = float_of(f, "mamba-full-memory-ratio") or pools.MAMBA_FULL_MEMORY_RATIO
    size = int_of(f, "max-mamba-cache-size")
    running = int_of(f, "max-running-requests")
    if size is not None:
        size //= par.attn_dp
    elif "disable-radix-cache" in f and is_on(f, "disable-radix-cache") and running:
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
    per = _state_slots_per_request(layout.arch, f)
    return pools.MambaShare(per_slot_bytes=per_req, ratio=ratio, cache_size=size, per_request=per)


# arg_groups/overrides.py:403-435 _MAMBA_EXTRA_BUFFER_ARCHS: the models whose state cache can keep an extra
# buffer (on the triton linear-attention backend, SGLang's default, l. 438-450).
_EXTRA_BUFFER_ARCHS = frozenset({
    "KimiLinearForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM", "Qwen4ExpForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
    "MiniCPMV4_7ForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
    "BailingMoeV3VLForConditionalGeneration", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
    "Glm5NextForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "NemotronH_Omni_Reasoning_V3", "KimiK3ForConditionalGeneration", "InklingForConditionalGeneration",
    "InklingForConditionalGenerationMTP",
})  # fmt: skip


def _state_slots_per_request(arch: str, flags: Mapping[str, FlagValue]) -> int:
    """mem_cache/kv_cache_configurator.py:3062-3088 _calculate_mamba_ratio: 1 with --disable-radix-cache,
    else 3 (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO) plus the extra buffer's tracking slots
    (allocation_sizing.py:11-19: 2 with the overlap schedule, 1 without). `auto` resolves to extra_buffer
    when the overlap schedule is on and the model supports it (arg_groups/overrides.py:477-485); the
    paged-cache case without overlap is not followed (it adds 1 slot)."""
    if is_on(flags, "disable-radix-cache"):
        return 1
    overlap = not is_on(flags, "disable-overlap-schedule")
    strategy = str(value_of(flags, "mamba-radix-cache-strategy") or "auto")
    backend = str(value_of(flags, "linear-attn-backend") or "triton")
    if strategy == "auto":
        extra = overlap and arch in _EXTRA_BUFFER_ARCHS and backend == "triton"
    else:
        extra = strategy == "extra_buffer"
    if not extra:
        return 3
    return 3 + (1 if is_on(flags, "enable-mamba-extra-buffer-lazy") or not overlap else 2)


def _run_dtype(inp: PlanInput, layout: KVLayout, notes: list[str]) -> KVLayout:
    """configs/model_config.py:2301-2318 _get_and_verify_dtype: --dtype auto runs a float32 checkpoint in
    float16 (Gemma in bfloat16), and the KV cache with it; --dtype float32 keeps 4 bytes. The inventory's
    dtype_bytes is the person's own figure, kept."""
    given = str(value_of(inp.flags, "dtype") or "auto").lower()
    if given != "auto":
        return replace(layout, dtype_bytes=4 if given in ("float", "float32") else 2)
    if layout.dtype_bytes != 4 or origin(inp) == "the inventory":
        return layout
    notes.append("a float32 checkpoint: SGLang runs it in half precision under --dtype auto (2-byte KV)")
    return replace(layout, dtype_bytes=2)


def _multimodal(inp: PlanInput, layout: KVLayout, notes: list[str]) -> KVLayout:
    """configs/model_config.py: --language-only (or language_model_only) serves the LM alone; Gemma 3,
    Llama 4 and Step3-VL serve text only unless --enable-multimodal."""
    f = inp.flags
    if not layout.multimodal:
        return layout
    lm_only = any(name in f and is_on(f, name) for name in ("language-only", "language-model-only"))
    enabled = "enable-multimodal" in f and is_on(f, "enable-multimodal")
    if lm_only or (layout.multimodal_off_by_default and not enabled):
        why = "--language-only" if lm_only else "SGLang disables it for this model unless --enable-multimodal"
        notes.append(f"{layout.arch} served as text only ({why}): no multimodal reservation")
        return replace(layout, multimodal=False)
    return layout


def attention_backend(inp: PlanInput, layout: KVLayout, par: Parallel) -> str | None:
    """The attention backend SGLang resolves where it changes the pool: the flag (or equal prefill and
    decode flags, arg_groups/overrides.py _attention_backend_default), else on AMD the ROCm default:
    dsa for DSA models (arg_groups/model_overrides/deepseek_v2.py), aiter for MHA, and for MLA aiter only
    with 16 or 128 KV heads per rank, else triton (model_override_base.py get_default_attn_backend)."""
    f = inp.flags
    prefill, decode = value_of(f, "prefill-attention-backend"), value_of(f, "decode-attention-backend")
    if prefill is not None and prefill == decode:
        return str(prefill)
    backend = value_of(f, "attention-backend")
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
    refused: tuple[str, ...] = ()  # flag combinations SGLang refuses at start (plan/startrefusals.py)


def sizing(inp: PlanInput) -> Sizing:
    """The layout and sizer of the host's model under its flags; a kind not followed is refused."""
    notes: list[str] = []
    try:
        layout = read_layout(with_override(inp.model.config, value_of(inp.flags, "json-model-override-args")))
        if layout.swa_disabled_by_sglang:
            notes.append(layout.swa_disabled_by_sglang)
        if (
            layout.family == "swa"
            and "disable-hybrid-swa-memory" in inp.flags
            and is_on(inp.flags, "disable-hybrid-swa-memory")
        ):
            layout = replace(layout, family="mha", kv_layers=tuple(range(layout.layers)), swa_layers=())
            notes.append("--disable-hybrid-swa-memory: every layer holds full-size KV (model_config.py)")
        layout = _multimodal(inp, layout, notes)
        layout = _run_dtype(inp, layout, notes)
        notes.extend(filter(None, [_backend(inp, layout)]))
        par = parallel(inp)
        if par.dcp > 1:
            raise Unsupported(
                "--dcp-size > 1: decode context parallel counts logical tokens over ranks, which deployctl "
                "does not follow yet"
            )
        dtype = pools.kv_dtype(str(value_of(inp.flags, "kv-cache-dtype") or "auto"), layout, inp.sm_major)
        _refusals(layout, inp, dtype)
        sizer = _cells(inp, layout, dtype, par, notes)
        refused = start_refusals(
            layout, inp.flags, sizer.page_size, attention_backend(inp, layout, par), par.attn_dp
        )
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
    return Sizing(layout, dtype, par, sizer, tuple(notes), refused)


def _backend(inp: PlanInput, layout: KVLayout) -> str | None:
    """SGLang's Transformers fallback for a model it has no class of (the inventory's figures name none)."""
    impl = str(value_of(inp.flags, "model-impl") or "auto")
    if origin(inp) == "the inventory":
        return None
    return transformers_fallback(inp.model.config, impl, inp.sglang_version, layout.family)


def _label(inp: PlanInput, layout: KVLayout) -> str:
    """The model's name in the notes: its architecture, or the inventory's figures it was written from."""
    return "the inventory's figures" if origin(inp) == "the inventory" else layout.arch
