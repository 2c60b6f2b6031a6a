"""Gemma 4 (is_hybrid_swa_compress) planned as SGLang 0.5.23 sizes it: full-attention layers with the
global head shape, sliding layers with the base one (utils/hf_transformers/config.py
_apply_gemma4_attention_overrides), against SGLang's own answers (tests/data/oracle)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.plan.predict import pool_model
from agent.sglang.kvlayout import read_layout
from tests.pure import test_oracle_pools as oracle

GEMMA4 = [(c, d) for c, d in oracle.CASES if c["model"] == "gemma-4-26b-a4b" and c["answer"].get("ok")]


def test_gemma4s_layout_is_the_global_and_the_sliding_shape() -> None:
    layout = read_layout(oracle.config_of("gemma-4-26b-a4b"))
    assert layout.family == "swa"
    assert layout.kv_layers == (5, 11, 17, 23, 29) and len(layout.swa_layers) == 25
    assert (layout.kv_heads, layout.head_dim, layout.v_head_dim) == (2, 512, 512)  # attention_k_eq_v
    assert (layout.swa_kv_heads, layout.swa_head_dim, layout.swa_v_head_dim) == (8, 256, 256)


@pytest.mark.parametrize(("case", "drafts"), GEMMA4, ids=[c["case"] for c, _ in GEMMA4])
def test_gemma4_pool_equals_sglangs_own(case: dict[str, Any], drafts: dict[str, Any]) -> None:
    inp = oracle.plan_input(case, drafts)
    if oracle.set_aside(case, inp):
        pytest.skip("set aside by the harness")
    facts = pool_model(inp, int(inp.flags.get("context-length") or 32768))
    fraction = float(inp.flags.get("mem-fraction-static") or facts.fraction)
    want = int(case["answer"]["max_total_num_tokens"])
    assert abs(facts.pool.pool(fraction) - want) <= oracle.TOLERANCE * want
