"""config.json as transformers reads it: keys left at the config class's default are filled per model type."""

from __future__ import annotations

from typing import Any

import pytest

from agent.sglang.kvlayout import CLASS_DEFAULTS, read_layout

# google/gemma-3-4b-it as published: its text_config leaves the attention heads, the KV heads and the head
# dimension at Gemma3TextConfig's defaults (8, 4, 256).
GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
    },
    "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152},
    "torch_dtype": "bfloat16",
}  # fmt: skip


def test_gemma3_text_config_without_heads_is_read_with_the_class_defaults() -> None:
    """Refused before: "config.json of Gemma3ForConditionalGeneration lacks an integer
    'num_attention_heads'"."""
    layout = read_layout(GEMMA3_4B)
    assert (layout.kv_heads, layout.head_dim) == (4, 256)
    assert layout.multimodal


def test_a_text_config_without_its_model_type_takes_the_parents() -> None:
    config = {
        **GEMMA3_4B,
        "text_config": {k: v for k, v in GEMMA3_4B["text_config"].items() if k != "model_type"},
    }
    assert read_layout(config).head_dim == 256


@pytest.mark.parametrize("model_type", sorted(CLASS_DEFAULTS))
def test_defaults_never_override_what_the_config_says(model_type: str) -> None:
    from agent.sglang.kvlayout import with_class_defaults

    given = dict.fromkeys(CLASS_DEFAULTS[model_type], 7)
    assert with_class_defaults({"model_type": model_type, **given}) == {"model_type": model_type, **given}


def test_llama_without_kv_heads_uses_the_attention_heads() -> None:
    """LlamaConfig: num_key_value_heads None means one KV head per attention head; head_dim is derived."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "num_hidden_layers": 16, "num_attention_heads": 32, "torch_dtype": "bfloat16"}  # fmt: skip
    layout = read_layout(config)
    assert (layout.kv_heads, layout.head_dim, layout.context_len) == (32, 64, 2048)
