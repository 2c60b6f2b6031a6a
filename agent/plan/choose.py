"""The plan: the flags that give a target context on a host, with the predicted pool and the tradeoffs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from agent.inventory import FlagValue, HostConfig
from agent.plan.alternatives import Alternative, Need, alternatives
from agent.plan.failed import bounded, failed_starts
from agent.plan.hostplan import HostPlan
from agent.plan.model import SPEC_DEFAULT_REQUESTS, Flags, PoolModel, StartFigures, flag, version
from agent.plan.refusals import refusals
from agent.plan.requests import sglang_requests
from agent.plan.verdict import Reading, capped, decide, no_fraction
from agent.sglang import kvpool
from agent.sglang.flagrules import TABLE_VERSION
from agent.sglang.flags import FlagInput
from agent.sglang.redact import REDACTED, SECRET_FLAG
from agent.sglang.server_args import typed

PLAIN_DEFAULT_REQUESTS = 64


@dataclass(frozen=True)
class Target:
    """What a plan is asked for: a context, and what a person fixed instead of the planner (None: chosen)."""

    context: int
    fraction: float | None = None  # --mem-fraction-static
    max_running: int | None = None  # --max-running-requests
    given: tuple[tuple[str, FlagInput], ...] = ()  # the other --set flags: sized, then printed and rendered


@dataclass(frozen=True)
class Plan:
    """What to run with and what it will give; flags() are the SGLang flag changes."""

    mem_fraction_static: float
    max_running_requests: int
    context_length: int
    predicted_pool_tokens: int
    target_pool_tokens: int  # the context plus the planning margin
    predicted_pool_low_tokens: int  # the low end of the prediction's interval: what the verdict compares
    concurrency_at_full_context: int
    reserve_gib_per_gpu: float
    reserve_floor_gib: float
    feasible: bool
    basis: str
    pre_gib: float
    post_gib: float
    cell_bytes: float
    tokens_per_0_01: int
    user_fraction: bool = False
    forced_fraction: float | None = None
    forced_pool_tokens: int | None = None
    alternatives: tuple[Alternative, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    refusals: tuple[str, ...] = ()  # why SGLang would not start this unit at all (plan/refusals.py)
    binding: str | None = None  # for a plan that is not feasible: the constraint that binds
    max_total_tokens: int | None = None  # the pool pinned (the CPU backend: free RAM moves between starts)
    evidence: tuple[str, ...] = ()  # what the verdict line says of the evidence besides the basis
    requests_set: bool = True  # False: the unit leaves --max-running-requests to SGLang and memory allows it
    given: tuple[tuple[str, FlagInput], ...] = ()  # the --set flags the pool was sized with (Target.given)
    # The plan's pool is smaller than the running fraction's, which already holds the target: the headline
    # says it (a shrink is never silent).
    shrinks: str | None = None
    host: HostPlan | None = None  # HiCache's host pool and the host's memory budget (plan/hostplan.py)
    # The device plan's own binding where it cannot reach the target before the host's memory is judged:
    # a refusal only --force passes, whatever the host says (apply.prepare)
    device_refusal: str | None = None

    def basis_line(self) -> str:
        """The basis as the verdict line says it, with what changed since the calibrating start."""
        return "; ".join((self.basis, *self.evidence))

    def flags(self) -> dict[str, FlagInput]:
        """Every flag the plan changes: the --set flags it was sized with, then its own choices. What
        `plan --json` prints and `apply` renders over the inventory's baseline (plan/effective.py)."""
        flags: dict[str, FlagInput] = {**dict(self.given), "mem-fraction-static": self.mem_fraction_static}
        if self.requests_set:  # a cap the person did not set only when memory needs it
            flags["max-running-requests"] = self.max_running_requests
        flags["context-length"] = self.context_length
        if self.max_total_tokens is not None:
            flags["max-total-tokens"] = self.max_total_tokens
        if self.host is not None:
            flags.update(self.host.flags())
        return flags

    def printed_flags(self) -> dict[str, FlagInput]:
        """flags() fit to print: a --set api-key (or any secret flag) is rendered, its value never shown."""
        return {
            k: REDACTED if SECRET_FLAG.search(k) and v is not True else v for k, v in self.flags().items()
        }

    def to_dict(self) -> dict[str, object]:  # the JSON object `plan --json` prints
        data = asdict(self)
        data["alternatives"] = [a.to_dict() for a in self.alternatives]
        data["notes"], data["warnings"] = list(self.notes), list(self.warnings)
        data["refusals"] = list(self.refusals)
        if self.evidence:  # what changed since the calibrating start: said only when something did
            data["evidence"] = list(self.evidence)
        else:
            del data["evidence"]
        data["reserve_gib_per_gpu"] = round(self.reserve_gib_per_gpu, 3)
        data["pre_gib"], data["post_gib"] = round(self.pre_gib, 4), round(self.post_gib, 4)
        # whole bytes, one type on every path: a cell scaled or measured from a start is a float inside
        data["cell_bytes"] = round(self.cell_bytes)
        # --set words as the flag table types them (`--set tp-size=4` prints 4, not "4")
        data["flags"] = {k: typed(TABLE_VERSION, k, v) for k, v in self.printed_flags().items()}
        del data["requests_set"], data["given"]  # the flags say them
        if self.shrinks is None:
            del data["shrinks"]  # said only when the plan shrinks a pool that held the target
        del data["host"], data["device_refusal"]  # binding and the host's lines say them
        if self.host is not None:  # host_pool and host_budget
            data.update(self.host.to_dict())
        if self.max_total_tokens is None:
            del data["max_total_tokens"]  # a GPU plan leaves the pool to the fraction
        return data


def choose(  # noqa: PLR0913 - the host, the target, the model, its evidence, and the running pool's model
    host: HostConfig,
    asked: Target,
    model: PoolModel,
    starts: Sequence[StartFigures],
    notes: Sequence[str],
    running_model: PoolModel | None = None,
) -> Plan:
    """The flags for a target on a host whose pool `model` predicts. `host` is the inventory-shaped view of
    the plan's input, its flags the running unit's with the fraction SGLang resolves; earlier starts that
    ran out of memory bound the model. `running_model`: the pool of the flags the unit runs now, where they
    differ from the planned ones (a --set); the shrink headline compares against it."""
    plan = _choose_all(host, asked, model, starts, notes)
    running = _ran_at(host.sglang.flags, starts, model)
    return replace(plan, shrinks=_shrinks(plan, (running_model or model, model), running))


def _choose_all(
    host: HostConfig,
    asked: Target,
    model: PoolModel,
    starts: Sequence[StartFigures],
    notes: Sequence[str],
) -> Plan:
    flags = host.sglang.flags
    spec = _speculative(host, flags)
    if asked.max_running or flag(flags, "max-running-requests") or spec:
        return _choose(host, asked, model, starts, notes, None)
    # Left unset, SGLang sizes the cap (and its req_to_token table) from the pool it gets: resolved at
    # the running fraction, then again at the one chosen (plan/requests.py).
    at = _running_fraction(flags)
    first = _choose(host, asked, model, starts, notes, sglang_requests(model, at, asked.context))
    again = sglang_requests(model, first.mem_fraction_static, asked.context)
    if again == sglang_requests(model, at, asked.context):
        return first
    return _choose(host, asked, model, starts, notes, again)


def _choose(  # noqa: PLR0913 - choose's arguments and the cap SGLang resolves for an unset one
    host: HostConfig,
    asked: Target,
    model: PoolModel,
    starts: Sequence[StartFigures],
    notes: Sequence[str],
    resolved: int | None,
) -> Plan:
    target, fraction, flags = asked.context, asked.fraction, host.sglang.flags
    model, failures = _after_failures(model, starts, flags, target)
    options = [asked.max_running] if asked.max_running else _request_options(host, flags, resolved)
    floor = host.planning.reserve_floor_gib
    if floor is None:  # plan_from_facts fills it: the person's, else derived (plan/floor.py)
        raise ValueError(f"{host.name}: the plan's host view lacks its memory floor")
    need = Need(target, math.ceil(target * (1 + host.planning.margin)), floor)
    chosen: float | None
    if fraction is not None:
        chosen, requests = fraction, _fitting(model, fraction, options, target, need.floor)
    else:
        chosen, requests = _recommend(model, need, options, _as_float(flag(flags, "mem-fraction-static")))
    plan = _sized(host, model, need, (chosen, requests), fraction is not None)
    kept = [*notes, *model.notes]
    if fraction is None:
        kept.extend(
            _kept_note(plan, model.min_fraction(need.goal), _as_float(flag(flags, "mem-fraction-static")))
        )
    plan = _explained(plan, host, flags, model, kept, resolved)
    plan = replace(plan, warnings=(*failures, *plan.warnings))
    if fraction is not None:
        plan = _against_recommendation(plan, model, need, options, flags)
    plan = _bound(plan, host, model, need)
    unset = not asked.max_running and not flag(flags, "max-running-requests")
    plan = replace(plan, requests_set=not unset or plan.max_running_requests < options[0], given=asked.given)
    return plan


def _kept_note(plan: Plan, smallest: float | None, running: float | None) -> list[str]:
    """Why the chosen fraction is above the smallest that reaches the goal: the running one is kept, or
    it is above the highest safe one, which is chosen."""
    if not plan.feasible or smallest is None or smallest >= plan.mem_fraction_static:
        return []
    said = (
        f"the running --mem-fraction-static {running:.3f} is above the highest safe "
        f"{plan.mem_fraction_static:.3f}, which is chosen"
        if running is not None and running > plan.mem_fraction_static
        else f"the running --mem-fraction-static {plan.mem_fraction_static:.3f} already reaches the target "
        "and is kept"
    )
    return [f"{said}: {smallest:.3f} would reach it too, with fewer tokens for concurrent requests"]


def _ran_at(flags: Flags, starts: Sequence[StartFigures], model: PoolModel) -> tuple[float, str] | None:
    """The fraction the unit runs at, and why: the newest calibrating start that came up ran at the
    fraction its server_args line logs (SGLang's own scaling in it: plan/calibrate.py), which a unit started
    by hand or before the inventory changed may not share with the inventory's flag; else the flag."""
    given = _as_float(flag(flags, "mem-fraction-static"))
    ready = [s for s in starts if s.get("ready") and s.get("kv_tokens") and s.get("mem_fraction_static")]
    if model.basis != "calibrated" or not ready:
        return None if given is None else (given, "")
    ran = float(ready[-1].get("mem_fraction_static") or 0.0) / model.fraction_scale
    if given is not None and abs(ran - given) < kvpool.FRACTION_STEP / 2:
        return given, ""
    return ran, "the last start's" + ("" if given is None else f", not the {given:.3f} the flags give")


def _shrinks(
    plan: Plan, models: tuple[PoolModel, PoolModel], running: tuple[float, str] | None
) -> str | None:
    """What the headline says when the plan's pool is smaller than the one the unit runs now (models: the
    running flags' pool, and the planned one) and that one already holds the target; None otherwise. A
    difference within a page is the page size's rounding (kvpool.Paging), not a shrink."""
    if running is None:
        return None
    model, fraction = models[0], running[0]
    before = model.pool(fraction)
    page = max(model.page_size, models[1].page_size)
    if model.pool_low(fraction) < plan.target_pool_tokens or plan.predicted_pool_tokens > before - page:
        return None
    if running[1]:  # the start ran at another fraction than the one planned from
        why = running[1]
    elif plan.given:  # a --set changed what a token costs, or capped the pool
        why = "the flags set change it"
    else:
        why = "above the memory floor's ceiling" if not plan.user_fraction else "the fraction asked is lower"
    return (
        f"SHRINKS the pool from {before:,} tokens (at the fraction it runs now, {fraction:.3f}: {why}) "
        f"to {plan.predicted_pool_tokens:,}"
    )


def _sized(
    host: HostConfig, model: PoolModel, need: Need, choice: tuple[float | None, int], user: bool
) -> Plan:
    """The plan at the chosen fraction and request count; with none, at the highest safe fraction."""
    chosen, requests = choice
    target, goal, floor = need.target, need.goal, need.floor
    forced = None
    if chosen is None:  # the target is out of reach: show what forcing the highest safe fraction gives
        forced = model.max_fraction(requests, target, floor)
        chosen = forced if forced is not None else _running_fraction(host.sglang.flags)
    chosen = round(chosen, 3)
    reading = _reading(model, need, chosen, requests, forced is not None)
    judged = no_fraction(floor, requests) if choice[0] is None and forced is None else decide(reading)
    if user and not judged.feasible:  # what forcing the highest safe fraction would give instead
        forced = model.max_fraction(requests, target, floor)
    return Plan(
        mem_fraction_static=chosen,
        max_running_requests=requests,
        context_length=target,
        predicted_pool_tokens=reading.pool,
        target_pool_tokens=goal,
        predicted_pool_low_tokens=reading.pool_low,
        concurrency_at_full_context=min(reading.pool // target, requests),  # the cap serves no more
        reserve_gib_per_gpu=reading.reserve_gib,
        reserve_floor_gib=floor,
        feasible=judged.feasible,
        basis=model.basis_said(),
        evidence=model.said,
        pre_gib=model.pre_gib,
        post_gib=model.post_gib,
        cell_bytes=model.cell_bytes,
        tokens_per_0_01=model.tokens_per_step(),
        user_fraction=user,
        forced_fraction=forced,
        forced_pool_tokens=None if forced is None else model.pool(forced),
        alternatives=() if judged.feasible else alternatives(host, host.sglang.flags, model, need, requests),
        binding=judged.binding,
    )


def _reading(model: PoolModel, need: Need, fraction: float, requests: int, highest_safe: bool) -> Reading:
    """The numbers the verdict compares at this fraction."""
    return Reading(
        fraction=fraction,
        pool_low=model.pool_low(fraction),
        pool=model.pool(fraction),
        reserve_gib=model.reserve_gib(fraction, requests, need.target),
        goal=need.goal,
        floor_gib=need.floor,
        highest_safe=highest_safe,
        cap=capped(model.max_total_tokens, model.page_size, model.pool_low(fraction)),
    )


def _bound(plan: Plan, host: HostConfig, model: PoolModel, need: Need) -> Plan:
    """The plan with SGLang's refusals folded into its verdict (plan/verdict.py decides)."""
    refused = tuple(refusals(host, plan.context_length, model))
    if not refused:
        return plan
    highest = plan.forced_fraction is not None and not plan.user_fraction
    judged = decide(
        _reading(model, need, plan.mem_fraction_static, plan.max_running_requests, highest), refused
    )
    kept = tuple(a for a in plan.alternatives if _approaches(a, plan, need))
    return replace(
        plan, feasible=judged.feasible, refusals=refused, binding=judged.binding, alternatives=kept
    )


def _approaches(alt: Alternative, plan: Plan, need: Need) -> bool:
    """An alternative worth a line: it reaches the target, or closes at least half of the gap the plan
    leaves (a smaller context always fits by construction: it is the largest that does)."""
    if alt.reaches_target or "context-length" in alt.flags:
        return True
    have = plan.predicted_pool_low_tokens
    return alt.predicted_pool_low_tokens - have >= (need.goal - have) / 2


def _after_failures(
    model: PoolModel, starts: Sequence[StartFigures], flags: Flags, target: int
) -> tuple[PoolModel, list[str]]:
    """The model bounded by the earlier starts that ran out of memory (plan/failed.py), and why."""
    requests = int(str(flag(flags, "max-running-requests") or PLAIN_DEFAULT_REQUESTS))
    return bounded(model, failed_starts(starts, requests, target))


def _request_options(host: HostConfig, flags: Flags, resolved: int | None) -> list[int]:
    """The running --max-running-requests (or SGLang's own for an unset one), then halvings: lowering it
    shrinks graph and activation memory."""
    running = flag(flags, "max-running-requests")
    spec = _speculative(host, flags)
    start = int(running) if running else SPEC_DEFAULT_REQUESTS if spec else resolved or PLAIN_DEFAULT_REQUESTS
    options = [start]
    while options[-1] > 1:
        options.append(options[-1] // 2)
    return options


def _fitting(model: PoolModel, fraction: float, options: list[int], context: int, floor: float) -> int:
    """The largest request count whose reserve keeps the floor at this fraction, else the first option."""
    for requests in options:
        if model.reserve_gib(fraction, requests, context) >= floor:
            return requests
    return options[0]


def _recommend(
    model: PoolModel, need: Need, options: list[int], running: float | None
) -> tuple[float | None, int]:
    """The smallest fraction reaching the goal, with the most requests that keep the floor there.

    A running fraction that already reaches the goal within the floor is kept: a smaller one would
    only shrink the pool, and with it the number of requests served at once.
    """
    context, floor = need.target, need.floor
    fraction = model.min_fraction(need.goal)
    if fraction is None:
        return None, options[0]
    if running is not None and running > fraction:
        keep = _fitting(model, running, options, context, floor)
        if model.reserve_gib(running, keep, context) >= floor:
            return running, keep
        # The running fraction is above the ceiling: the highest safe fraction, not the lowest that
        # reaches the goal (that would give back the pool the unit serves now for nothing).
        for requests in options:
            top = model.max_fraction(requests, context, floor)
            if top is not None and top >= fraction:
                return min(top, running), requests
    requests = _fitting(model, fraction, options, context, floor)
    if model.reserve_gib(fraction, requests, context) < floor:
        return None, requests
    return fraction, requests


def _against_recommendation(
    plan: Plan, model: PoolModel, need: Need, options: list[int], flags: Flags
) -> Plan:
    """A fraction the user chose, compared with the one the planner would choose."""
    running = _as_float(flag(flags, "mem-fraction-static"))
    best, requests = _recommend(model, need, options, running)
    if best is None:
        return replace(plan, notes=(*plan.notes, "no fraction reaches the target within the memory floor"))
    note = (
        f"the planner would choose --mem-fraction-static {best:.3f} with --max-running-requests "
        f"{requests} (pool about {model.pool(best):,} tokens)"
    )
    # Changing the fraction is the whole fix here: the other alternatives would only distract.
    return replace(plan, notes=(*plan.notes, note), alternatives=plan.alternatives if plan.feasible else ())


def _running_fraction(flags: Flags) -> float:
    return _as_float(flag(flags, "mem-fraction-static")) or 0.85


def _as_float(value: FlagValue | None) -> float | None:
    return None if value is None or isinstance(value, bool) else float(value)


def _explained(  # noqa: PLR0913 - the plan, what it was sized from, and SGLang's own cap
    plan: Plan, host: HostConfig, flags: Flags, model: PoolModel, notes: list[str], resolved: int | None
) -> Plan:
    """The plan with its notes and warnings: what each number means and what it costs."""
    t, f = plan.context_length, plan.mem_fraction_static
    notes.append(
        "--context-length alone does not grow the pool: only the memory the pool may take does "
        f"(each 0.01 of --mem-fraction-static buys about {plan.tokens_per_0_01:,} tokens here)"
    )
    head = "NOT FEASIBLE: " if not plan.feasible else ""
    notes.append(
        f"{head}at --mem-fraction-static {f:.3f} the pool is predicted at {plan.predicted_pool_tokens:,} "
        + "tokens"
        + (
            f", at least {plan.predicted_pool_low_tokens:,} (the low end the verdict uses),"
            if plan.predicted_pool_low_tokens != plan.predicted_pool_tokens
            else ""
        )
        + f" for a target of {t:,} (+{host.planning.margin:.0%} margin = {plan.target_pool_tokens:,})"
    )
    fits = min(plan.concurrency_at_full_context, plan.max_running_requests)  # the cap serves no more
    notes.append(f"{fits} request(s) of the full {t:,} tokens fit at once (pool ÷ context)")
    notes.append(_reserve_note(plan, model))
    notes.append(_requests_note(plan, flags, resolved))
    warnings = []
    if host.model.max_context is not None and t > host.model.max_context:
        warnings.append(
            f"{t:,} is above the model's own context length {host.model.max_context:,}: SGLang 0.5.3 and "
            "newer refuse to start unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is set"
        )
    spec = host.draft is not None and host.draft.algorithm != "NGRAM"
    if spec and version(host) < (0, 5, 14, 0):
        warnings.append(
            "before SGLang 0.5.14 the draft's weights, KV and CUDA graphs come out of the slack: a high "
            "fraction risks running out of memory at graph capture rather than a smaller pool"
        )
    return replace(plan, notes=tuple(notes), warnings=tuple(warnings))


def _reserve_note(plan: Plan, model: PoolModel) -> str:
    """How the memory left per GPU is predicted, and how far the fraction may go."""
    limit = model.max_fraction(plan.max_running_requests, plan.context_length, plan.reserve_floor_gib)
    what = (
        "the slack pre × (1 − f) minus what the runtime took at the earlier start (CUDA graphs, "
        "activations) and the req_to_token table"
        if model.runtime_measured
        else "the slack pre × (1 − f) minus the req_to_token table; CUDA graphs are not measured before "
        "the first start, so the floor covers them"
    )
    ceiling = f"do not push the fraction above {limit:.3f}" if limit is not None else "no fraction keeps it"
    return (
        f"memory left per GPU after the pool and graphs: {plan.reserve_gib_per_gpu:.2f} GiB, from {what}; "
        f"the floor is {plan.reserve_floor_gib:.1f} GiB, so {ceiling}"
    )


def _requests_note(plan: Plan, flags: Flags, resolved: int | None) -> str:
    """What --max-running-requests costs: req_to_token, graph memory, short-prompt throughput."""
    requests = plan.max_running_requests
    table_mb = kvpool.req_to_token_bytes(requests + 1, plan.context_length) / 1e6
    running = flag(flags, "max-running-requests")
    if running is not None and int(running) == requests:
        change = f"--max-running-requests stays {requests}"
    elif running is not None:
        change = f"--max-running-requests goes from {running} to {requests}"
    elif resolved is not None and requests == resolved:
        change = (
            f"--max-running-requests is left to SGLang, which resolves it to {requests:,} here "
            "(mem_cache/kv_cache_configurator.py resolve_max_num_reqs)"
        )
    else:
        own = "" if resolved is None else f" (SGLang's own {resolved:,} would not keep the memory floor)"
        change = f"--max-running-requests is set to {requests}{own}"
    lower = (
        "; fewer concurrent requests means fewer short prompts served at once (lower throughput)"
        if running is None or requests < int(running)
        else "; lowering it frees CUDA-graph and activation memory for a higher fraction, but serves fewer "
        "short prompts at once (lower throughput)"
    )
    return f"{change}: its req_to_token table is {table_mb:.1f} MB at this context{lower}"


def _speculative(host: HostConfig, flags: Flags) -> bool:
    """Speculative decoding of any algorithm, NGRAM included, resets an unset --max-running-requests to 48
    in SGLang 0.5.23 (arg_groups/speculative_hook.py:1294-1302 _handle_ngram, as the draft-model ones)."""
    return host.draft is not None or bool(flag(flags, "speculative-algorithm"))
