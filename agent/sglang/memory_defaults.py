"""SGLang 0.5.23's own --mem-fraction-static when the flag is absent, and the AMD aiter rule.

arg_groups/memory_hook.py handle_gpu_memory_settings and adjust_mem_fraction_for_vlm;
arg_groups/attention_hook.py for aiter. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.sglang.kvlayout import KVLayout
from agent.sglang.pools import Parallel

# Multimodal archs that keep the prefill graph (configs/model_config.py breakable allowlist).
_MM_PREFILL_GRAPH = frozenset(
    {
        "KimiK25ForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    }
)


@dataclass(frozen=True)
class MemorySettings:
    chunked_prefill: int
    decode_max_bs: int
    fraction: float


MAX_PREFILL_TOKENS = 16384  # arg_groups/fields/schedule.py max_prefill_tokens


@dataclass(frozen=True)
class MemoryFlags:
    """The server flags handle_gpu_memory_settings reads besides the parallel sizes (None: unset)."""

    chunked_prefill: int | None = None
    decode_max_bs: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    cuda_graph: bool = True
    max_prefill_tokens: int | None = None  # the activations' size when chunking is off (default 16,384)
    disaggregation: str | None = None  # --disaggregation-mode: prefill or decode (PD roles), None for null
    draft_tokens: int | None = None  # --speculative-num-draft-tokens (a decode role's activations)
    # --language-only on a multimodal checkpoint: SGLang's ModelConfig stays multimodal (only
    # --language-model-only clears is_multimodal, configs/model_config.py:820-828), so the prefill graph stays
    # off (cuda_graph_hook.py:229-237), though no vision tower runs and the VLM factor is skipped
    text_served_vlm: bool = False
    # The prefill graph's backend as the flags set it (--cuda-graph-backend-prefill; disabled by
    # --disable-prefill-cuda-graph), None: SGLang's default (breakable)
    prefill_backend: str | None = None
    # A Qwen3-VL on a Hopper card of 60 GiB or more captures decode graphs up to the request cap
    # (arg_groups/model_overrides/qwen3_vl.py:34-62; see decode_graph_bs)
    graphs_to_running: bool = False
    deepep: bool = False  # --moe-a2a-backend deepep
    post_capture: bool = False  # SGLANG_ENABLE_POST_CAPTURE_KV_SIZING set, no flag that rules it out


def class_defaults(gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode max bs) by card class (memory_hook.py, GPU-dependent defaults)."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def decode_graph_bs(class_bs: int, flags: MemoryFlags) -> int:
    """The decode graphs' max batch size (memory_hook.py:96-197): the flag's (a --cuda-graph-bs-decode list's
    largest), else the card class's capped at --max-running-requests, or raised to it (at most 512) where
    expand_multimodal_decode_graph_to_running_limit applies (qwen3_vl.py:34-62)."""
    running = flags.max_running_requests
    if flags.decode_max_bs is not None or running is None:
        return flags.decode_max_bs or class_bs
    if class_bs > running or (flags.graphs_to_running and running <= 512):
        return running
    return class_bs


def prefill_graph_sizes(max_bs: int) -> int:
    """len(generate_prefill_cuda_graph_batch_sizes(max_bs)) (arg_groups/cuda_graph_hook.py)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return sum(1 for s in sizes if s <= max_bs)


def default_fraction(
    layout: KVLayout, gpu_mib: float, par: Parallel, flags: MemoryFlags = MemoryFlags()
) -> MemorySettings:
    """handle_gpu_memory_settings: reserved MiB = 512 + activations x 1.5 + tp*pp/8 GiB + graphs, floored
    at 10 GiB on cards over 60 GiB; f = round((gpu - reserved) / gpu, 3); times the VLM factor."""
    tp, pp, attn_dp = par.tp, par.pp, par.attn_dp
    chunked_prefill = flags.chunked_prefill
    max_running_requests, max_total_tokens = flags.max_running_requests, flags.max_total_tokens
    chunk_default, bs_default = class_defaults(gpu_mib, tp)
    chunk = chunk_default if chunked_prefill is None else chunked_prefill  # 0 is chunking off, as -1
    bs = decode_graph_bs(bs_default, flags)
    mla = layout.kv_lora_rank > 0
    mode = flags.disaggregation
    # Chunking off (<= 0): the activations scale with --max-prefill-tokens instead (memory_hook.py); a PD
    # decode role's with its running requests times the draft tokens.
    activation = chunk if chunk > 0 else (flags.max_prefill_tokens or MAX_PREFILL_TOKENS)
    if mode == "decode":
        activation = (max_running_requests or bs or 1) * (flags.draft_tokens or 1)
    reserved = 512 + max(activation, 2048) * 1.5 + tp * pp / 8 * 1024
    if flags.cuda_graph:
        if mode != "prefill":  # a prefill role captures no decode graphs (reserve_for_graph_mb)
            reserved += bs * 2
            if attn_dp > 1:
                reserved += bs * attn_dp * 3 + (bs * attn_dp * 1.5 if bs > 300 else 0)
        multimodal = layout.multimodal or flags.text_served_vlm
        prefill_graph = (not multimodal or layout.arch in _MM_PREFILL_GRAPH) and mode != "decode"
        prefill_graph = prefill_graph and _prefill_backend(flags.prefill_backend, pp) != "disabled"
        if prefill_graph:
            if mla:
                reserved += 1.5 * 1024
            else:
                prefill_max = min(chunk, max_total_tokens) if max_total_tokens else chunk
                reserved += _prefill_sizes(prefill_max, flags.deepep) * 8
            reserved += DEEPEP_PREFILL_MIB * flags.deepep
    post_capture = _post_capture(layout, flags, chunk, max_total_tokens)
    fraction = round((gpu_mib - _final_reserve(reserved, gpu_mib, par, flags, post_capture)) / gpu_mib, 3)
    if layout.multimodal and mode != "decode":  # memory_hook.py:283-288 is_vlm: not on a PD decode role
        fraction = _vlm_fraction(fraction, layout, gpu_mib, post_capture)
    return MemorySettings(chunk, bs, fraction)


# arg_groups/memory_hook.py:402-414 reserve_for_deepep_a2a_mb: DeepEP's all-to-all buffers, captured in the
# decode graph, "real extra allocations" reserved on top of the 10 GiB floor; and :395-401, the breakable
# prefill graph's DeepEP delta (bridge pool and NVLink first touch during capture).
DEEPEP_A2A_MIB = 2 * 1024
DEEPEP_PREFILL_MIB = 1024
# arg_groups/cuda_graph_hook.py:315-345 apply_deepep_adjustments: an unset prefill graph list is generated up
# to 2,048 tokens and aligned to multiples of 8, before the chunk would bound it.
DEEPEP_PREFILL_MAX_BS = 2048


def deepep_a2a_mib(flags: MemoryFlags) -> float:
    """DeepEP's all-to-all buffers, when decode graphs run (not on a prefill role)."""
    return DEEPEP_A2A_MIB if flags.deepep and flags.cuda_graph and flags.disaggregation != "prefill" else 0.0


def _prefill_sizes(max_bs: int, deepep: bool) -> int:
    if not deepep:
        return prefill_graph_sizes(max_bs)
    limit = DEEPEP_PREFILL_MAX_BS
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64)]
    return len({(s + 7) // 8 * 8 for s in [*sizes, *range(1280, limit + 1, 256)]})


def _post_capture(layout: KVLayout, flags: MemoryFlags, chunk: int, max_total: int | None) -> bool:
    """arg_groups/overrides.py:1791-1862 post_capture_kv_sizing_planned, for what a plan knows: the env var,
    no MLA, decode graphs on (but on a prefill role), and, but on a decode role, a prefill graph that
    captures the whole chunk (its largest size: the chunk unless DeepEP or --max-total-tokens cuts it)."""
    if not flags.post_capture or layout.kv_lora_rank > 0:
        return False
    mode = flags.disaggregation
    if mode != "prefill" and not flags.cuda_graph:
        return False
    if mode == "decode":
        return True
    prefill_graph = not layout.multimodal or layout.arch in _MM_PREFILL_GRAPH
    prefill_max = DEEPEP_PREFILL_MAX_BS if flags.deepep else min(chunk, max_total or chunk)
    return flags.cuda_graph and prefill_graph and 0 < chunk <= prefill_max


def _final_reserve(
    reserved: float, gpu_mib: float, par: Parallel, flags: MemoryFlags, post_capture: bool
) -> float:
    """The 10 GiB floor on cards over 60 GiB, DeepEP's buffers on top of it (memory_hook.py:310-317); under
    post-capture sizing, whose graphs are measured after capture, the floor and parallel slack only
    (:291-293)."""
    if post_capture:
        return 1536 + par.tp * par.pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved + deepep_a2a_mib(flags)


def _vlm_fraction(fraction: float, layout: KVLayout, gpu_mib: float, post_capture: bool) -> float:
    """adjust_mem_fraction_for_vlm: the ViT factor; 8 GiB for the encoder under post-capture sizing."""
    return fraction - 8 * 1024 / gpu_mib if post_capture else fraction * vlm_factor(layout)


def _prefill_backend(given: str | None, pp: int) -> str:
    """cuda_graph_hook.py:142-160 apply_cuda_graph_compatibility: with pipeline parallelism the default
    breakable prefill graph is turned off; a backend the flags set is kept, whichever it is."""
    if given is not None:
        return given
    return "disabled" if pp > 1 else "breakable"


def vlm_factor(layout: KVLayout) -> float:
    """adjust_mem_fraction_for_vlm: 0.95 x clamp(1 - 0.1 (layers*hidden^2 / (24*1024^2) - 1), 0.8, 1.05)."""
    ratio = layout.vit_layers * layout.vit_hidden**2 / (24 * 1024**2) if layout.vit_layers else 1.0
    return 0.95 * max(0.8, min(1.05, 1 - 0.1 * (ratio - 1)))


def runner_vlm_factor(version: tuple[int, int, int, int] | None) -> float:
    """What builds before 0.4.9 did to a multimodal model's fraction, given or not: ModelRunner scaled it
    (model_executor/model_runner.py "Automatically reduce --mem-fraction-static ... because this is a
    multimodal model": x 0.95 in the 0.3.6-0.4.4 wheels, x 0.90 in 0.4.5-0.4.8). From 0.4.9 only a
    defaulted fraction is scaled (server_args.py), and a plan always gives the unit its own. Builds before
    0.3.6 were not read: 1.0."""
    if version is None or not (0, 3, 6) <= version[:3] < (0, 4, 9):
        return 1.0
    return 0.95 if version[:3] < (0, 4, 5) else 0.90


def aiter_fraction(
    fraction: float, *, backend: str | None, context_len: int, explicit: bool, honor: bool
) -> float:
    """attention_hook.py: aiter above an 8k context scales the fraction by 0.85, unless it was given and
    SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION is set."""
    if backend != "aiter" or context_len <= 8192 or (explicit and honor):
        return fraction
    return fraction * 0.85
