"""When a target does not fit: what would, each with its predicted pool."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from agent.inventory import FlagValue, HostConfig
from agent.plan.model import Flags, PoolModel, architecture_cell, flag, parallelism, version
from agent.plan.refusals import head_refusals
from agent.plan.verdict import Reading, capped, decide
from agent.sglang import kvpool


@dataclass(frozen=True)
class Alternative:
    """One change that would help, and what it is predicted to give."""

    change: str
    flags: dict[str, FlagValue]
    mem_fraction_static: float | None
    predicted_pool_tokens: int
    predicted_pool_low_tokens: int  # the low end the verdict compares (plan/verdict.py)
    reaches_target: bool
    effect: str

    def to_dict(self) -> dict[str, object]:  # the JSON object `plan --json` prints
        return {**asdict(self), "args": self.args()}

    def args(self) -> list[str]:
        """The arguments that re-plan it, added to the command that offered it: a flag with its own option
        by that option (the last given wins; `--set context-length` is refused for --context, cli/options.py
        change_of), every other flag as --set FLAG=VALUE."""
        said: list[str] = []
        for name, value in self.flags.items():
            option = OPTIONS.get(name)
            said += [option, str(value)] if option else ["--set", f"{name}={_set_value(value)}"]
        return said


# The flags `plan`, `render` and `apply` take as options of their own (cli/options.py OPTION_FLAGS).
OPTIONS = {
    "context-length": "--context",
    "mem-fraction-static": "--mem-fraction-static",
    "max-running-requests": "--max-running-requests",
}


def _set_value(value: FlagValue) -> str:
    """A value as --set takes it: true/false for a bare flag (cli/options.py parse_set)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Need:
    """What a plan must reach: the target context, the pool that holds it with the margin (goal), and the
    memory each GPU keeps free (floor, GiB)."""

    target: int
    goal: int
    floor: float


@dataclass(frozen=True)
class Best:
    """An alternative's fraction, its pool (prediction and low end) and the verdict there."""

    fraction: float | None
    pool: int
    pool_low: int
    reaches: bool


def best_fraction(model: PoolModel, goal: int, requests: int, context: int, floor: float) -> Best:
    """The smallest fraction reaching the goal within the floor, else the highest safe, decided by the
    plan's own rule (plan/verdict.py)."""
    top = model.max_fraction(requests, context, floor)
    low = model.min_fraction(goal)
    fraction = low if low is not None and top is not None and low <= top else top
    if fraction is None:
        return Best(None, 0, 0, False)
    pool, pool_low = model.pool(fraction), model.pool_low(fraction)
    reserve, cap = (
        model.reserve_gib(fraction, requests, context),
        capped(model.max_total_tokens, model.page_size, pool_low),
    )
    reading = Reading(fraction, pool_low, pool, reserve, goal, floor, cap=cap)
    return Best(fraction, pool, pool_low, decide(reading).feasible)


def alternatives(
    host: HostConfig, flags: Flags, model: PoolModel, need: Need, requests: int
) -> tuple[Alternative, ...]:
    """fp8 KV, a smaller context, fewer requests, more GPUs: each predicted on this host's model."""
    found = [
        _fp8(host, flags, model, need, requests),
        _smaller_context(host, model, need, requests),
        _fewer_requests(model, need, requests),
        _more_gpus(host, flags, model, need, requests),
    ]
    return tuple(a for a in found if a is not None)


def outcome(best: Best, what: str = "the target") -> str:
    if best.fraction is None:
        return "no fraction keeps the memory floor"
    verdict = f"reaches {what}" if best.reaches else short_of(what)
    held = f"about {best.pool:,} tokens" + (
        f", at least {best.pool_low:,}" if best.pool_low != best.pool else ""
    )
    return f"at --mem-fraction-static {best.fraction:.3f} the pool is {held} ({verdict})"


def short_of(what: str) -> str:
    """An alternative's verdict where its pool or its floor falls short (plan/replan.py words it otherwise
    where only SGLang's refusal stands in the way)."""
    return f"still short of {what}"


def _made(change: str, flags: dict[str, FlagValue], best: Best, what: str = "the target") -> Alternative:
    """The alternative with its fraction in its flags and its outcome in words."""
    return Alternative(
        change=change,
        flags={**flags, **({"mem-fraction-static": best.fraction} if best.fraction else {})},
        mem_fraction_static=best.fraction,
        predicted_pool_tokens=best.pool,
        predicted_pool_low_tokens=best.pool_low,
        reaches_target=best.reaches and what == "the target",
        effect=outcome(best, what),
    )


def _rescaled(
    model: PoolModel, host: HostConfig, flags: Flags, new_flags: Flags, fallback: float
) -> PoolModel:
    """The model with the cell changed as the architecture says it would be (else by a fallback ratio)."""
    old, _ = architecture_cell(host, flags)
    new, _ = architecture_cell(host, new_flags)
    ratio = new / old if old and new else fallback
    return model.scaled_cell(ratio)


def _fp8(host: HostConfig, flags: Flags, model: PoolModel, need: Need, requests: int) -> Alternative | None:
    dtype = str(flag(flags, "kv-cache-dtype") or "auto")
    if kvpool.kv_elem_bytes(dtype, host.model.dtype_bytes) <= 1:
        return None
    fp8 = _rescaled(model, host, flags, {**flags, "kv-cache-dtype": "fp8_e4m3"}, 0.5)
    return _made(
        "fp8 KV cache (--kv-cache-dtype fp8_e4m3): about half the bytes per token, so the pool "
        f"roughly doubles; support for fp8 {'MLA ' * (host.model.attention == 'mla')}KV depends on the "
        "attention backend and GPU",
        {"kv-cache-dtype": "fp8_e4m3"},
        best_fraction(fp8, need.goal, requests, need.target, need.floor),
    )


def _smaller_context(host: HostConfig, model: PoolModel, need: Need, requests: int) -> Alternative | None:
    floor = need.floor
    top = model.max_fraction(requests, need.target, floor)
    if top is None:
        return None
    # The low end the verdict compares, not the prediction: the context offered must plan feasible.
    fits = int(model.pool_low(top) / (1 + host.planning.margin)) // 1000 * 1000
    if host.model.max_context is not None:  # above the model's own, SGLang refuses it (plan/refusals.py)
        fits = min(fits, host.model.max_context)
    if fits <= 0:
        return None
    goal = math.ceil(fits * (1 + host.planning.margin))
    return _made(
        smaller_context_change(fits),
        {"context-length": fits},
        best_fraction(model, goal, requests, fits, floor),
        f"{fits:,}",
    )


def smaller_context_change(context: int) -> str:
    """The smaller-context alternative's words (plan/replan.py searches the largest that plans feasible)."""
    return f"a smaller context: {context:,} tokens is the largest that fits with the margin"


def _fewer_requests(model: PoolModel, need: Need, requests: int) -> Alternative | None:
    target = need.target
    if requests <= 1:
        return None
    best = best_fraction(model, need.goal, 1, target, need.floor)
    freed_mb = (model.need_gib(requests, target) - model.need_gib(1, target)) * kvpool.GIB / 1e6
    graphs = (
        "its req_to_token rows and, as credited from the logged CUDA-graph memory, graph memory"
        if model.graph_gib
        else "its req_to_token rows; the CUDA-graph memory it also frees is not measured yet, so not credited"
    )
    return _made(
        f"fewer concurrent requests (--max-running-requests 1 instead of {requests}): frees "
        f"{freed_mb:.0f} MB: {graphs}",
        {"max-running-requests": 1},
        best,
    )


def _more_gpus(
    host: HostConfig, flags: Flags, model: PoolModel, need: Need, requests: int
) -> Alternative | None:
    tp, _ = parallelism(host, flags)
    if head_refusals(model.heads, 2 * tp):  # SGLang would assert at model init: no alternative
        return None
    wider = {**flags, "tp-size": 2 * tp}
    spec = host.draft is not None and version(host) >= (0, 5, 14, 0)
    weights = host.model.weights_gib_per_gpu
    if weights is not None and spec and host.draft is not None:
        weights += host.draft.weights_gib_per_gpu or 0.0
    per_gpu = weights if weights is not None else model.pre_gib - model.post_gib
    # Twice the GPUs halve the weights per GPU; the pre-load free memory per GPU stays the same.
    more = _rescaled(model, host, flags, wider, 1.0)
    more = replace(more, post_gib=model.post_gib + per_gpu / 2)
    best = best_fraction(more, need.goal, requests, need.target, need.floor)
    why = (
        "the MLA pool is replicated on every TP rank, so more GPUs help only through smaller weights per GPU"
        if host.model.attention == "mla"
        else "fewer KV heads per rank and smaller weights per GPU"
    )
    return _made(f"more GPUs (tensor parallel {2 * tp} instead of {tp}): {why}", {"tp-size": 2 * tp}, best)
