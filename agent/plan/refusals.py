"""Why SGLang would not start the planned unit at all, whatever the pool: each a one-line reason.

A plan SGLang refuses is not feasible, however well its pool fits: the headline says so and names why.
"""

from __future__ import annotations

from agent.inventory import HostConfig
from agent.plan.model import Flags, PoolModel, flag, version
from agent.sglang import long_context, version_flags

_ALLOW_LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def refusals(host: HostConfig, context: int, model: PoolModel) -> list[str]:
    """The reasons SGLang (or the host) would refuse the unit rendered from `host` at `context`."""
    flags: Flags = host.sglang.flags
    found = [*_context(host, context), *version_flags.refused(host.sglang.version, flags)]
    tp = int(str(flag(flags, "tp-size", "tensor-parallel-size") or host.gpus.count))
    pp = int(str(flag(flags, "pp-size", "pipeline-parallel-size") or 1))
    if tp * pp > host.gpus.count:
        # server_args.py compute_world_size: every rank is a GPU of this host (one node)
        needs = f"tensor parallel {tp} × pipeline parallel {pp} needs {tp * pp} GPUs"
        found.append(f"{needs}; the service has {host.gpus.count} ([gpus])")
    if model.post_gib <= 0:
        weights = model.pre_gib - model.post_gib
        found.append(
            f"the weights do not fit: about {weights:.1f} GiB per GPU against {model.pre_gib:.1f} GiB free "
            "before they load"
        )
    return found


def _context(host: HostConfig, context: int) -> list[str]:
    """configs/model_config.py _derive_context_length (0.5.3 and newer): a context above the model's own
    is a ValueError unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set."""
    limit = host.model.max_context
    allowed = host.unit.environment.get(_ALLOW_LONGER, "").lower() in ("1", "true", "yes")
    if limit is None or context <= limit or allowed or version(host) < (0, 5, 3, 0):
        return []
    return [long_context.refusal(limit, context, scalable=host.model.attention != "mla")]
