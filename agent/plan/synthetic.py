"""The inventory-shaped view of a plan's input (a HostConfig that is never contacted), for the plan's notes,
its alternatives' cell ratios and SGLang's refusals."""

from __future__ import annotations

from pydantic import ValidationError

from agent.errors import UsageError
from agent.inventory import HostConfig
from agent.plan.facts import PlanInput
from agent.sglang.kvlayout import KVLayout, Unsupported, context_length, read_layout, text_config
from agent.sglang.kvpool import GIB
from agent.sglang.long_context import own_rope_scaling, trained_length
from agent.sglang.pools import Parallel

ALLOW_LONGER_CONTEXT = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def synthetic_host(
    inp: PlanInput, layout: KVLayout, fraction: float, par: Parallel, floor_gib: float
) -> HostConfig:
    """The inventory-shaped view the plan's notes and alternatives read (no SSH: it is never contacted);
    its floor is the one the plan derived or the person stated (plan/floor.py)."""
    data: dict[str, object] = {  # HostConfig's own shape, validated by it below
        "name": inp.name,
        "ssh": {"target": "local"},
        "gpus": {"count": len(inp.gpus), "memory_gib": inp.gpu.memory_gib, "name": inp.gpu.name},
        "model": _model_view(inp, layout, par),
        "draft": _draft_view(inp, par),
        # the one variable that changes what SGLang accepts (plan/refusals.py): a context above the model's
        "unit": {"environment": {k: v for k, v in inp.env.items() if k == ALLOW_LONGER_CONTEXT}},
        "sglang": {"version": inp.sglang_version, "flags": {**inp.flags, "mem-fraction-static": fraction}},
        "planning": {**inp.planning.model_dump(), "reserve_floor_gib": floor_gib},
    }
    try:
        return HostConfig.model_validate(data)
    except ValidationError as exc:  # a figure of the facts beyond the inventory's bounds: one line
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{inp.name}: {where}: {err['msg']}") from None


def _model_view(inp: PlanInput, layout: KVLayout, par: Parallel) -> dict[str, object]:
    """The [model] figures of the layout, for the alternatives' cell ratios and the refusals."""
    model: dict[str, object] = {
        "path": inp.model.path or "/facts/model",
        "dtype_bytes": layout.dtype_bytes,
        "max_context": layout.context_len if inp.model.context_known else None,
        "attention": "mla" if layout.kv_lora_rank else "gqa",
        "rope_scaled": _rope_scaled(inp),
        "trained_context": _trained(inp) if inp.model.context_known else None,
    }
    if layout.family in ("mla", "mha") and not layout.linear:
        model["layers"] = len(layout.kv_layers)
        if layout.kv_lora_rank:
            model.update(kv_lora_rank=layout.kv_lora_rank, qk_rope_head_dim=layout.qk_rope_head_dim)
        else:
            model.update(kv_heads=layout.kv_heads, head_dim=layout.head_dim, v_head_dim=layout.v_head_dim)
    if inp.model.weights_bytes:
        model["weights_gib_per_gpu"] = inp.model.weights_bytes / par.tp / par.pp / GIB
    return model


def _draft_view(inp: PlanInput, par: Parallel) -> dict[str, object] | None:
    """The [draft] of the speculative algorithm, with its figures when its config.json is known."""
    algorithm = str(inp.flags.get("speculative-algorithm") or "").upper()
    if not algorithm:
        return None
    draft: dict[str, object] = {"algorithm": algorithm, "path": "/facts/draft"}
    if inp.draft is None or algorithm == "NGRAM":
        return draft
    try:
        layout = read_layout(inp.draft.config, is_draft=True)
    except (Unsupported, ValueError):  # sizing() already said what it made of the draft
        return draft
    draft.update(layers=layout.layers, kv_heads=layout.kv_heads or None, head_dim=layout.head_dim or None)
    draft["path"] = inp.draft.path or draft["path"]
    if inp.draft.weights_bytes is not None:
        draft["weights_gib_per_gpu"] = inp.draft.weights_bytes / par.tp / GIB
    return draft


def _trained(inp: PlanInput) -> int:
    """The length the model was trained at: config.json's own as shipped, before any
    --json-model-override-args (utils/hf_transformers/config.py get_config applies the override; a YaRN
    override already there, or a longer max_position_embeddings, is no new trained length)."""
    return trained_length(context_length(text_config(inp.model.config)))


def _rope_scaled(inp: PlanInput) -> bool:
    """config.json (or its text config) scales RoPE itself: no YaRN hint over it (sglang/long_context.py)."""
    cfg = inp.model.config
    for c in (cfg, cfg.sub("text_config")):
        if c is not None and any(own_rope_scaling(c.value(k)) for k in ("rope_scaling", "rope_parameters")):
            return True
    return False
