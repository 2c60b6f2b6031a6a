"""SGLang 0.5.23's pool sizing for every family kvlayout reads: bytes per token, and tokens from a budget.

Stdlib only. Rules follow sglang/srt/ in the 0.5.23 wheel; each function names its file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.sglang.kvlayout import KVLayout, Unsupported

GIB = 2**30
DSA_QUANT_BLOCK = 128  # mem_cache/memory_pool.py DSATokenToKVPool.quant_block_size
DSA_PAGE = 64  # DSA backends page by 64 (FACTS 1.4; arg_groups/attention_hook.py)
SWA_FULL_TOKENS_RATIO = 0.8  # arg_groups/fields/schedule.py swa_full_tokens_ratio fallback
MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py mamba_full_memory_ratio fallback
VLM_CACHE_MB = 100  # environ.py SGLANG_VLM_CACHE_SIZE_MB default
MM_FEATURE_CACHE_MB = 1024  # environ.py SGLANG_MM_FEATURE_CACHE_MB default (cuda_ipc / cuda_vmm transport)

# --kv-cache-dtype -> (bytes per element, scale-block size or 0). mem_cache/kv_cache_dtype.py
# configure_kv_cache_dtype; anything else SGLang refuses ("Unsupported kv_cache_dtype").
KV_DTYPES: Mapping[str, tuple[float, int]] = {
    "bf16": (2, 0),
    "bfloat16": (2, 0),
    "fp8_e4m3": (1, 0),
    "fp8_e5m2": (1, 0),
    "mxfp8": (1, 32),
    "nvfp4": (0.5, 16),
    "fp4_mx_block16": (0.5, 16),
}


def kv_dtype(flag: str, layout: KVLayout, sm_major: int | None) -> str:
    """The dtype --kv-cache-dtype resolves to; ValueError for what SGLang 0.5.23 refuses (e.g. fp16).

    auto: fp8 when the checkpoint's quant config says kv_cache_quant_algo FP8 (mem_cache/kv_cache_dtype.py);
    DSA models: fp8_e4m3 on SM >= 10, else bfloat16 (arg_groups/overrides.py _dsa_kv_cache_dtype_default).
    """
    if flag == "auto":
        if layout.family == "dsa":
            return "fp8_e4m3" if (sm_major or 0) >= 10 else "bfloat16"
        if layout.kv_quant_fp8:
            return "fp8_e4m3"
        return "auto"
    if flag not in KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {flag!r}: SGLang 0.5.23 refuses it (Unsupported kv_cache_dtype)")
    return flag


def elem_bytes(dtype: str, layout: KVLayout) -> float:
    return layout.dtype_bytes if dtype == "auto" else KV_DTYPES[dtype][0]


def heads_per_rank(kv_heads: int, attn_tp: int, dcp: int = 1) -> int:
    """configs/model_config.py get_num_kv_heads: heads over tp // dcp groups, at least one per GPU."""
    return max(1, kv_heads // max(1, attn_tp // dcp))


@dataclass(frozen=True)
class Parallel:
    """How a server splits its model: tensor, pipeline, attention-DP and decode-context parallel sizes."""

    tp: int
    pp: int = 1
    attn_dp: int = 1
    dcp: int = 1

    @property
    def attn_tp(self) -> int:
        return max(1, self.tp // self.attn_dp)


@dataclass(frozen=True)
class DsaBackends:
    """What reads DSA's KV rows: --dsa-prefill-backend and --dsa-decode-backend; unset ones are SGLang's
    default for the GPU's SM major."""

    prefill: str | None = None
    decode: str | None = None
    sm_major: int | None = None
    hip: bool = False  # an AMD Instinct card (ROCm): other defaults, other rows


def _mla_dim(layout: KVLayout, dtype: str, backends: DsaBackends) -> int:
    """mem_cache/kv_cache_configurator.py calculate_mla_kv_cache_dim.

    DSA with fp8 stores the scaled row (latent + 4 B per 128 + rope in bf16: 656 for 512/64) unless a
    backend reads the raw row: trtllm on either side, or tilelang on both; on ROCm tilelang, triton or
    aiter on either side. Default DSA backends for fp8 (arg_groups/overrides.py
    _dsa_split_backend_resolution): triton on ROCm, trtllm on SM >= 10, flashmla_kv before.
    """
    raw = layout.kv_lora_rank + layout.qk_rope_head_dim
    if layout.family != "dsa" or dtype != "fp8_e4m3":
        return raw
    default = "trtllm" if (backends.sm_major or 9) >= 10 else "flashmla_kv"
    default = "triton" if backends.hip else default
    prefill, decode = backends.prefill or default, backends.decode or default
    if "trtllm" in (prefill, decode) or prefill == decode == "tilelang":
        return raw
    if backends.hip and {prefill, decode} & {"tilelang", "triton", "aiter"}:
        return raw
    return layout.kv_lora_rank + layout.kv_lora_rank // DSA_QUANT_BLOCK * 4 + layout.qk_rope_head_dim * 2


def dsa_indexer_bytes(layout: KVLayout, layers: int) -> int:
    """pool_configurator.py _compute_dsa_indexer_cell_size: fp8 index K plus a 4-byte scale per 128, uint8."""
    per = math.ceil(
        (layout.dsa_index_head_dim + layout.dsa_index_head_dim // DSA_QUANT_BLOCK * 4)
        / layout.dsa_index_kpool
    )
    return per * layers


def full_cell(
    layout: KVLayout, dtype: str, layers: int, par: Parallel, backends: DsaBackends = DsaBackends()
) -> int:
    """pool_configurator.py DefaultPoolConfigurator._compute_cell_size for `layers` full-attention layers."""
    attn_tp, dcp = par.attn_tp, par.dcp
    elem = elem_bytes(dtype, layout)
    block = 0 if dtype == "auto" else KV_DTYPES[dtype][1]
    if layout.kv_lora_rank:
        dim = _mla_dim(layout, dtype, backends)
        # fp4: half the bytes plus one scale byte per 16 (the is_float4_e2m1fn_x2 branch).
        cell = dim * layers // 2 + dim // 16 * layers if block == 16 else int(dim * layers * elem)
        if layout.family == "dsa":
            # Shared-top-k layers get no index-K rows (_should_elide_dsa_index_k, the target by default).
            cell += dsa_indexer_bytes(layout, max(0, layers - layout.dsa_shared_layers)) * dcp
        return cell
    n = heads_per_rank(layout.kv_heads, attn_tp, dcp)
    width = n * (layout.head_dim + layout.v_head_dim) * layers
    if block == 16:
        raise Unsupported(
            "FP4 KV for MHA models is sized by the KV recipe's quant method, which deployctl does not follow"
        )
    cell = int(width * elem)
    if block == 32:  # mxfp8: one scale byte per 32 elements
        cell += width // 32
    return cell


def stage_layouts(layout: KVLayout, pp: int) -> list[KVLayout]:
    """The layout of each pipeline stage: its own full and sliding layers (get_pp_indices; each stage sizes
    its pool from the layers it holds, layer_setup.py resolve_layer_indices)."""
    if pp <= 1:
        return [layout]
    return [
        replace(
            layout,
            kv_layers=tuple(i for i in layout.kv_layers if i in stage),
            swa_layers=tuple(i for i in layout.swa_layers if i in stage),
        )
        for stage in pp_stage_layers(layout.layers, pp)
    ]


def swa_cells(layout: KVLayout, dtype: str, attn_tp: int) -> tuple[int, int]:
    """pool_configurator.py HybridSWAPoolConfigurator: (full bytes, sliding bytes) per token, all layers."""
    elem = elem_bytes(dtype, layout)
    full_w = heads_per_rank(layout.kv_heads, attn_tp) * (layout.head_dim + layout.v_head_dim)
    swa_w = max(1, layout.swa_kv_heads // attn_tp) * (layout.swa_head_dim + layout.swa_v_head_dim)
    full, swa = int(full_w * elem), int(swa_w * elem)
    if dtype != "auto" and KV_DTYPES[dtype][1] == 32:
        full, swa = full + full_w // 32, swa + swa_w // 32
    return full * len(layout.kv_layers), swa * len(layout.swa_layers)


@dataclass(frozen=True)
class MambaShare:
    """The linear-attention state cache's claim on the budget.

    mem_cache/kv_cache_configurator.py _handle_max_mamba_cache.
    """

    per_slot_bytes: int
    ratio: float = MAMBA_FULL_MEMORY_RATIO
    cache_size: int | None = None  # --max-mamba-cache-size (per attention-DP shard already)
    # State slots a request holds (_calculate_mamba_ratio: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3,
    # l. 227; 1 with --disable-radix-cache, l. 3063)
    per_request: int = 3

    def slots(self, rest_gib: float) -> int:
        if self.cache_size is not None:
            return self.cache_size
        budget = rest_gib * self.ratio / (1 + self.ratio) * GIB
        return int((budget - self.per_slot_bytes) // self.per_slot_bytes)

    def request_cap(self, rest_gib: float) -> int:
        """resolve_max_num_reqs (kv_cache_configurator.py:3134-3151): the state cache caps the requests at
        max_mamba_cache_size // slots per request, per attention-DP worker."""
        return self.slots(rest_gib) // self.per_request

    def taken_gib(self, rest_gib: float) -> float:
        """+1 for each pool's padding slot."""
        return (self.slots(rest_gib) + 1) * self.per_slot_bytes / GIB


@dataclass(frozen=True)
class PoolSizer:
    """Tokens SGLang allocates from the KV budget rest = post - pre*(1-f) (GiB), for one family."""

    cell_bytes: float  # bytes per max_total_num_tokens token (SWA: full + ratio * sliding)
    page_size: int = 1
    reserve_gib: float = 0.0  # multimodal reservation (mm_runtime_reservation_gb)
    mamba: MambaShare | None = None
    max_total_tokens: int | None = None
    swa_ratio: float | None = None  # hybrid SWA: sliding tokens = full tokens * ratio

    def budget_gib(self, rest_gib: float) -> float:
        """kv_cache_configurator._profile_available_bytes: minus the reservation, minus the state cache."""
        rest = rest_gib - self.reserve_gib
        if self.mamba is not None and rest > 0:
            if self.mamba.slots(rest) <= 0:
                return 0.0  # "Not enough GPU memory for hybrid (mamba/linear-attention) state cache"
            rest -= self.mamba.taken_gib(rest)
        return rest

    def tokens(self, rest_gib: float) -> int:
        """calculate_pool_sizes (available // cell, floored to the page), then the user cap, re-floored."""
        budget = self.budget_gib(rest_gib)
        if budget <= 0:
            return 0
        tokens = int(int(budget * GIB) // self.cell_bytes) // self.page_size * self.page_size
        if self.max_total_tokens is not None and self.max_total_tokens < tokens:
            tokens = self.max_total_tokens // self.page_size * self.page_size
        return max(tokens, 0)

    def effective_cell(self) -> float:
        """Bytes of budget one more pool token costs, the state cache's share included."""
        return self.cell_bytes * (1 + self.mamba.ratio if self.mamba and self.mamba.cache_size is None else 1)

    def swa_tokens(self, full_tokens: int) -> int | None:
        if self.swa_ratio is None:
            return None
        return int(full_tokens * self.swa_ratio) // self.page_size * self.page_size


def pp_stage_layers(layers: int, pp: int) -> list[range]:
    """distributed/utils.py get_pp_indices: an even split, the last `remainder` stages one layer more."""
    base, rem = divmod(layers, pp)
    out, start = [], 0
    for rank in range(pp):
        n = base + (1 if rank >= pp - rem else 0)
        out.append(range(start, start + n))
        start += n
    return out


def mm_reservation_gib(layout: KVLayout, env: Mapping[str, str], transport: str | None) -> float:
    """kv_cache_configurator.mm_runtime_reservation_gb: VLM cache (+ feature cache with cuda_ipc/vmm)."""
    if not layout.multimodal:
        return 0.0
    mb = float(env.get("SGLANG_VLM_CACHE_SIZE_MB", VLM_CACHE_MB))
    if transport in ("cuda_ipc", "cuda_vmm"):
        mb += float(env.get("SGLANG_MM_FEATURE_CACHE_MB", MM_FEATURE_CACHE_MB))
    return mb / 1024
