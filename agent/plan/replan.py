"""Each alternative of a plan re-planned with its flags: what it claims is what the planner then says.

The alternatives are first estimated on the plan's own pool model (plan/alternatives.py: a cell ratio, half
the weights per GPU); the one planner (plan/from_facts.py) then plans the input with each one's flags, so
"reaches the target" on an alternative means the re-plan is feasible by the same rule (plan/verdict.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from agent.errors import UsageError
from agent.plan.alternatives import Alternative, Best, outcome, short_of, smaller_context_change
from agent.plan.choose import Plan, Target
from agent.plan.facts import PlanInput

Planner = Callable[[PlanInput, Target], Plan]


def replanned(inp: PlanInput, plan: Plan, asked: Target, planner: Planner) -> Plan:
    """The plan with every alternative re-planned; one the planner refuses with its flags is dropped."""
    kept: list[Alternative] = []
    for alt in plan.alternatives:
        try:
            again = planner(*_with(inp, alt, asked))
        except UsageError:
            continue
        if "context-length" in alt.flags and not again.feasible:
            continue  # a smaller context is offered only where it plans feasible
        if "context-length" in alt.flags:
            alt, again = _largest_context(inp, alt, again, asked, planner)
        if "context-length" not in alt.flags and not _closes_half(again, plan):
            continue
        kept.append(_held(_as_replanned(alt, again, asked, _cap_of(inp)), again))
    return replace(plan, alternatives=tuple(kept))


def _largest_context(
    inp: PlanInput, alt: Alternative, fits: Plan, asked: Target, planner: Planner
) -> tuple[Alternative, Plan]:
    """The smaller context raised to (within 1% of) the largest the planner itself plans feasible: the
    estimate (plan/alternatives.py) holds the pool at the target's highest safe fraction, while a smaller
    context also shrinks the req_to_token table and lets the plan lower the request cap, so more fits. A
    first probe one step up settles the usual case, else a bisection up to the target (which does not fit)."""
    low, high = fits.context_length, asked.context
    found = (alt, fits)
    probe = low + max(1000, low // 100)
    while low < probe < high:
        tried = _tried(inp, alt, asked, planner, probe)
        if tried is None:
            high = probe
        else:
            low, found = probe, tried
        probe = (low + high) // 2 // 1000 * 1000 if high - low > max(1000, low // 100) else low
    return found


def _tried(
    inp: PlanInput, alt: Alternative, asked: Target, planner: Planner, context: int
) -> tuple[Alternative, Plan] | None:
    """The smaller-context alternative at this context and its plan, where it plans feasible."""
    at = replace(alt, change=smaller_context_change(context), flags={**alt.flags, "context-length": context})
    try:
        again = planner(*_with(inp, at, asked))
    except UsageError:
        return None
    return (at, again) if again.feasible else None


def _closes_half(again: Plan, plan: Plan) -> bool:
    """An alternative worth a line: re-planned, it reaches the target, or its pool's low end closes at least
    half of the gap the plan leaves to the target's pool (docs/planning.md). A change that frees 50 MB, or
    one a --max-total-tokens cap makes moot, closes none of it and is not offered."""
    if again.feasible and again.context_length == plan.context_length:
        return True
    have = plan.predicted_pool_low_tokens
    return again.predicted_pool_low_tokens - have >= (plan.target_pool_tokens - have) / 2


def _with(inp: PlanInput, alt: Alternative, asked: Target) -> tuple[PlanInput, Target]:
    """The input and target an alternative asks for; the planner chooses the fraction again."""
    flags = {k: v for k, v in alt.flags.items() if k not in ("mem-fraction-static", "max-running-requests")}
    context = int(str(alt.flags.get("context-length", asked.context)))
    requests = alt.flags.get("max-running-requests", asked.max_running)  # the cap asked stays, but its own
    # given as `plan --set FLAG=VALUE` gives them (apply.asked_of): the running fraction, SGLang's default
    # for the flags the unit runs now, is then kept where it reaches the target (plan/from_facts.py)
    given = tuple((k, v) for k, v in flags.items() if k != "context-length")
    target = Target(context, None, None if requests is None else int(str(requests)), given)
    if "tp-size" in flags:  # more GPUs: as many more cards of the same kind
        more = int(str(flags["tp-size"])) // max(1, int(str(inp.flags.get("tp-size") or 1)))
        inp = replace(inp, gpus=inp.gpus * more, starts=(), start_ids=())
    # The starts ran under the flags the plan took them to (its own, where none are recorded): an
    # alternative's cell flags scale their measured cell (plan/evidence.py as_started).
    then = inp.start_flags if inp.start_flags is not None else dict(inp.flags)
    return replace(inp, flags={**inp.flags, **flags}, start_flags=then), target


def _held(alt: Alternative, again: Plan) -> Alternative:
    """An alternative whose re-plan holds the target's pool within the floor, and that only SGLang's refusal
    (a context above the model's own, plan/refusals.py) keeps from starting, says the pool holds: "still
    short" would send the reader after memory that is not missing (docs/planning.md)."""
    pool_held = again.predicted_pool_low_tokens >= again.target_pool_tokens
    if (
        again.feasible
        or not again.refusals
        or not pool_held
        or again.reserve_gib_per_gpu < again.reserve_floor_gib
    ):
        return alt
    held = "holds the target's pool, but SGLang refuses to start it"
    return replace(alt, effect=alt.effect.replace(f"({short_of('the target')})", f"({held})", 1))


def _cap_of(inp: PlanInput) -> int | None:
    given = inp.flags.get("max-running-requests")
    return None if given is None else int(str(given))


def _as_replanned(alt: Alternative, again: Plan, asked: Target, cap: int | None) -> Alternative:
    """The alternative as re-planned: its fraction, and the request cap the re-plan set where it is not
    the input's own (the fraction holds the memory floor only under it: SGLang would resolve its own,
    mem_cache/kv_cache_configurator.py resolve_max_num_reqs)."""
    what = "the target" if again.context_length == asked.context else f"{again.context_length:,}"
    best = Best(again.mem_fraction_static, again.predicted_pool_tokens, again.predicted_pool_low_tokens,
                again.feasible)  # fmt: skip
    flags = {**alt.flags, "mem-fraction-static": again.mem_fraction_static}
    capped = (
        again.requests_set and again.max_running_requests != cap and "max-running-requests" not in alt.flags
    )
    if capped:
        flags["max-running-requests"] = again.max_running_requests
    return replace(
        alt,
        flags=flags,
        mem_fraction_static=again.mem_fraction_static,
        predicted_pool_tokens=again.predicted_pool_tokens,
        predicted_pool_low_tokens=again.predicted_pool_low_tokens,
        reaches_target=again.feasible and what == "the target",
        # SGLang's refusal is the one binding constraint the numbers beside it do not show: say it.
        effect=outcome(best, what)
        + (f", with --max-running-requests {again.max_running_requests:,}" if capped else "")
        + (f": {again.refusals[0]}" if again.refusals else ""),
    )
