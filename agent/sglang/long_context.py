"""A context above the model's own: what SGLang 0.5.23 allows, and the YaRN override that reaches it.

Stdlib only. configs/model_config.py _derive_context_length refuses a --context-length above the one
derived from config.json unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set; that runs the model past
its trained length without scaling. Scaling RoPE with YaRN through --json-model-override-args raises the
derived length itself.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping

ALLOW_LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

# Checkpoints whose max_position_embeddings is above the length they were trained at: YaRN scales from the
# trained length. Every Qwen3 text checkpoint (dense and MoE) states 40,960, but its model card (and SGLang's
# Qwen3 page) gives 32,768 as the native context and original_max_position_embeddings for YaRN; the
# 8,192 above it is room left for the prompt.
_TRAINED = {40_960: 32_768}


_PLAIN_ROPE = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


def own_rope_scaling(rope: object) -> bool:
    """Whether config.json's rope_scaling / rope_parameters scales RoPE itself (Llama 3.1's llama3, gpt-oss's
    yarn, Qwen3.5's mrope sections, Gemma's per-layer-type parameters): a YaRN override would replace it, so
    none is offered. A rope_type `default` with only its theta is no scaling."""
    if not isinstance(rope, Mapping) or not rope:
        return False
    if all(isinstance(v, Mapping) for v in rope.values()):  # per layer type (Gemma): any of them scales
        return any(own_rope_scaling(v) for v in rope.values())
    kind = rope.get("rope_type", rope.get("type"))
    return (kind not in (None, "default")) or any(k not in _PLAIN_ROPE for k in rope)


def trained_length(own: int) -> int:
    """The length the model was trained at, which YaRN's original_max_position_embeddings names."""
    return _TRAINED.get(own, own)


def yarn_override(own: int, context: int, trained: int | None = None) -> str | None:
    """The --json-model-override-args that lets SGLang derive `context` by scaling RoPE with YaRN, or None
    when the model's own context already holds it.

    utils/hf_transformers/common.py get_context_length counts the factor as 1 when the override names
    original_max_position_embeddings, so the length key is raised with it: the model is then scaled, not run
    past its trained length. The factor is the next whole multiple of the trained length: `trained` where
    the model's own context is itself an override (a YaRN or a longer max_position_embeddings already set),
    else trained_length(own).
    """
    if context <= own:
        return None
    trained = trained or trained_length(own)
    factor = math.ceil(context / trained)
    rope = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": trained}
    return json.dumps({"rope_scaling": rope, "max_position_embeddings": trained * factor})


def yarn_hint(yarn: str) -> str:
    """The override as deployctl takes it (plan, apply, render: --set), quoted for a POSIX shell."""
    return f"--set json-model-override-args={shlex.quote(yarn)}"


def refusal(own: int, context: int, scalable: bool = True, trained: int | None = None) -> str:
    """SGLang's refusal of `context`, with the ways past it and what each risks. `scalable`: a YaRN override
    is named (not for MLA models, which ship their own YaRN rope_scaling: another would replace it), scaled
    from `trained` (yarn_override)."""
    yarn = yarn_override(own, context, trained) if scalable else None
    scale = f"; or scale RoPE with YaRN: {yarn_hint(yarn)}" if yarn else ""
    return (
        f"SGLang refuses a context of {context:,} above the model's own {own:,} unless {ALLOW_LONGER}=1 is "
        "set (apply --allow-longer-context sets it: the model then runs past its trained length, unscaled)"
        + scale
    )
