"""The inventory as a PlanInput: the value a facts file becomes, so one planner plans both.

An inventory entry names its architecture with a few figures (layers, KV heads and head size, or the MLA
ranks) instead of a config.json; they are written here as the config.json SGLang would read for them, the
weights per GPU as the checkpoint's bytes, the cards as the GPUs nvidia-smi would list.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.errors import UsageError
from agent.inventory import FlagValue, HostConfig
from agent.plan.effective import world
from agent.plan.facts import Gpu, ModelInput, PlanInput
from agent.plan.model import StartFigures
from agent.plan.unitlimit import verbatim_memory_limit
from agent.sglang.config_json import ModelConfig

GIB = 2**30
_DTYPES = {1: "bfloat16", 2: "bfloat16", 4: "float32"}  # 1 byte: an FP8 KV cache the checkpoint declares
_STAND_IN = 1  # a missing figure, where an earlier start's measured bytes per token replace the cell


def inventory_config(host: HostConfig) -> tuple[ModelConfig, tuple[str, ...]]:
    """The inventory's [model] figures as a config.json, and the figures it lacks (stood in for by 1)."""
    m = host.model
    need = (
        ("layers", "kv_lora_rank", "qk_rope_head_dim")
        if m.attention == "mla"
        else ("layers", "kv_heads", "head_dim")
    )
    missing = tuple(f"model.{k}" for k in ("attention", *need) if getattr(m, k) is None)
    if m.dtype_bytes not in _DTYPES:
        raise UsageError(f"model.dtype_bytes {m.dtype_bytes}: a KV element is 1, 2 or 4 bytes")
    layers = m.layers or _STAND_IN
    config: dict[str, object] = {"num_hidden_layers": layers, "torch_dtype": _DTYPES[m.dtype_bytes]}
    if m.attention == "mla":
        rank, rope = m.kv_lora_rank or _STAND_IN, m.qk_rope_head_dim or _STAND_IN
        config.update(architectures=["DeepseekV3ForCausalLM"], num_attention_heads=1, num_key_value_heads=1,
                      kv_lora_rank=rank, qk_rope_head_dim=rope)  # fmt: skip
    else:
        heads, dim = m.kv_heads or _STAND_IN, m.head_dim or _STAND_IN
        config.update(architectures=["InventoryModel"], num_attention_heads=heads, num_key_value_heads=heads,
                      head_dim=dim, v_head_dim=m.v_head_dim or dim)  # fmt: skip
    if m.max_context is not None:
        config["max_position_embeddings"] = m.max_context
    if m.dtype_bytes == 1:
        config["quantization_config"] = {"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}
    return ModelConfig(config, "the inventory's model"), missing


def _draft_model(host: HostConfig, tp: int) -> ModelInput | None:
    """The inventory's draft as a config.json of its KV shape and its bytes, or None."""
    d = host.draft
    if d is None or d.layers is None or d.algorithm == "NGRAM":
        return None
    heads = d.kv_heads or 1
    config: dict[str, object] = {
        "architectures": ["InventoryDraft"],
        "num_hidden_layers": d.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": d.head_dim or 128,
    }
    weights = None if d.weights_gib_per_gpu is None else round(d.weights_gib_per_gpu * GIB * tp)
    return ModelInput(ModelConfig(config, "the inventory's draft"), weights, d.path)


def inventory_draft(host: HostConfig, tp: int) -> dict[str, object] | None:
    """The inventory's draft as a facts `draft` entry (a config.json of its KV shape), or None."""
    draft = _draft_model(host, tp)
    if draft is None:
        return None
    config = dict(draft.config.data)
    return {"config": config, "weights_bytes": draft.weights_bytes, "path": draft.path, "source": "inventory"}


def _draft_gaps(host: HostConfig) -> tuple[str, ...]:
    """The draft figures the pool needs: the layers, and for DFLASH's own K and V the heads too."""
    d = host.draft
    if d is None or d.algorithm == "NGRAM":
        return ()
    need = ["layers", "kv_heads", "head_dim"] if d.algorithm in ("DFLASH", "DSPARK") else ["layers"]
    if d.weights_gib_per_gpu is None:
        need.append("weights_gib_per_gpu")
    return tuple(f"draft.{k}" for k in need if getattr(d, k) is None)


def _draft_input(host: HostConfig, tp: int) -> ModelInput | None:
    """The draft for the planner; without its layers one stands in, and the gap is named (_draft_gaps)."""
    d = host.draft
    if d is not None and d.layers is None and d.algorithm != "NGRAM":
        host = host.model_copy(update={"draft": d.model_copy(update={"layers": _STAND_IN})})
    return _draft_model(host, tp)


def plan_input_from_inventory(
    host: HostConfig, running: Mapping[str, FlagValue], starts: tuple[StartFigures, ...] = ()
) -> PlanInput:
    """The host as its inventory describes it, with the running unit's flags over the baseline and the
    earlier starts that calibrate it."""
    flags = sized_flags(host, running)
    tp, pp = world(flags)  # as SGLang reads it (plan/effective.py)
    config, missing = inventory_config(host)
    weights = host.model.weights_gib_per_gpu
    gaps = (*missing, *(() if weights is not None else ("model.weights_gib_per_gpu",)), *_draft_gaps(host))
    device = flags.get("device")
    return PlanInput(
        name=host.name or "the host",
        gpus=tuple(Gpu(host.gpus.name, host.gpus.memory_gib * 1024) for _ in range(host.gpus.count)),
        sglang_version=host.sglang.version,
        model=ModelInput(
            config,
            None if weights is None else round(weights * GIB * tp * pp),
            host.model.path,
            context_known=host.model.max_context is not None,
        ),
        draft=_draft_input(host, tp),
        flags=flags,
        env=dict(host.unit.environment),
        starts=starts,
        start_flags=ran_under(host, running, flags),
        sources=_sources(host, running),
        device=None if device is None else str(device).lower(),
        planning=host.planning,
        gaps=gaps,
        weight_cache=host.weight_cache.enabled,
        unit_memory_limit=verbatim_memory_limit(
            host.unit.template, host.unit.verbatim.get("Service", [])
        ),  # applied with no facts too
    )


def sized_flags(host: HostConfig, running: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """The flags a plan sizes: the ones the unit will be rendered with (plan/effective.py), the inventory's
    with --set over them, and the running unit's fraction (evidence of the pool it serves now; the plan
    sets its own). The running unit's other flags are what its starts ran under (ran_under), not the plan."""
    flags: dict[str, FlagValue] = dict(host.sglang.flags)
    fraction = running.get("mem-fraction-static")
    if fraction is not None:
        flags["mem-fraction-static"] = fraction
    if host.draft is not None:  # the unit renders the draft's algorithm (render.py); the pool depends on it
        flags.setdefault("speculative-algorithm", host.draft.algorithm)
    return flags


def ran_under(
    host: HostConfig, running: Mapping[str, FlagValue], sized: Mapping[str, FlagValue]
) -> dict[str, FlagValue] | None:
    """What the running unit's starts ran under, where it differs from what the plan sizes (a flag set by
    hand on the host, a --set not yet in the inventory): its cell is scaled (plan/evidence.py as_started)."""
    if not running:  # nothing read of the running unit: its starts stand for the plan's flags
        return None
    then = dict(running)  # the installed unit's flags, as the host read them
    if host.draft is not None:
        then.setdefault("speculative-algorithm", host.draft.algorithm)
    return then if then != dict(sized) else None


def _sources(host: HostConfig, running: Mapping[str, FlagValue]) -> dict[str, str]:
    """Where each figure came from, for the plan's notes."""
    m = host.model
    figures = (
        "layers, kv_lora_rank, qk_rope_head_dim" if m.attention == "mla" else "layers, kv_heads, head_dim"
    )
    under = (
        ""
        if dict(running) == dict(host.sglang.flags)
        else " (the running unit's fraction; its starts ran under its own)"
    )
    return {
        "gpus": f"inventory: gpus ({host.gpus.count} x {host.gpus.name})",
        "architecture": f"inventory: model ({m.attention}: {figures})",
        "weights": "inventory: model.weights_gib_per_gpu" if m.weights_gib_per_gpu is not None else "absent",
        "flags": f"inventory: sglang.flags{under}",
    }


def plan_input_from_host(
    host: HostConfig, facts: PlanInput, starts: tuple[StartFigures, ...] = ()
) -> PlanInput:
    """What the host reported (its facts), with the inventory's figures as overrides."""
    sources = dict(facts.sources)
    gpus = facts.gpus
    if not gpus:  # nvidia-smi said nothing: the inventory's cards
        gpus = tuple(Gpu(host.gpus.name, host.gpus.memory_gib * 1024) for _ in range(host.gpus.count))
        sources["gpus"] = "inventory: gpus"
    running = facts.start_flags if facts.start_flags is not None else facts.flags
    flags = sized_flags(host, facts.flags)  # what the unit will be rendered with
    tp, pp = world(flags)  # as SGLang reads it (plan/effective.py)
    model = facts.model
    if host.model.weights_gib_per_gpu is not None:
        model = ModelInput(model.config, round(host.model.weights_gib_per_gpu * GIB * tp * pp), model.path)
        sources["weights"] = "inventory: model.weights_gib_per_gpu (overrides the host's)"
    draft = facts.draft
    stand_in = _draft_input(host, tp)
    if stand_in is not None and (draft is None or (host.draft is not None and host.draft.kv_heads)):
        # The inventory's draft figures stand in for (or override) the draft config.json.
        draft = stand_in
        sources["draft"] = "inventory: draft (layers, kv_heads, head_dim, weights_gib_per_gpu)"
    return PlanInput(
        name=host.name or facts.name,
        gpus=gpus,
        sglang_version=host.sglang.version or facts.sglang_version,
        model=model,
        draft=draft,
        flags=flags,
        env={**facts.env, **host.unit.environment},
        starts=starts or facts.starts,
        start_ids=() if starts else facts.start_ids,
        start_flags=ran_under(host, running, flags),
        sources=sources,
        device=facts.device,
        planning=host.planning,
        weight_cache=host.weight_cache.enabled,
        unit_memory_limit=verbatim_memory_limit(host.unit.template, host.unit.verbatim.get("Service", [])),
    )
