"""config.json read through ModelConfig: absent or null is None, another kind of value is refused by name."""

from __future__ import annotations

import re

import pytest

from agent.sglang.config_json import ModelConfig, with_override
from agent.sglang.kvlayout import read_layout

CONFIG = ModelConfig(
    {
        "num_hidden_layers": 32,
        "rope_theta": 5e5,
        "head_dim": None,
        "model_type": "llama",
        "layer_types": ["full_attention", "sliding_attention"],
        "kda_layers": [1, 3.0],
        "text_config": {"hidden_size": "4096"},
        "vision_config": [],
    }
)


def test_accessors_read_what_the_key_holds() -> None:
    assert CONFIG.integer("num_hidden_layers") == 32 and CONFIG.number("rope_theta") == 5e5
    assert CONFIG.integer("head_dim") is None and CONFIG.has("head_dim") and not CONFIG.has("v_head_dim")
    assert CONFIG.text("model_type") == "llama" and CONFIG.integers("kda_layers") == (1, 3)
    assert CONFIG.array("layer_types") == ("full_attention", "sliding_attention")
    assert CONFIG.first("head_dim", "num_hidden_layers") == 32


def test_a_sub_config_is_an_object_or_absent() -> None:
    text = CONFIG.sub("text_config")
    assert text is not None and text.value("hidden_size") == "4096"
    assert CONFIG.sub("vision_config") is None and CONFIG.sub("absent") is None


@pytest.mark.parametrize(
    ("read", "words"),
    [
        (lambda c: c.number("model_type"), "model_type = 'llama' is not a number"),
        (lambda c: c.text("num_hidden_layers"), "num_hidden_layers = 32 is not a string"),
        (lambda c: c.array("model_type"), "model_type = 'llama' is not a list"),
        (lambda c: c.integers("layer_types"), "layer_types"),
        (lambda c: c.sub("text_config").integer("hidden_size"), "config.json: text_config.hidden_size"),
    ],
)
def test_another_kind_of_value_is_refused_naming_the_key(read: object, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        read(CONFIG)  # type: ignore[operator]


def test_a_layout_reads_a_decoded_config_and_a_model_config_alike() -> None:
    decoded = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4,
               "hidden_size": 256, "max_position_embeddings": 4096}  # fmt: skip
    assert read_layout(decoded) == read_layout(ModelConfig(decoded))
    with pytest.raises(ValueError, match=re.escape("config.json: head_dim = 'x' is not a number")):
        read_layout({**decoded, "head_dim": "x"})


def test_a_bad_value_the_override_gave_is_named_as_the_overrides() -> None:
    """--json-model-override-args' values are the person's, not config.json's: an error says which."""
    merged = with_override(CONFIG, {"rope_scaling": {"factor": "x"}, "text_config": {"num_heads": "y"}})
    with pytest.raises(ValueError, match=r"^--json-model-override-args: rope_scaling\.factor = 'x'"):
        sub = merged.sub("rope_scaling")
        assert sub is not None
        sub.number("factor")
    text = merged.sub("text_config")
    assert text is not None
    with pytest.raises(ValueError, match=r"^--json-model-override-args: text_config\.num_heads"):
        text.integer("num_heads")
    with pytest.raises(ValueError, match=r"^config\.json: text_config\.hidden_size"):  # config.json's own
        text.integer("hidden_size")
