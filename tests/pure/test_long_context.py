"""A context above the model's own: --json-model-override-args is applied to config.json as SGLang applies
it (utils/hf_transformers/config.py get_config), the YaRN override is named as the way to reach a longer
context, and SGLang's longer-context override is its own flag, apart from --force."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.apply import allow_context
from agent.cli.options import parse_set
from agent.errors import UsageError
from agent.inventory import load_host
from agent.orchestrate.asked import Change
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.sglang.config_json import ModelConfig, with_override
from agent.sglang.kvlayout import context_length
from agent.sglang.long_context import yarn_override
from tests.pure.test_facts_plan import H100, facts

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
QWEN3_8B: dict[str, Any] = json.loads((MODELS / "qwen3-8b" / "config.json").read_text())
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def plan(config: dict[str, Any], context: int, **flags: Any) -> Any:
    doc = facts(config, H100, 1, weights=16 * 10**9, flags={"tp-size": 1, **flags})
    return plan_from_facts(parse_facts(doc), Target(context))


def test_the_yarn_override_raises_the_models_own_context_as_sglang_derives_it() -> None:
    override = json.dumps({"rope_scaling": YARN, "max_position_embeddings": 131072})
    p = plan(QWEN3_8B, 131_072, **{"json-model-override-args": override})
    assert not p.refusals, p.refusals
    # The factor alone counts 1 when original_max_position_embeddings is given (get_context_length).
    factor_only = json.dumps({"rope_scaling": YARN})
    assert plan(QWEN3_8B, 131_072, **{"json-model-override-args": factor_only}).refusals
    without_original = json.dumps({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert not plan(QWEN3_8B, 131_072, **{"json-model-override-args": without_original}).refusals


def test_a_context_above_the_models_own_names_the_yarn_override_and_the_explicit_flag() -> None:
    p = plan(QWEN3_8B, 131_072)
    assert p.binding is not None
    assert "--set json-model-override-args=" in p.binding and '"rope_type": "yarn"' in p.binding
    assert "--allow-longer-context" in p.binding and "apply --force" not in p.binding
    name, suggested = parse_set(hinted_set(p.binding))  # fed back as a person would paste it
    assert name == "json-model-override-args" and isinstance(suggested, str)
    assert not plan(QWEN3_8B, 131_072, **{name: suggested}).refusals


def hinted_set(text: str) -> str:
    """The FLAG=VALUE of the `--set` a hint names, as a POSIX shell hands it to deployctl."""
    words = shlex.split(text.split("YaRN: ")[1].split("; or")[0])
    assert words[0] == "--set" and len(words) == 2, words
    return words[1]


def test_qwen3_is_scaled_from_its_trained_length_as_its_model_card_says() -> None:
    """Qwen3's config.json states 40,960, its model card 32,768 trained (original_max_position_embeddings
    32768, factor 4.0 for 131,072)."""
    rope = json.loads(yarn_override(QWEN3_8B["max_position_embeddings"], 131_072) or "{}")
    assert rope == {"rope_scaling": YARN, "max_position_embeddings": 131_072}


@given(st.integers(1_024, 1_000_000), st.integers(1, 2_000_000))
def test_the_override_derives_at_least_the_context_asked(own: int, context: int) -> None:
    override = yarn_override(own, context)
    if context <= own:
        assert override is None
        return
    assert override is not None
    derived = context_length(with_override(ModelConfig({"max_position_embeddings": own}), override))
    assert derived >= context
    rope = json.loads(override)["rope_scaling"]
    assert rope["original_max_position_embeddings"] <= own and rope["factor"] >= 2


def test_the_apply_hint_fed_back_through_set_is_accepted(tmp_path: Path) -> None:
    host = load_host("ct200-sim", UNITS)
    gqa = host.model_copy(update={"model": host.model.model_copy(update={"attention": "gqa"})})
    with pytest.raises(UsageError) as caught:
        allow_context(gqa, Change(400_000))
    assert caught.value.hint is not None
    name, value = parse_set(hinted_set(caught.value.hint))
    assert name == "json-model-override-args" and json.loads(str(value))["max_position_embeddings"] >= 400_000


def test_the_override_is_merged_as_sglang_merges_it() -> None:
    base = ModelConfig(
        {"rope_scaling": {"rope_type": "default", "rope_theta": 1e6}, "text_config": {"a": 1, "b": 2}, "x": 1}
    )
    got = with_override(base, '{"rope_scaling": {"rope_type": "yarn"}, "text_config": {"b": 3}, "x": 2}')
    assert got.data == {
        "rope_scaling": {"rope_type": "yarn", "rope_theta": 1e6},
        "text_config": {"a": 1, "b": 3},
        "x": 2,
    }
    assert with_override(base, None) is base and with_override(base, "{}").data == base.data


@pytest.mark.parametrize("bad", ["{", "[1]", '"x"'])
def test_a_bad_override_is_refused_in_one_line(bad: str) -> None:
    with pytest.raises(ValueError, match="json-model-override-args"):
        with_override(ModelConfig({}), bad)


def test_the_yarn_override_is_named_only_above_the_models_own_context() -> None:
    assert yarn_override(40_960, 131_072) is not None
    assert yarn_override(40_960, 40_960) is None


UNITS = Path(__file__).resolve().parents[2] / "units"


def test_force_no_longer_sets_sglangs_longer_context_override() -> None:
    """apply --force (apply an infeasible plan) set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 unasked."""
    host = load_host("ct200-sim", UNITS)
    own = host.model.max_context
    assert own is not None and own < 400_000
    with pytest.raises(UsageError) as caught:
        allow_context(host, Change(400_000, force=True))
    assert caught.value.hint is not None
    assert "--allow-longer-context" in caught.value.hint
    assert "yarn" not in caught.value.hint  # Kimi (MLA) ships its own YaRN: another would replace it
    gqa = host.model_copy(update={"model": host.model.model_copy(update={"attention": "gqa"})})
    with pytest.raises(UsageError) as caught:
        allow_context(gqa, Change(400_000, force=True))
    assert caught.value.hint is not None and '"rope_type": "yarn"' in caught.value.hint
    allowed = allow_context(host, Change(400_000, allow_longer_context=True))
    assert allowed.unit.environment["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
    assert allow_context(host, Change(own)) is host


def test_qwen25_72b_at_200k_is_refused_with_the_reason_and_both_ways() -> None:
    # Qwen2.5-72B-Instruct publishes max_position_embeddings 32768 (YaRN is left to the user).
    shape = {
        **json.loads((MODELS / "qwen2.5-32b" / "config.json").read_text()),
        "max_position_embeddings": 32768,
    }
    shape.update(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64)
    doc = facts(shape, H100, 4, weights=145 * 10**9, flags={"tp-size": 4})
    p = plan_from_facts(parse_facts(doc), Target(200_000))
    assert not p.feasible and p.binding is not None
    assert "SGLang refuses a context of 200,000 above the model's own 32,768" in p.binding
    name, override = parse_set(hinted_set(p.binding))
    doc["flags"] = {"tp-size": 4, name: override}
    assert not plan_from_facts(parse_facts(doc), Target(200_000)).refusals


def test_a_models_own_rope_scaling_is_not_replaced_by_yarn() -> None:
    from agent.sglang.long_context import own_rope_scaling

    own = [
        {"factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},  # Llama 3.1
        {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},  # gpt-oss
        {"rope_type": "default", "mrope_section": [11, 11, 10], "rope_theta": 1e7},  # Qwen3.5 mrope
        {"type": "mrope", "mrope_section": [16, 24, 24]},
        {  # Gemma 4: per layer type
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default"},
        },
    ]  # fmt: skip
    plain: list[object] = [None, {}, {"rope_type": "default", "rope_theta": 1e6}, {"rope_type": "default"}]
    assert all(own_rope_scaling(r) for r in own)
    assert not any(own_rope_scaling(r) for r in plain)
