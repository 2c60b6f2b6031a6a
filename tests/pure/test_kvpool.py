"""SGLang's KV-pool arithmetic against SGLang's own logs and the seed host's measured pools."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sglang import kvpool
from agent.sglang.kvpool import GIB

V0523 = (0, 5, 23, 0)


def test_version_parser() -> None:
    assert kvpool.parse_version("0.5.23") == (0, 5, 23, 0)
    assert kvpool.parse_version("0.4.6.post5") == (0, 4, 6, 5)
    assert kvpool.parse_version("0.4.10post2") == (0, 4, 10, 2)
    assert kvpool.parse_version("0.5") == (0, 5, 0, 0)
    assert kvpool.parse_version("0.5.14") > kvpool.parse_version("0.5.13")
    with pytest.raises(ValueError, match="not like"):
        kvpool.parse_version("latest")


def test_mla_cell_is_the_full_latent_on_every_rank() -> None:
    assert kvpool.mla_cell(512, 64, 61, 2) == 70_272  # Kimi K2 / DeepSeek V3, bf16
    assert kvpool.mla_cell(512, 64, 61, 1) == 35_136  # fp8


def test_gqa_cell_divides_heads_over_attention_tp() -> None:
    assert kvpool.gqa_cell(kvpool.Heads(8, 128, 128), 80, 2, attn_tp=4) == 2 * 256 * 80 * 2
    assert kvpool.gqa_cell(kvpool.Heads(8, 128, 128), 80, 2, attn_tp=1) == 8 * 256 * 80 * 2
    # More ranks than KV heads: each rank keeps one head (replicated), never zero.
    assert kvpool.gqa_cell(kvpool.Heads(8, 128, 128), 80, 2, attn_tp=16) == 1 * 256 * 80 * 2


def test_fp8_log_of_deepseek_v3_matches_the_cell() -> None:
    # A real DeepSeek-V3 fp8 log: "#tokens: 524288, KV size: 17.16 GB".
    assert round(524_288 * kvpool.mla_cell(512, 64, 61, 1) / GIB, 2) == 17.16


def test_kv_dtype_bytes() -> None:
    assert kvpool.kv_elem_bytes("auto", 2) == 2
    assert kvpool.kv_elem_bytes("fp8_e4m3", 2) == 1
    assert kvpool.kv_elem_bytes("bf16", 1) == 2
    with pytest.raises(ValueError, match="mxfp8"):
        kvpool.kv_elem_bytes("mxfp8", 2)


def _draft(version: tuple[int, int, int, int], draft: kvpool.DraftKV, attn_tp: int = 1) -> int:
    return kvpool.with_draft(70_272, draft, version=version, layers=61, attn_tp=attn_tp)


DFLASH_32X128 = kvpool.Heads(32, 128)  # the seed host's DFLASH draft


def test_dflash_exact_draft_term_from_0_5_18() -> None:
    # The seed host: 3 draft layers, 32 KV heads of 128 over TP 8 -> 4 heads per rank -> 6,144 B.
    cell = _draft(V0523, kvpool.DraftKV("DFLASH", 3, DFLASH_32X128), attn_tp=8)
    assert cell == 70_272 + 6_144
    fp8_draft = _draft(V0523, kvpool.DraftKV("DFLASH", 3, DFLASH_32X128, elem=1), attn_tp=8)
    assert fp8_draft == 70_272 + 3_072
    # The boundary is 0.5.18 (read in the 0.5.18 wheel), not 0.5.20; DSPARK is of the same family.
    assert _draft((0, 5, 18, 0), kvpool.DraftKV("DFLASH", 3, DFLASH_32X128), attn_tp=8) == cell
    assert _draft(V0523, kvpool.DraftKV("DSPARK", 3, DFLASH_32X128), attn_tp=8) == cell


def test_dflash_layer_scaling_before_0_5_18() -> None:
    assert _draft((0, 5, 16, 0), kvpool.DraftKV("DFLASH", 3)) == -(-70_272 * 64 // 61)
    assert _draft((0, 5, 17, 0), kvpool.DraftKV("DFLASH", 3)) == -(-70_272 * 64 // 61)
    with pytest.raises(ValueError, match=r"0\.5\.11"):
        _draft((0, 5, 10, 0), kvpool.DraftKV("DFLASH", 3))


def test_eagle_scaling_from_0_5_14_and_none_before() -> None:
    assert _draft((0, 5, 14, 0), kvpool.DraftKV("EAGLE", 1)) == 71_424  # DeepSeek V3 with MTP
    assert _draft((0, 5, 23, 0), kvpool.DraftKV("EAGLE3", 1)) == 70_272 + 1_152
    assert _draft((0, 5, 13, 0), kvpool.DraftKV("EAGLE3", 1)) == 70_272
    assert _draft(V0523, kvpool.DraftKV("NGRAM", None)) == 70_272
    with pytest.raises(ValueError, match="layer count"):
        _draft(V0523, kvpool.DraftKV("EAGLE3", None))


def test_real_kimi_k25_log_is_predicted_within_rounding() -> None:
    # Public Kimi-K2.5 TP8 MI355X log: pre 283.53, post 209.96, default fraction; logged #tokens 2454421.
    predicted = kvpool.pool_tokens(283.53, 209.96, 0.8260405859375, 70_272)
    assert predicted == 2_454_504
    assert abs(predicted - 2_454_421) / 2_454_421 < 0.0001


def test_seed_host_pools() -> None:
    cell = 70_272 + 6_144
    measured = {0.85: 101_134, 0.92: 192_406, 0.94: 218_484}
    for fraction, pool in measured.items():
        assert abs(kvpool.pool_tokens(92.80, 21.1176, fraction, cell) - pool) <= 10


def test_pool_floors_to_the_page_and_caps() -> None:
    free = kvpool.pool_tokens(92.80, 21.1176, 0.94, 76_416)
    assert kvpool.pool_tokens(92.80, 21.1176, 0.94, 76_416, kvpool.Paging(page_size=64)) == free // 64 * 64
    assert (
        kvpool.pool_tokens(92.80, 21.1176, 0.94, 76_416, kvpool.Paging(max_total_tokens=150_000)) == 150_000
    )
    assert kvpool.pool_tokens(92.80, 21.1176, 0.94, 76_416, kvpool.Paging(64, 150_001)) == 149_952
    # A cap above the profiled value is ignored (SGLang keeps the profiled value).
    assert kvpool.pool_tokens(92.80, 21.1176, 0.94, 76_416, kvpool.Paging(max_total_tokens=10**9)) == free


def test_no_memory_gives_zero() -> None:
    assert kvpool.pool_tokens(92.80, 21.1176, 0.70, 76_416) == 0  # 92.8 * 0.3 > 21.1


def test_min_fraction_for_the_seed_host() -> None:
    fraction = kvpool.min_fraction(92.80, 21.1176, 76_416, 200_000)
    assert fraction == 0.926
    assert kvpool.pool_tokens(92.80, 21.1176, fraction, 76_416) >= 200_000
    assert kvpool.pool_tokens(92.80, 21.1176, fraction - 0.001, 76_416) < 200_000
    assert kvpool.min_fraction(92.80, 21.1176, 76_416, 400_000) is None
    assert (
        kvpool.min_fraction(92.80, 21.1176, 76_416, 200_000, kvpool.Paging(max_total_tokens=100_000)) is None
    )


@given(
    pre=st.floats(20, 300),
    weights_share=st.floats(0.05, 0.9),
    cell=st.integers(1_000, 200_000),
    target=st.integers(1, 3_000_000),
    page=st.sampled_from([1, 16, 64]),
)
def test_min_fraction_is_the_smallest_step_that_reaches(
    pre: float, weights_share: float, cell: int, target: int, page: int
) -> None:
    post = pre * (1 - weights_share)
    fraction = kvpool.min_fraction(pre, post, cell, target, kvpool.Paging(page))
    if fraction is None:
        assert kvpool.pool_tokens(pre, post, 0.999, cell, kvpool.Paging(page)) < target
        return
    assert 0 < fraction < 1
    assert kvpool.pool_tokens(pre, post, fraction, cell, kvpool.Paging(page)) >= target
    if fraction > 0.001:
        assert kvpool.pool_tokens(pre, post, round(fraction - 0.001, 3), cell, kvpool.Paging(page)) < target


def test_req_to_token_is_megabytes_not_gigabytes() -> None:
    assert kvpool.req_to_token_bytes(65, 200_000) == 65 * 200_004 * 4  # 52.0 MB
    assert round(kvpool.req_to_token_bytes(2049, 200_000) / 1e9, 2) == 1.64  # --max-running-requests unset


def test_tokens_per_step() -> None:
    assert kvpool.tokens_per_step(92.80, 76_416) == 13_039  # the seed's 13,039 per 0.01
