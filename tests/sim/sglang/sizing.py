"""KV-pool arithmetic of the simulated SGLang server for log formats before 0.5.23 (and as the fallback
where the oracle venv is absent); 0.5.23 starts are sized by SGLang's own code (oracle.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

GIB = 1 << 30

# Simulated hosts. ct200's figures reproduce the seed deployment's three logged pools exactly
# (free before weights logs as 92.80 GiB, free after target + draft weights as 21.12 GiB).
PROFILES: dict[str, dict[str, object]] = {
    "ct200": {
        "gpus": 8,
        "gpu_mem_gib": 95.6,
        "pre_gib": 92.7951,
        "rank_spread_gib": 0.3,
        "weights_gib": 70.1783,
        "draft_weights_gib": 1.5,
        "graph_gib": 1.16,
        "graph_per_bs_gib": 0.03,
        "max_context": 262144,
        "attention_backend": "triton",  # SM120: MLA runs on triton, page size 1
        "capability": (12, 0),
        "device_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    },
    "h100": {
        "gpus": 8,
        "gpu_mem_gib": 79.1,
        "pre_gib": 76.9,
        "rank_spread_gib": 0.2,
        "weights_gib": 17.5,
        "draft_weights_gib": 0.9,
        "graph_gib": 0.8,
        "graph_per_bs_gib": 0.004,
        "max_context": 131072,
        "attention_backend": "fa3",
        "capability": (9, 0),
        "device_name": "NVIDIA H100 80GB HBM3",
    },
}

# SGLang environment each simulated host runs with unless its unit says otherwise. The seed's three ct200
# pools match SGLang 0.5.23's code only without the 0.1 GB multimodal reservation it takes for Kimi K2.6
# (mem_cache/kv_cache_configurator.py mm_runtime_reservation_gb), so the seed host has it at 0.
PROFILE_ENV: dict[str, dict[str, str]] = {"ct200": {"SGLANG_VLM_CACHE_SIZE_MB": "0"}}


@dataclass(frozen=True)
class Hardware:
    """The simulated host, from a profile overridden by SGLANG_SIM_* variables."""

    gpus: int = 8
    gpu_mem_gib: float = 95.6
    pre_gib: float = 92.7951
    rank_spread_gib: float = 0.3
    weights_gib: float = 70.1783
    draft_weights_gib: float = 1.5
    graph_gib: float = 1.16
    graph_per_bs_gib: float = 0.03
    max_context: int = 262144
    attention_backend: str = "triton"
    load_seconds: float = 2.0
    step_seconds: float = 0.2
    warmup_seconds: float = 0.5
    prefill_tokens_per_s: float = 100000.0
    log_format: str = "0.5.23"
    fault: str = ""
    slow_factor: float = 10.0
    die_after_s: float = 5.0
    profile: str = "ct200"


def hardware_from_env(env: Mapping[str, str]) -> Hardware:
    """Build the host from the profile named in SGLANG_SIM_PROFILE plus per-knob overrides."""
    profile = env.get("SGLANG_SIM_PROFILE", "ct200")
    if profile not in PROFILES:
        raise SystemExit(f"SGLANG_SIM_PROFILE={profile!r}: known profiles are {sorted(PROFILES)}")
    values: dict[str, object] = {"profile": profile}
    values |= {k: v for k, v in PROFILES[profile].items() if k not in ("capability", "device_name")}
    for f in fields(Hardware):
        raw = env.get("SGLANG_SIM_" + f.name.upper())
        if raw is not None and f.name != "profile":
            kind = {"int": int, "float": float}.get(str(f.type), str)
            values[f.name] = kind(raw)
    return Hardware(**values)  # type: ignore[arg-type]


def version_tuple(text: str) -> tuple[int, int, int]:
    """'0.4.6.post5' -> (0, 4, 6)."""
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in text.split(".")[:3]]
    major, minor, patch = [*parts, 0, 0, 0][:3]
    return major, minor, patch


@dataclass(frozen=True)
class Arch:
    """The attention shape of one model (target or draft)."""

    architecture: str
    layers: int
    kv_lora_rank: int = 0  # > 0 means MLA
    qk_rope_head_dim: int = 0
    kv_heads: int = 1
    head_dim: int = 128
    max_context: int = 262144
    dtype: str = "bfloat16"
    model_type: str = ""
    quant: str = ""

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0


KIMI_K26 = Arch("KimiK25ForConditionalGeneration", 61, 512, 64, 64, 128, 262144, "bfloat16", "kimi_k25")
DFLASH_DRAFT = Arch("DFlash2DraftModel", 3, kv_heads=32, head_dim=128, model_type="dflash")
VLM_ARCHS = {"KimiK25ForConditionalGeneration"}
VLM_FACTOR = 0.909736328125  # MoonViT, 27 layers of hidden 1152


def arch_from_config(cfg: Mapping[str, object], default: Arch) -> Arch:
    """Read the HF config.json keys that size the pool; missing keys keep the default's values."""
    text = cfg.get("text_config")
    merged: dict[str, object] = {**cfg, **(text if isinstance(text, dict) else {})}

    def num(key: str, fallback: int) -> int:
        value = merged.get(key)
        return int(value) if isinstance(value, (int, float)) else fallback

    heads = num("num_attention_heads", default.kv_heads)
    hidden = num("hidden_size", 0)
    head_dim = num("head_dim", hidden // heads if hidden and heads else default.head_dim)
    archs = cfg.get("architectures")
    quant = cfg.get("quantization_config")
    return Arch(
        architecture=str(archs[0]) if isinstance(archs, list) and archs else default.architecture,
        layers=num("num_hidden_layers", default.layers),
        kv_lora_rank=num("kv_lora_rank", default.kv_lora_rank if "num_hidden_layers" not in merged else 0),
        qk_rope_head_dim=num("qk_rope_head_dim", default.qk_rope_head_dim),
        kv_heads=num("num_key_value_heads", heads),
        head_dim=head_dim,
        max_context=num("max_position_embeddings", default.max_context),
        dtype=str(merged.get("torch_dtype") or default.dtype),
        model_type=str(cfg.get("model_type") or default.model_type),
        quant=str(quant.get("quant_method", "")) if isinstance(quant, dict) else default.quant,
    )


def kv_elem(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per KV element: fp8 is 1, auto follows the model dtype."""
    if kv_cache_dtype.startswith("fp8"):
        return 1
    return 4 if kv_cache_dtype == "auto" and model_dtype == "float32" else 2


def cell_bytes(arch: Arch, attn_tp: int, elem: int) -> int:
    """Bytes per token per GPU of one model's pool (MLA is replicated, GQA heads shard over TP)."""
    if arch.mla:
        return (arch.kv_lora_rank + arch.qk_rope_head_dim) * arch.layers * elem
    heads_per_rank = max(1, arch.kv_heads // attn_tp)
    return heads_per_rank * (arch.head_dim + arch.head_dim) * arch.layers * elem


@dataclass(frozen=True)
class Speculation:
    """A speculative algorithm and its draft model."""

    algo: str
    draft: Arch


def sizing_cell(
    version: tuple[int, int, int], target: Arch, spec: Speculation | None, tp: int, elem: int
) -> int:
    """The per-token bytes the pool is sized with: the target's plus what each version budgets for a draft."""
    cell = cell_bytes(target, tp, elem)
    if spec is None or spec.algo == "NGRAM":
        return cell
    algo, draft = spec.algo, spec.draft
    if algo == "DFLASH":
        if version >= (0, 5, 20):
            return cell + cell_bytes(draft, tp, elem)
        return math.ceil(cell * (target.layers + draft.layers) / target.layers)
    if version >= (0, 5, 14):
        return cell + int(cell * draft.layers / target.layers)
    return cell


class NoKvMemory(Exception):
    """The weights leave nothing for the pool under this fraction."""

    def __init__(self, fraction: float, min_fraction: float) -> None:
        super().__init__(f"no KV memory at {fraction}; minimum viable {min_fraction:.4f}")
        self.fraction = fraction
        self.min_fraction = min_fraction


@dataclass(frozen=True)
class Pool:
    """Result of sizing: the token count and what went into it."""

    tokens: int
    profiled: int
    rest_gib: float
    cap_ignored: bool


@dataclass(frozen=True)
class Paging:
    """--page-size and --max-total-tokens (the cap)."""

    page: int = 1
    cap: int | None = None


def pool_tokens(pre: float, post: float, fraction: float, cell: int, paging: Paging = Paging()) -> Pool:
    """SGLang's rule: rest = post - pre*(1-f); tokens = floor(rest / cell), floored to page, capped."""
    page, cap = paging.page, paging.cap
    rest = post - pre * (1 - fraction)
    profiled = math.floor(rest * GIB / cell) // page * page if rest > 0 else 0
    if profiled <= 0:
        raise NoKvMemory(fraction, 1 - post / pre)
    tokens = profiled if cap is None or cap >= profiled else cap // page * page
    return Pool(tokens, profiled, rest, cap is not None and cap > profiled)


@dataclass(frozen=True)
class FractionArgs:
    """The server arguments the default --mem-fraction-static reads."""

    tp: int
    spec: str | None  # the speculative algorithm
    chunked: int  # --chunked-prefill-size
    max_bs: int  # the largest CUDA-graph batch


def default_fraction(version: tuple[int, int, int], hw: Hardware, target: Arch, args: FractionArgs) -> float:
    """mem_fraction_static when the flag is absent, per the version's heuristic."""
    tp, spec, chunked, max_bs = args.tp, args.spec, args.chunked, args.max_bs
    gpu_mem = hw.gpu_mem_gib * 1024
    if version < (0, 4, 7):
        f = 0.88 if gpu_mem > 81920 else (0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88)
        return (
            min(f + 48 * 1024 * (1 - f) / gpu_mem, (gpu_mem - 18 * 1024) / gpu_mem)
            if gpu_mem > 96 * 1024
            else f
        )
    vlm = target.architecture in VLM_ARCHS and version >= (0, 5, 10)
    reserved = 512 + max(chunked, 2048) * 1.5 + tp / 8 * 1024 + max_bs * 2
    if version >= (0, 5, 14) or (version >= (0, 5, 10) and not spec and not vlm):
        reserved += 1536 if target.mla else 480
    reserved = max(reserved, 10240) if gpu_mem > 60 * 1024 else reserved
    if spec and version < (0, 5, 14):
        reserved += {"NGRAM": 0, "STANDALONE": 6144}.get(spec, 2048 if version <= (0, 5, 8) else 4096)
    f = round((gpu_mem - reserved) / gpu_mem, 3)
    return f * VLM_FACTOR if vlm else f


def graph_gib(hw: Hardware, bs: int, disabled: bool) -> float:
    """CUDA-graph memory: a base plus a term per captured batch size."""
    # captures above 64 share most of their buffers, so memory grows slower there
    return 0.0 if disabled else hw.graph_gib + hw.graph_per_bs_gib * (min(bs, 64) + max(0, bs - 64) / 8)


def capture_sizes(max_bs: int) -> list[int]:
    """The decode batch sizes SGLang captures, up to max_bs."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 513, 16)]
    return [b for b in sizes if b <= max_bs] or [1]


def resolve_max_running(user: int | None, spec: str | None, pool: int, context: int) -> int:
    """Scheduler's max_running_requests: the user value or a default, never above half the pool."""
    if user is not None:
        return max(1, min(user, pool // 2))
    if spec:
        return max(1, min(48, pool // 2))
    estimate = min(max(int(pool / context * 512), 2048), 4096)
    return max(1, min(estimate, pool // 2))


def rank_spreads(hw: Hardware, ranks: int) -> list[float]:
    """Extra free memory per rank over the minimum, so that the minimum rank is not TP0."""
    frac = [((r * 5 + 1) % 11) / 10 for r in range(ranks)]
    low = min(frac)
    return [hw.rank_spread_gib * (x - low) for x in frac]
