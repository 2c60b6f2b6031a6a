"""Flag combinations SGLang 0.5.23 refuses at start (plan/startrefusals.py): refused in one line naming the
flag, and the ones it takes left alone; and the KV element --dtype runs. Each case's outcome is the
oracle's (python -m tests.oracle size --gpu h100 -- FLAGS)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.predict import pool_model
from tests.pure.test_review39b_findings import facts

NGRAM_64 = {"speculative_algorithm": "NGRAM", "page_size": 64}


def refused(model: str, weights: float, **flags: Any) -> tuple[str, ...]:
    doc = facts(model, weights, tp_size=8, **flags)
    return plan_from_facts(parse_facts(doc, name="x"), Target(32768)).refusals


@pytest.mark.parametrize(
    ("model", "weights", "flags"),
    [
        ("gpt-oss-20b", 14, {"attention_backend": "fa3"}),
        ("gpt-oss-20b", 14, {"prefill_attention_backend": "fa3", "decode_attention_backend": "fa3"}),
        ("gemma-4-26b-a4b", 52, {"decode_attention_backend": "triton"}),  # Gemma 4 fills the other side
        ("llama-3.1-70b", 141, {**NGRAM_64, "attention_backend": "flashinfer"}),
        ("llama-3.1-70b", 141, {**NGRAM_64, "speculative_ngram_max_bfs_breadth": 1}),
        ("glm-5-nvfp4", 440, {"speculative_algorithm": "NGRAM", "attention_backend": "flashinfer"}),
        ("glm-5-nvfp4", 440, {"kv_cache_dtype": "fp8_e4m3"}),
    ],
)  # fmt: skip
def test_combinations_sglang_starts_are_not_refused(
    model: str, weights: float, flags: dict[str, Any]
) -> None:
    assert refused(model, weights, **flags) == ()


def test_one_split_backend_alone_is_refused_for_gpt_oss() -> None:
    # GPT-OSS's override sets nothing once a backend is given: "Prefill: None" fails its assert.
    (line,) = refused("gpt-oss-20b", 14, decode_attention_backend="fa3")
    assert line.startswith("--decode-attention-backend fa3 alone") and "--attention-backend fa3" in line


def test_a_refusal_names_the_flag_and_what_to_set() -> None:
    (line,) = refused("glm-5-nvfp4", 440, kv_cache_dtype="fp8_e5m2")
    assert line.startswith("--kv-cache-dtype fp8_e5m2:") and "set --kv-cache-dtype fp8_e4m3" in line
    (line,) = refused("llama-3.1-70b", 141, speculative_algorithm="NGRAM", page_size=64)
    assert line.startswith("--speculative-algorithm NGRAM with --page-size 64") and "--page-size 1" in line


def test_dtype_flag_sets_the_kv_element_as_sglang_runs_it() -> None:
    # The oracle on H100, Llama-3.1-8B at TP 1: --dtype float32 is a 262,144-byte cell (float32 KV); a float32
    # checkpoint under --dtype auto runs in float16: 131,072 bytes.
    def cell(**flags: Any) -> float:
        return pool_model(
            parse_facts(facts("llama-3.1-8b", 16, tp_size=1, **flags), name="x"), 32768
        ).pool.cell_bytes

    assert cell(dtype="float32") == 262_144
    assert cell() == cell(dtype="float16") == 131_072
