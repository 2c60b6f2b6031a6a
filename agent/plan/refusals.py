"""Why SGLang would not start the planned unit at all, whatever the pool: each a one-line reason.

A plan SGLang refuses is not feasible, however well its pool fits: the headline says so and names why.
"""

from __future__ import annotations

from agent.inventory import HostConfig
from agent.plan.effective import world
from agent.plan.model import Flags, PoolModel, flag, version
from agent.sglang import long_context, version_flags

_ALLOW_LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def refusals(host: HostConfig, context: int, model: PoolModel) -> list[str]:
    """The reasons SGLang (or the host) would refuse the unit rendered from `host` at `context`.

    Weights that cannot load come before the context: no context or YaRN override makes them fit, so the
    first reason (the verdict's `because`) is the one to fix first."""
    flags: Flags = host.sglang.flags
    found = [*version_flags.refused(host.sglang.version, flags)]
    found += _layout(flags, host.gpus.count) or head_refusals(model.heads, world(flags)[0])
    found += model.refused
    if model.post_gib <= 0:
        weights = model.pre_gib - model.post_gib
        found.append(
            f"the weights do not fit: about {weights:.1f} GiB per GPU against {model.pre_gib:.1f} GiB free "
            "before they load"
        )
    return [*found, *longer_context(host, context)]


def longer_context(host: HostConfig, context: int) -> list[str]:
    """configs/model_config.py _derive_context_length (0.5.3 and newer): a context above the model's own
    is a ValueError unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set."""
    limit = host.model.max_context
    allowed = host.unit.environment.get(_ALLOW_LONGER, "").lower() in ("1", "true", "yes")
    if limit is None or context <= limit or allowed or version(host) < (0, 5, 3, 0):
        return []
    return [long_context.refusal(limit, context, yarn_allowed(host), host.model.trained_context)]


def yarn_allowed(host: HostConfig) -> bool:
    """A YaRN override may be offered: not over an MLA model's own YaRN, nor any model's own RoPE scaling."""
    return host.model.attention != "mla" and not host.model.rope_scaled


def _layout(flags: Flags, gpus: int) -> list[str]:
    """SGLang 0.5.23's layout checks. server_args.py compute_world_size: dp x tp x pp GPUs, every rank a GPU
    of this host (one node); attention DP runs inside the TP group and adds none. arg_groups/parallel_hook.py:
    the deprecated --enable-dp-attention turns --dp-size into --attn-dp-size; TP must divide by it (l. 326),
    and replicas with attention DP are refused (l. 287)."""
    tp, pp = world(flags)
    dp = int(str(flag(flags, "dp-size", "dp", "data-parallel-size") or 1))
    attn_dp = int(str(flag(flags, "attn-dp-size") or 1))
    if flag(flags, "enable-dp-attention") not in (None, False, "false") and attn_dp == 1:
        attn_dp, dp = dp, 1
    if attn_dp > 1 and dp > 1:
        return [f"--dp-size {dp} with --attn-dp-size {attn_dp}: SGLang refuses replicas with attention DP"]
    if tp % attn_dp:
        return [f"tensor parallel {tp} is not a multiple of attention DP {attn_dp}: SGLang asserts it"]
    if dp * tp * pp > gpus:
        parts = ([f"{dp} data-parallel replicas"] if dp > 1 else []) + [f"tensor parallel {tp}"]
        if pp > 1 or dp == 1:
            parts.append(f"pipeline parallel {pp}")
        return [f"{' × '.join(parts)} needs {dp * tp * pp} GPUs; the service has {gpus} ([gpus])"]
    return []


def head_refusals(heads: tuple[int, int], tp: int) -> list[str]:
    """models/llama.py:183-193 (qwen2.py:167 and the others alike): TP must divide the attention heads, and
    the KV heads must divide by TP, or (fewer KV heads than TP: replicated) divide TP; SGLang asserts."""
    q, kv = heads
    if q and q % tp:
        return [f"tensor parallel {tp} does not divide the {q} attention heads: SGLang asserts at model init"]
    if kv and (kv % tp if kv >= tp else tp % kv):
        return [f"tensor parallel {tp} and the {kv} KV heads do not divide: SGLang asserts at model init"]
    return []
