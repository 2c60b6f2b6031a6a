"""SGLang's own KV-pool arithmetic: bytes per token, pool tokens from the fraction, and the inverse.

Stdlib only: this module also runs on the host. Formulas follow SGLang's source; the file names are
relative to python/sglang/srt/ in the SGLang repository.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

GIB = 2**30
FRACTION_STEP = 0.001  # the planner emits fractions with three decimals

# --kv-cache-dtype values and their bytes per element; "auto" means the model's dtype.
_KV_DTYPE_BYTES: Mapping[str, int] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
# Algorithms whose draft KV is budgeted by layer scaling from 0.5.14 on
# (Scheduler.init_model_worker loads drafts before init_memory_pools).
# FROZEN_KV_MTP counts as EAGLE there (speculative/spec_info.py is_eagle), so its cell is scaled too.
EAGLE_STYLE = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "FROZEN_KV_MTP"})
# DSPARK is of the DFLASH family (spec_info.py is_dflash_family): the same draft term.
DFLASH_FAMILY = frozenset({"DFLASH", "DSPARK"})
# The exact DFLASH draft term starts at 0.5.18 (FACTS corrections); 0.5.11-0.5.17 scale by layers.
DFLASH_EXACT_FROM = (0, 5, 18, 0)
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+))?(?:[.+-].*)?")


@dataclass(frozen=True)
class Heads:
    """The KV shape of MHA/GQA attention: KV heads, and the K and V widths of one head."""

    kv_heads: int
    head_dim: int
    v_head_dim: int | None = None  # None: as wide as K

    @property
    def width(self) -> int:
        """K plus V elements per KV head."""
        return self.head_dim + (self.head_dim if self.v_head_dim is None else self.v_head_dim)


@dataclass(frozen=True)
class DraftKV:
    """What a speculative draft adds to the pool's cell: its algorithm and KV layers, and for the DFLASH
    family from 0.5.18 its own heads and bytes per element."""

    algorithm: str | None
    layers: int | None
    heads: Heads | None = None
    elem: int = 2


@dataclass(frozen=True)
class Paging:
    """How the pool's token count is rounded and capped: --page-size and --max-total-tokens."""

    page_size: int = 1
    max_total_tokens: int | None = None


def parse_version(text: str) -> tuple[int, int, int, int]:
    """'0.5.23' -> (0, 5, 23, 0); '0.4.6.post5' -> (0, 4, 6, 5); anything else raises ValueError."""
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"SGLang version {text!r} is not like 0.5.23 or 0.4.6.post5")
    major, minor, patch, post = m.groups()
    return int(major), int(minor), int(patch or 0), int(post or 0)


def kv_elem_bytes(kv_cache_dtype: str, auto_bytes: int) -> int:
    """Bytes per KV element for a --kv-cache-dtype value (model_runner: kv_cache_dtype resolution)."""
    if kv_cache_dtype == "auto":
        return auto_bytes
    try:
        return _KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        known = ", ".join(["auto", *_KV_DTYPE_BYTES])
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not sized here (known: {known})") from None


def heads_per_rank(kv_heads: int, attn_tp: int) -> int:
    """KV heads stored per attention-TP rank; never below one (replicated when heads < ranks)."""
    return max(1, kv_heads // attn_tp)


def mla_cell(kv_lora_rank: int, qk_rope_head_dim: int, layers: int, elem: int) -> int:
    """MLA bytes per token per GPU: the full latent on every rank, so not divided by TP.

    model_runner_kv_cache_mixin.get_cell_size_per_token (use_mla_backend branch).
    """
    return (kv_lora_rank + qk_rope_head_dim) * layers * elem


def gqa_cell(heads: Heads, layers: int, elem: int, attn_tp: int) -> int:
    """MHA/GQA bytes per token per GPU: K and V for this rank's heads (get_cell_size_per_token)."""
    return heads_per_rank(heads.kv_heads, attn_tp) * heads.width * layers * elem


def with_draft(
    cell: int, draft: DraftKV, *, version: tuple[int, int, int, int], layers: int, attn_tp: int = 1
) -> int:
    """The target cell enlarged by the speculative draft's own KV, as each SGLang version budgets it."""
    algorithm, draft_layers = draft.algorithm, draft.layers
    if algorithm is None or algorithm == "NGRAM":
        return cell  # NGRAM has no draft model and no draft pool
    if algorithm in DFLASH_FAMILY:
        return _dflash_cell(cell, draft, version, layers, attn_tp)
    if algorithm not in EAGLE_STYLE:
        raise ValueError(f"speculative algorithm {algorithm!r} is not sized here")
    if version < (0, 5, 14, 0):
        # 0.5.8-0.5.13 share the target's token count; draft KV and weights come out of the slack.
        return cell
    if draft_layers is None:
        raise ValueError("the draft's layer count is needed to size the pool")
    # >= 0.5.14 (pool_configurator / kv_cache_configurator): cell + int(cell * L_draft / L).
    return cell + int(cell * draft_layers / layers)


def _dflash_cell(
    cell: int, draft: DraftKV, version: tuple[int, int, int, int], layers: int, attn_tp: int
) -> int:
    """DFLASH/DSPARK: layer scaling in 0.5.11-0.5.17, an exact draft term from 0.5.18.

    pool_configurator.py DefaultPoolConfigurator and speculative/dflash_utils.py
    scale_kv_cell_size_per_token_for_dflash: target cell + the draft's own K and V per rank.
    """
    if version < (0, 5, 11, 0):
        raise ValueError("DFLASH speculative decoding needs SGLang 0.5.11 or newer")
    if draft.layers is None:
        raise ValueError("the draft's layer count is needed to size the pool")
    if version < DFLASH_EXACT_FROM:
        return math.ceil(cell * (layers + draft.layers) / layers)
    if draft.heads is None:
        raise ValueError("the draft's KV heads and head_dim are needed to size the pool")
    # mem_cache/draft_kv_budget.py and speculative/dflash_utils.py: the draft's own K and V per rank.
    heads = draft.heads
    return cell + heads_per_rank(heads.kv_heads, attn_tp) * heads.width * draft.layers * draft.elem


def pool_tokens(
    pre_gib: float, post_gib: float, fraction: float, cell_bytes: int | float, paging: Paging = Paging()
) -> int:
    """Tokens SGLang allocates: floor((post - pre*(1-f)) * 2^30 / cell), paged and capped; 0 = no memory.

    model_runner_kv_cache_mixin.profile_max_num_token (rest = post - pre*(1-f)) and, from 0.5.11,
    kv_cache_configurator.config_from_budget: floor to the page, cap, re-floor to the page.
    """
    rest_gib = post_gib - pre_gib * (1.0 - fraction)
    if rest_gib <= 0:
        return 0  # SGLang refuses to start: "Not enough memory. Please try to increase ..."
    page_size, cap = paging.page_size, paging.max_total_tokens
    tokens = _floor_page(math.floor(rest_gib * GIB / cell_bytes), page_size)
    if cap is not None and cap < tokens:
        tokens = _floor_page(cap, page_size)
    return max(tokens, 0)


def _floor_page(tokens: int, page_size: int) -> int:
    return tokens // page_size * page_size


def floor_fraction(top: float) -> float:
    """A fraction rounded down to 0.001: the highest the planner would emit at or under `top`."""
    return round(math.floor(round(top / FRACTION_STEP, 6)) * FRACTION_STEP, 3)


def min_fraction(
    pre_gib: float, post_gib: float, cell_bytes: int | float, target_tokens: int, paging: Paging = Paging()
) -> float | None:
    """The smallest fraction, rounded up to 0.001, whose pool holds target_tokens; None if none below 1."""
    if paging.max_total_tokens is not None and paging.max_total_tokens < target_tokens:
        return None
    # Solve rest = target * cell exactly, then step up: the page floor and float rounding can fall short.
    exact = 1.0 - (post_gib - target_tokens * cell_bytes / GIB) / pre_gib
    steps = max(1, math.ceil(round(exact / FRACTION_STEP, 6)))
    while steps * FRACTION_STEP < 1.0:
        fraction = round(steps * FRACTION_STEP, 3)
        if pool_tokens(pre_gib, post_gib, fraction, cell_bytes, paging) >= target_tokens:
            return fraction
        steps += 1
    return None


def search_fraction(pool: Callable[[float], int], target_tokens: int) -> float | None:
    """The smallest 0.001 step whose pool(fraction) holds target_tokens, for any family's sizing rule
    (each is monotonic in the fraction); None when even 0.999 falls short."""
    lo, hi = 1, 999
    if pool(round(hi * FRACTION_STEP, 3)) < target_tokens:
        return None
    while lo < hi:  # about ten evaluations
        mid = (lo + hi) // 2
        if pool(round(mid * FRACTION_STEP, 3)) >= target_tokens:
            hi = mid
        else:
            lo = mid + 1
    return round(lo * FRACTION_STEP, 3)


def tokens_per_step(pre_gib: float, cell_bytes: int | float, step: float = 0.01) -> int:
    """Pool tokens one step of the fraction buys: pre * step * 2^30 / cell."""
    return int(pre_gib * step * GIB / cell_bytes)


def req_to_token_bytes(rows: int, context_len: int) -> int:
    """The int32 req_to_token table: rows x (context + 4) entries (mem_cache/memory_pool.ReqToTokenPool).

    It is allocated after the pool is sized, so it comes out of the slack.
    """
    return rows * (context_len + 4) * 4
