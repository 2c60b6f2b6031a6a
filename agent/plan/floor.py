"""The memory floor: what must stay free per GPU once the pool is sized, from what takes it.

Three parts, each said with its source in the plan's notes:
- CUDA graphs for the decode batch sizes SGLang captures. A start's own figures already hold them (its free
  memory is logged after capture: `available_gpu_mem`), so a plan calibrated on one counts them in the
  measured need and not here. Cold, they are estimated from public capture lines (GRAPH_FIT).
- Activations of one chunked-prefill step, estimated from the model's shapes (activation_gib). SGLang logs
  its free memory after its graphs, the prefill graphs 0.5.23 captures by default on CUDA included, but
  before any prefill runs: the eager work between a breakable graph's pieces, and a prefill the graphs do
  not cover, take from what is left. So every plan keeps one chunk's activations free; on a calibrated plan
  whose start captured prefill graphs this counts part of them twice, which errs safe.
- Allocator slack (SLACK_GIB).

The batch sizes and the chunk are the unit's flags, else SGLang 0.5.23's defaults for the card class
(arg_groups/memory_hook.py, mirrored in agent/sglang/memory_defaults.py). A floor the person states
(`[planning] reserve_floor_gib`, a facts file's `planning`) replaces the derived one. Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.sglang.config_json import ModelConfig
from agent.sglang.kvpool import GIB

# The caching allocator rounds blocks up and keeps freed ones for reuse; tensors of the step before the
# largest one are still alive: twice the largest live set (deployctl's own allowance, not measured).
ALLOCATOR_FACTOR = 2.0
# CUDA context growth after the start, NCCL's lazily built communicators, fragmentation over hours:
# deployctl's own allowance, not measured.
SLACK_GIB = 0.5
# Without the model's shapes, the floor rounds to what deployctl used before it derived one.
FIXED_GIB = 4.0


@dataclass(frozen=True)
class GraphFit:
    """CUDA-graph memory: a fixed part, and a part per captured batch size and layer by kind of MLP. The
    upper envelope of the public capture lines in tests/data/graph-captures.json (DeepSeek V3 at TP 8 and
    bs 256 binds the MoE term, QwQ-32B at TP 4 and bs 80 the dense one, Qwen3.5-9B at bs 24 the fixed
    part), so a cold plan reserves at least what each of them took. Their "GB" is GiB: SGLang divides
    free bytes by 1 << 30 (utils/common.py get_available_gpu_memory). tests/pure/test_floor.py checks the
    fit against each, that each term is bound by one, and that the misses named there stay misses."""

    fixed_gib: float
    dense_kib: float  # KiB per batch size per layer, dense MLP
    moe_kib: float  # KiB per batch size per layer, mixture of experts


GRAPH_FIT = GraphFit(fixed_gib=0.142, dense_kib=162.0, moe_kib=412.0)


@dataclass(frozen=True)
class Part:
    what: str
    gib: float
    source: str


@dataclass(frozen=True)
class Floor:
    """The floor per GPU and how it was reached; `stated` when the person gave it."""

    gib: float
    parts: tuple[Part, ...] = ()
    stated: bool = False

    def said(self) -> str:
        if self.stated:
            return f"the memory floor is {self.gib:.1f} GiB per GPU, as stated ([planning] reserve_floor_gib)"
        if not self.parts:
            return (
                f"the memory floor is {self.gib:.1f} GiB per GPU, fixed: without the model's shapes (its "
                "hidden, attention and MLP sizes) what takes it cannot be derived; state it in [planning] "
                "reserve_floor_gib"
            )
        parts = "; ".join(f"{p.what} {p.gib:.2f} GiB ({p.source})" for p in self.parts)
        return f"the memory floor is {self.gib:.1f} GiB per GPU, derived: {parts}"


@dataclass(frozen=True)
class Shapes:
    """What one prefill step and one captured decode step hold per token, from config.json."""

    hidden: int
    layers: int
    attention: int  # q, k, v and the attention output, elements per token per GPU
    mlp: int  # the MLP's widest live set, elements per token per GPU
    moe: bool
    elem_bytes: int


@dataclass(frozen=True)
class Sizes:
    """What SGLang captures and prefills: the flags, else its defaults for the card class."""

    graph_bs: int  # the largest decode batch size captured (0: CUDA graphs off)
    chunk: int  # the chunked-prefill size
    graphs_measured: bool  # the calibrating start's free memory was logged after capture
    attn_dp: int = 1  # attention-DP ranks (1: off, or a prefill role, which SGLang reserves none for)
    decode_bs: int = 0  # the decode graphs' max batch size SGLang's DP padding scales with (graphs off too)


def _per_gpu(n: int | None, tp: int) -> int:
    return 0 if not n else math.ceil(n / tp)


def _attention(cfg: ModelConfig, tp: int, hidden: int) -> int | None:
    heads = cfg.integer("num_attention_heads")
    if not heads:
        return None
    local = _per_gpu(heads, tp)
    if cfg.integer("kv_lora_rank"):  # MLA prefill expands K and V per head (models/deepseek_v2.py)
        qk = (cfg.integer("qk_nope_head_dim") or 0) + (cfg.integer("qk_rope_head_dim") or 0)
        v = cfg.integer("v_head_dim") or qk
        return local * (2 * qk + 2 * v)
    head_dim = cfg.integer("head_dim") or hidden // heads
    kv = max(1, _per_gpu(cfg.integer("num_key_value_heads") or heads, tp))
    return (2 * local + 2 * kv) * head_dim


def _mlp(cfg: ModelConfig, tp: int) -> tuple[int, bool] | None:
    """Gate and up projections and the activation's output: 3 x the intermediate size per GPU; None when
    config.json states no MLP width."""
    dense = 3 * _per_gpu(cfg.integer("intermediate_size"), tp)
    experts = cfg.first("n_routed_experts", "num_local_experts", "num_experts")
    # Gemma 4 says top_k_experts, gpt-oss experts_per_token
    topk = (
        cfg.integer("num_experts_per_tok") or cfg.integer("top_k_experts") or cfg.integer("experts_per_token")
    )
    if not (isinstance(experts, int) and experts > 1 and topk):
        return (dense, False) if dense else None
    width = cfg.integer("moe_intermediate_size") or cfg.integer("intermediate_size") or 0
    shared = (cfg.integer("n_shared_experts") or 0) * width + (
        cfg.integer("shared_expert_intermediate_size") or 0
    )
    routed = 3 * _per_gpu(topk * width + shared, tp) + 2 * experts  # and the router's fp32 logits
    return max(dense, routed), True


def shapes(cfg: ModelConfig, tp: int, elem_bytes: int, pp: int = 1) -> Shapes | None:
    """The text model's shapes on one GPU (its pipeline stage's layers), or None when config.json lacks them
    (an inventory's stand-in)."""
    hidden, layers = cfg.integer("hidden_size"), _per_gpu(cfg.integer("num_hidden_layers"), pp)
    if not hidden or not layers:
        return None
    attention = _attention(cfg, tp, hidden)
    if attention is None:
        return None
    mlp = _mlp(cfg, tp)
    if mlp is None:
        return None
    return Shapes(hidden, layers, attention, mlp[0], mlp[1], elem_bytes)


def activation_gib(s: Shapes, chunk: int) -> float:
    """One prefill step of `chunk` tokens: the residual, the normed input, the attention and MLP outputs
    (4 x hidden) and the widest of the attention and MLP sets, times the allocator's factor."""
    per_token = (4 * s.hidden + max(s.attention, s.mlp)) * s.elem_bytes
    return chunk * per_token * ALLOCATOR_FACTOR / GIB


def graph_gib(s: Shapes, bs: int, fit: GraphFit = GRAPH_FIT) -> float:
    return fit.fixed_gib + bs * s.layers * (fit.moe_kib if s.moe else fit.dense_kib) * 1024 / GIB


def dp_padding_gib(sizes: Sizes) -> float:
    """SGLang 0.5.23's reserve for attention DP (arg_groups/memory_hook.py:371-378 reserve_for_graph_mb: "DP
    attention needs more padding for some operations, and much more for large cuda graph max bs"): max bs x
    DP x 3 MB, 1.5 more above bs 300; 18 GiB at bs 512 and DP 8. Its default fraction keeps it free."""
    if sizes.attn_dp <= 1:
        return 0.0
    per = 3 + (1.5 if sizes.decode_bs > 300 else 0)
    return sizes.decode_bs * sizes.attn_dp * per / 1024


def derive(s: Shapes | None, sizes: Sizes) -> Floor:
    """The floor from its parts, rounded up to 0.1 GiB (the figure the plan shows is the one it compares)."""
    if s is None:
        return Floor(FIXED_GIB)
    parts = [Part("activations", activation_gib(s, sizes.chunk), f"one prefill chunk of {sizes.chunk:,} "
                  "tokens, from the model's shapes")]  # fmt: skip
    if sizes.graph_bs and not sizes.graphs_measured:
        parts.insert(0, Part("CUDA graphs", graph_gib(s, sizes.graph_bs), f"batch sizes up to "
                             f"{sizes.graph_bs}, fitted to public capture lines"))  # fmt: skip
    if dp_padding_gib(sizes) and not sizes.graphs_measured:
        parts.append(Part("attention-DP padding", dp_padding_gib(sizes), f"batch sizes up to "
                          f"{sizes.decode_bs} x DP {sizes.attn_dp}, SGLang's own reserve"))  # fmt: skip
    parts.append(Part("allocator slack", SLACK_GIB, "deployctl's allowance"))
    total = math.ceil(round(sum(p.gib for p in parts), 6) * 10) / 10
    return Floor(total, tuple(parts))
