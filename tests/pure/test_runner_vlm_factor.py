"""SGLang builds before 0.4.9 scaled a multimodal model's --mem-fraction-static in ModelRunner, given or not
(model_executor/model_runner.py: x 0.95 in 0.3.6-0.4.4, x 0.90 in 0.4.5-0.4.8, read in those wheels); from
0.4.9 only a defaulted fraction is scaled (server_args.py), and a plan always gives the unit its own. The
cause of the Gemma 3 start on an H200 that a cold plan over-predicted by about 6 GiB (docs/accuracy.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.plan.facts import parse_facts
from agent.plan.predict import pool_model
from agent.sglang import memory_defaults
from agent.sglang.kvpool import parse_version

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
H200 = {"name": "NVIDIA H200", "memory_total_mib": 143771, "compute_capability": "9.0"}


def facts(model: str, version: str):  # type: ignore[no-untyped-def]
    config = json.loads((MODELS / model / "config.json").read_text())
    return parse_facts({
        "format": "deployctl-facts/1", "gpus": [H200], "sglang": {"version": version},
        "model": {"config": config, "weights_bytes": 17 * 2**30},
        "flags": {"mem-fraction-static": 0.88}, "last_start": None,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("version", "factor"),
    [("0.3.6", 0.95), ("0.4.3.post4", 0.95), ("0.4.4", 0.95), ("0.4.5", 0.90), ("0.4.8", 0.90),
     ("0.4.9", 1.0), ("0.5.23", 1.0), ("0.3.0", 1.0)],
)  # fmt: skip
def test_the_factor_follows_the_version_that_ran(version: str, factor: float) -> None:
    assert memory_defaults.runner_vlm_factor(parse_version(version)) == factor


def test_an_old_build_sizes_a_multimodal_model_at_its_scaled_fraction_and_says_so() -> None:
    old = pool_model(facts("qwen3-vl-8b-instruct", "0.4.4"), 32_768)
    later = pool_model(facts("qwen3-vl-8b-instruct", "0.4.9"), 32_768)
    assert old.pool.pool(0.88) == pytest.approx(later.pool.pool(0.88 * 0.95), abs=2)
    assert old.pool.pool(0.88) < later.pool.pool(0.88)
    assert any("0.95" in n and "multimodal" in n for n in old.notes)
    assert not any("because it is multimodal" in n for n in later.notes)


def test_a_text_model_on_an_old_build_is_not_scaled() -> None:
    old = pool_model(facts("llama-3.1-8b", "0.4.4"), 32_768)
    later = pool_model(facts("llama-3.1-8b", "0.4.9"), 32_768)
    assert old.pool.pool(0.88) == later.pool.pool(0.88)
