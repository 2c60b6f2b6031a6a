"""SGLang 0.5.23 start-up lines of the hybrid pools, MiniMax's index pool and the no-op pool."""

from __future__ import annotations

import pytest

from agent.sglang.logs import events as ev
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.summary import summarize

P = "[2026-12-01 10:09:41 TP0] "


@pytest.mark.parametrize(
    "message",
    [
        # mem_cache/kv_cache_configurator.py _handle_max_mamba_cache
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
        "max_mamba_cache_size=0 (total_rest_memory=0.40 GB, mamba_cache_per_req=18.40 MB).",
        # kv_cache_configurator.resolve_max_num_reqs
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
        "max_mamba_cache_size=2, mamba_ratio=3, resulting max_num_reqs=0.",
        # pool_configurator.validate_swa_pool_size (a continuation line without the exception name)
        "SWA pool (128 tokens) cannot hold even one request: the prefill admission floor is "
        "sliding_window_size (128) + page_size (1). Increase --swa-full-tokens-ratio or the total KV budget.",
        # SWARequestCapPoolConfigurator.calculate_pool_sizes
        "RuntimeError: SWA pool cap (70000 tokens, 3.20 GiB) leaves no room for the full KV pool within "
        "the available 2.90 GiB.",
    ],
)
def test_hybrid_memory_failures_are_not_enough_memory(message: str) -> None:
    events = parse_line(P + message)
    assert [e.failure_kind for e in events if isinstance(e, ev.Failure)] == [ev.NOT_ENOUGH_MEMORY]


def test_minimax_index_pool_is_not_a_draft() -> None:
    lines = [
        P + "Load weight begin. avail mem=92.80 GB",
        P + "Load weight end. elapsed=1.00 s, type=MiniMaxM3SparseForCausalLM, avail mem=22.32 GB, "
        "mem usage=70 GB.",
        P
        + "MiniMax MSA index KV Cache is allocated. dtype: torch.bfloat16, #tokens: 90000, KV size: 0.62 GB",
        P + "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 101134, KV size: 6.62 GB",
    ]
    s = summarize(lines)
    assert (s.kv_tokens, s.kv_size_gb, s.draft_kv_tokens) == (101_134, 6.62, None)


def test_a_skipped_pool_counts_its_logical_tokens() -> None:
    events = parse_line(
        P + "KV Cache skipped (no-op pool). Logical #tokens: 5000, physical K/V size: ~1.0 KB placeholder"
    )
    assert [(e.tokens, e.size_gb, e.label) for e in events if isinstance(e, ev.KvPool)] == [
        (5000, 0.0, "skipped")
    ]
