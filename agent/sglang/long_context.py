"""A context above the model's own: what SGLang 0.5.23 allows, and the YaRN override that reaches it.

Stdlib only. configs/model_config.py _derive_context_length refuses a --context-length above the one
derived from config.json unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set; that runs the model past
its trained length without scaling. Scaling RoPE with YaRN through --json-model-override-args raises the
derived length itself.
"""

from __future__ import annotations

import json
import math

ALLOW_LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def yarn_override(own: int, context: int) -> str | None:
    """The --json-model-override-args that lets SGLang derive `context` by scaling RoPE with YaRN, or None
    when the model's own context already holds it.

    utils/hf_transformers/common.py get_context_length counts the factor as 1 when the override names
    original_max_position_embeddings, so the length key is raised with it: the model is then scaled, not run
    past its trained length. The factor is the next whole multiple of the model's own context.
    """
    if context <= own:
        return None
    factor = math.ceil(context / own)
    rope = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": own}
    return json.dumps({"rope_scaling": rope, "max_position_embeddings": own * factor})


def refusal(own: int, context: int, scalable: bool = True) -> str:
    """SGLang's refusal of `context`, with the ways past it and what each risks. `scalable`: a YaRN override
    is named (not for MLA models, which ship their own YaRN rope_scaling: another would replace it)."""
    yarn = yarn_override(own, context) if scalable else None
    scale = f"; or scale RoPE with YaRN: --json-model-override-args '{yarn}'" if yarn else ""
    return (
        f"SGLang refuses a context of {context:,} above the model's own {own:,} unless {ALLOW_LONGER}=1 is "
        "set (apply --allow-longer-context sets it: the model then runs past its trained length, unscaled)"
        + scale
    )
