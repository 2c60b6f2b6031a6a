"""Gemma 4's attention shapes as SGLang 0.5.23 reads them (is_hybrid_swa_compress).

Stdlib only. Gemma 4's config.json states the sliding-window shape as the base (head_dim,
num_key_value_heads) and the full-attention one apart (global_head_dim, num_global_key_value_heads).
transformers' Gemma4TextConfig turns the second into a per-layer override of the full-attention layers
(models/gemma4/configuration_gemma4.py: global_head_dim defaults to 512; num_global_key_value_heads counts
only with attention_k_eq_v; the last layer is forced to full attention), and SGLang flattens that back
into one full and one sliding shape (utils/hf_transformers/config.py _apply_gemma4_attention_overrides):
head_dim / num_key_value_heads are the full layers', swa_* the sliding layers'.
"""

from __future__ import annotations

from agent.sglang.config_json import ModelConfig

ARCHS = frozenset(
    {"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"}
)
GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig's default for global_head_dim


def flatten(text: ModelConfig) -> ModelConfig:
    """Gemma 4's text config with SGLang's full and sliding shapes in the keys the SWA layout reads."""
    swa_dim, swa_heads = text.integer("head_dim"), text.integer("num_key_value_heads")
    full_dim = text.integer("global_head_dim") or GLOBAL_HEAD_DIM
    global_heads = text.integer("num_global_key_value_heads")
    full_heads = global_heads if text.value("attention_k_eq_v") and global_heads is not None else swa_heads
    types = list(text.array("layer_types") or ())
    if types and types[-1] != "full_attention":
        types[-1] = "full_attention"  # transformers forces the last layer to full attention
    data = {
        **text.data,
        "layer_types": types,
        "head_dim": full_dim,
        "num_key_value_heads": full_heads,
        "v_head_dim": text.integer("v_head_dim") or full_dim,
        "swa_head_dim": swa_dim,
        "swa_v_head_dim": swa_dim,
        "swa_num_key_value_heads": swa_heads,
    }
    return ModelConfig(data, text.where, text.prefix, text.overridden)
