"""One host's change as apply makes it: plan from the host's facts, render, show, then the report.

deploy.py loads this module once the facts request is on its way, so the host gathers its facts while
the laptop loads the planner, the template engine and the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.errors import UsageError
from agent.inventory import HostConfig
from agent.orchestrate.asked import ArgError, Change, parse_context
from agent.output import Output, Style
from agent.plan import weight_cache_unit
from agent.plan.choose import Plan, Target
from agent.plan.effective import context_refusal, context_shrink, effective, one_word
from agent.plan.from_facts import plan_for_host, plan_from_host_facts
from agent.plan.hostbudget import ServiceNeed
from agent.plan.predict import SCALED_FROM
from agent.plan.refusals import yarn_allowed
from agent.plan.restart_time import GIB, PageCache, RestartEstimate
from agent.plan.restart_time import from_facts as restart_from_facts
from agent.protocol.answers import HostFacts
from agent.protocol.common import unit_sha256
from agent.protocol.events import DowntimeData, Event, exit_code
from agent.protocol.requests import Request
from agent.remote.client import base_request
from agent.render import (
    daemon_environment,
    gpu_environment,
    load_template,
    redact,
    redact_changes,
    redact_flags,
    render_unit,
    secret_values,
    secrets_line,
    template_dir,
    unit_diff,
)
from agent.report import ApplyReport, plan_with_chart, render_report
from agent.sglang.flags import FlagInput, FlagsError, FlagValue, diff_flags, flag_table, parse_unit_flags
from agent.sglang.logs.summary import StartFigures
from agent.sglang.long_context import yarn_hint, yarn_override
from agent.sglang.weight_cache import NO_DAEMON, RestartClass, fingerprint, quant_of, restart_class
from agent.verify import render_checked

Near = tuple[ServiceNeed, ...]  # the host's other services, for HiCache's host budget


def calibration_from(facts: HostFacts) -> Sequence[StartFigures] | None:
    """The last start's figures (its journal), else the verified starts the agent remembers."""
    history = [h for h in facts.get("history") or [] if h.get("kv_tokens")]
    last = facts.get("last_start")
    if last and last.get("kv_tokens") and last.get("avail_mem_before_weights_gb"):
        if last.get("graph_mem_gb") is None:  # a start still capturing its graphs: borrow a finished one's
            graphs = [h for h in history if h.get("graph_mem_gb") is not None]
            return [last, *graphs[-1:]]
        return [last]
    return history[-1:] or None


def installed_sha256(facts: HostFacts) -> str:
    """The sha256 of the unit the host has, "absent" for none: what an apply must find to change it. The
    host sends it beside the unit's text, whose secret values it replaced before sending."""
    if "unit_sha256" in facts:
        sha = facts["unit_sha256"]
        return sha if isinstance(sha, str) else "absent"
    text = facts.get("unit_text")  # facts without the field (written by hand): their text is the unit's
    return unit_sha256(text) if isinstance(text, str) and text else "absent"


def drifted(texts: Sequence[str], facts: Sequence[HostFacts]) -> bool:
    """Whether any host's installed unit differs from the one rendered for it (the fleet's check mode)."""
    return any(unit_sha256(t) != installed_sha256(f) for t, f in zip(texts, facts, strict=True))


def with_set_flags(host: HostConfig, change: Change, facts: HostFacts) -> tuple[HostConfig, HostFacts]:
    """The inventory and the host's facts with the --set flags over the baseline and the running flags:
    the plan sizes the pool of the unit that will run (an fp8 KV cache, another TP size: plan/effective.py
    restates the weights per GPU at it)."""
    if not change.flags:
        return host, facts
    host = effective(host, change.flags).host
    extra = {k: one_word(v) for k, v in change.flags}
    facts = {**facts, "flags": {**(facts.get("flags") or {}), **extra}}
    doc = facts.get("model_facts")
    if isinstance(doc, Mapping):
        # started_flags: what the host's starts ran under, so the planner scales their cell (plan/evidence.py)
        started = doc.get("started_flags") or doc.get("flags") or {}
        facts["model_facts"] = {
            **doc,
            "flags": {**(doc.get("flags") or {}), **extra},
            "started_flags": started,
        }
    return host, facts


def asked_of(change: Change) -> Target:
    """What a change asks the planner for: the context, a fraction or request count fixed, and the other
    --set flags, which the plan sizes and then carries into its printed and rendered flags."""
    return Target(change.context, change.mem_fraction_static, change.max_running_requests, change.flags)


def served_context(flags: Mapping[str, object], model_context: int | None) -> int | None:
    """The context the unit serves now: its --context-length (as the inventory spells it: 128Ki), else the
    model's own (SGLang's default)."""
    given = flags.get("context-length")
    if given is None or isinstance(given, bool):
        return model_context
    try:
        return parse_context(str(given), "--context-length")
    except ArgError:
        return model_context


def check_context(
    change: Change, running: Mapping[str, object], model_context: int | None
) -> tuple[str, ...]:
    """A target context implausibly small, or a slip far below the one the unit serves now, is refused in
    one line before anything is planned (plan/effective.py context_refusal); a smaller shrink is returned
    as the warning the plan carries."""
    served = served_context(running, model_context)
    said = context_refusal(change.context, served, change.shrink_context)
    if said:
        raise UsageError(said + "; nothing was changed")
    shrink = context_shrink(change.context, served)
    return (shrink,) if shrink else ()


def make_plan(host: HostConfig, change: Change, facts: HostFacts, near: Near = ()) -> Plan:
    shrink = check_context(change, facts.get("flags") or host.sglang.flags, host.model.max_context)
    plan = _planned(host, change, facts, near)
    return replace(plan, warnings=(*shrink, *plan.warnings))


def _planned(host: HostConfig, change: Change, facts: HostFacts, near: Near = ()) -> Plan:
    # what the last start ran under: the running flags as the host read them, --set not merged in
    running = facts.get("flags") or dict(host.sglang.flags)
    host, facts = with_set_flags(host, change, facts)
    asked = asked_of(change)
    from_host = plan_from_host_facts(host, facts, calibration_from(facts), asked, near)
    if from_host is not None:
        return from_host
    return plan_for_host(host, asked, calibration_from(facts), running,
                         host_memory=facts.get("host_memory"), neighbours=near)  # fmt: skip


def preload(host: HostConfig) -> None:
    """Compile the host's unit template now (importing this module loaded the planner)."""
    load_template(host, template_dir())


@dataclass(frozen=True)
class Prepared:
    """A change planned, rendered, shown and ready to send."""

    plan: Plan
    old_text: str
    new_text: str
    request: Request
    restart: RestartEstimate | None = None  # what the restart was expected to cost, before it ran


def prepare(
    out: Output, host: HostConfig, change: Change, facts: HostFacts, near: Near = ()
) -> Prepared | None:
    """Plan from the host's facts, render, show the plan and the diff; None for a dry run."""
    # SGLang's flag table read --set (cli/commands/apply.py effective_of); the render checks the unit again.
    if change.allow_longer_context:  # planned with SGLang's override in the unit, as it will run
        host = allow_context(host, change)
    refuse_weight_cache(host, dict(change.flags), facts)
    plan = make_plan(host, change, facts, near)  # near: the host's other services (HiCache)
    flags: dict[str, FlagInput] = {**plan.flags()}  # the --set flags and the plan's: what was sized
    old_text = facts.get("unit_text") or ""
    if not plan.feasible:
        refuse_unpassed(out, host, change, plan, old_text)
    target_host = allow_context(host, change)
    new_text = render_checked(target_host, flags, installed=old_text)
    env_secrets, flag_secrets = secret_values(target_host, flags)
    host = without_skipped_prewarm(host, plan)
    restart = restart_for(host, facts, new_text, flags)
    show_plan(out, host, plan, old_text, new_text, restart)
    if host.weight_cache.enabled and out.style is not Style.JSON:
        out.note(_daemon_unit_note(host, new_text))
    if change.dry_run:
        out.note("dry run: nothing was changed")
        return None
    req = base_request(
        host,
        "apply",
        unit_text=new_text,
        target_context=change.context,
        **planned_pools(plan),
        expect_sha256=installed_sha256(facts),
        secret_env=env_secrets,
        secret_flags=flag_secrets,
        daemon_text=daemon_text(host, new_text),
        start=change.start,
    )
    return Prepared(plan, old_text, new_text, req, restart)


def without_skipped_prewarm(host: HostConfig, plan: Plan) -> HostConfig:
    """The host with pre-warm off where the host budget skips it (the checkpoint cannot stay cached beside
    the pools): the request does not ask for it and the restart estimate reads from disk."""
    if not host.prewarm.enabled or plan.host is None or not plan.host.budget.prewarm_skipped:
        return host
    return host.model_copy(update={"prewarm": host.prewarm.model_copy(update={"enabled": False})})


def refuse_unpassed(out: Output, host: HostConfig, change: Change, plan: Plan, old_text: str) -> None:
    """An infeasible plan goes on only where each of its refusals is passed by its own override: --force
    risks the device fraction (a start rolled back), --ignore-host-memory the host's memory; a refusal
    that is neither (a HiCache pool deployctl does not size) is the device's."""
    host_refused = plan.host is not None and not plan.host.fits
    device = plan.device_refusal if host_refused else plan.binding
    if host_refused and not change.ignore_host_memory:
        show_plan(out, host, plan, old_text, render_unit(host, {**plan.flags()}, template_dir()))
        raise UsageError(
            f"the host's memory cannot hold {host.name}'s plan: {plan.binding}; nothing was changed",
            hint="set a smaller --hicache-size (--set hicache-size=N), or turn HiCache off for it; --force "
            "does not pass this refusal, --ignore-host-memory does (risk: SGLang refuses the pool at "
            "start and the change is rolled back, or the host's services pin more than it has)",
        )
    if not change.force and (device is not None or not host_refused):
        refuse_infeasible(out, host, change, replace(plan, binding=device), old_text)


def refuse_infeasible(out: Output, host: HostConfig, change: Change, plan: Plan, old_text: str) -> None:
    """A plan the device cannot hold at the target: shown, then refused before anything changes."""
    show_plan(out, host, plan, old_text, render_unit(host, {**plan.flags()}, template_dir()))
    raise UsageError(
        f"the plan cannot reach {change.context:,} tokens on {host.name}: {plan.binding}; "
        "nothing was changed",
        hint="see the alternatives above, or pass --force to try the highest safe fraction anyway",
    )


def planned_pools(plan: Plan) -> dict[str, int | bool | None]:
    """What the gate holds the start to: the device pool (a forced plan may predict none), whether it was
    calibrated here, and HiCache's host pool per rank (plan/hostplan.py) where the unit sizes one, with the
    host budget it was counted in (for the metrics)."""
    return {
        "planned_pool": plan.predicted_pool_tokens or None,
        "pool_calibrated": calibrated_pool(plan),
        "planned_host_pool": plan.host.pool.tokens if plan.host and plan.host.size_gb else None,
        "host_budget_pinned": plan.host.budget.pinned if plan.host and plan.host.checked else None,
        "host_budget_capacity": plan.host.budget.capacity if plan.host and plan.host.checked else None,
    }


def restart_for(
    host: HostConfig, facts: HostFacts, new_text: str, flags: Mapping[str, FlagInput]
) -> RestartEstimate:
    """The restart's cost from the host's last start, and the cache preconditions (plan/restart_time.py)."""
    cache = PageCache(None, None, host.prewarm.enabled, int(host.prewarm.margin_gib * GIB))
    klass, changed = weight_cache_class(host, facts, new_text)
    restart = {
        "weight_cache_kept": klass is RestartClass.ENGINE,
        "daemon_restart": klass is RestartClass.BOTH,
    }
    estimate = restart_from_facts(facts, new_text, dict(flags), cache, **restart)
    if klass is RestartClass.NO_CACHE:
        return estimate
    said = "restarts only the engine: the weight-cache daemon keeps its fingerprint and its weights"
    if changed == [NO_DAEMON]:
        said = (
            "starts the weight-cache daemon and restarts the engine: no daemon runs yet (the daemon loads "
            "the weights from disk, then the engine maps them)"
        )
    elif klass is RestartClass.BOTH:
        said = (
            "restarts the weight-cache daemon and the engine: its fingerprint changed "
            f"({', '.join(changed)}); the daemon reloads the weights from disk, then the engine maps them"
        )
    return replace(estimate, notes=(said, *estimate.notes))


def weight_cache_class(host: HostConfig, facts: HostFacts, new_text: str) -> tuple[RestartClass, list[str]]:
    """What the change restarts with [weight_cache] on: the running unit's fingerprint against the new one
    (sglang/weight_cache.py; a unit not yet in client mode has no daemon to keep)."""
    old_text = facts.get("unit_text") or ""
    old_flags = _readable_flags(old_text)
    old = None
    if old_flags.get("weight-cache-mode") == "client":
        old = fingerprint(old_flags, _running_version(facts, host))
    new = fingerprint(parse_unit_flags(new_text), host.sglang.version)
    return restart_class(old, new, host.weight_cache.enabled)


def calibrated_pool(plan: Plan) -> bool:
    """Whether the pool sent for the gate was predicted from this host's own starts: the gate then takes a
    pool far from it for an SGLang anomaly, not a fraction to correct (host/change/decide.py). A start that
    ran under other cell-changing flags (a KV dtype, a draft added or dropped since) is evidence for the
    memory, not for these flags' pool: a pool beyond it is no anomaly."""
    scaled = any(e.startswith(SCALED_FROM) for e in plan.evidence)
    return plan.basis == "calibrated" and bool(plan.predicted_pool_tokens) and not scaled


def daemon_text(host: HostConfig, new_text: str) -> str | None:
    """[weight_cache]: the daemon's unit, sent with the engine's: the host backs it up, writes it."""
    if not host.weight_cache.enabled:
        return None
    return weight_cache_unit.render_daemon_unit(
        host, parse_unit_flags(new_text), gpu_environment(host), daemon_environment(host)
    )


def _daemon_unit_note(host: HostConfig, new_text: str) -> str:
    """[weight_cache]: the daemon's unit the engine is bound to, rendered for the host's operator."""
    name = weight_cache_unit.daemon_unit_name(host.unit.name)
    text = daemon_text(host, new_text)
    return f"== {name}: installed with the engine's unit, restarted only when it changes\n{text}"


def weight_cache_facts(facts: HostFacts) -> tuple[tuple[str, bool | None], str]:
    """(quant_method, block-wise) from the checkpoint's config.json, and the device, for the refusals."""
    doc = facts.get("model_facts")
    model = doc.get("model") if doc else None
    device = str(doc.get("device") or "cuda") if doc else "cuda"
    return quant_of((model.get("config") or {}) if model else None), device


def refuse_weight_cache(host: HostConfig, flags: Mapping[str, FlagInput], facts: HostFacts | None) -> None:
    """With [weight_cache], what SGLang's daemon cannot serve is refused before anything changes: by
    apply and a group (prepare), the fleet before its first host and each host from its facts."""
    merged = {**host.sglang.flags, **flags}
    refused = weight_cache_unit.refusal(host, merged, *weight_cache_facts(facts or {}))
    if refused:
        raise UsageError(refused, hint="set weight_cache.enabled = false for this service")


def _running_version(facts: HostFacts, host: HostConfig) -> str:
    doc = facts.get("model_facts")
    return (
        str((doc.get("sglang") or {}).get("version") or host.sglang.version) if doc else host.sglang.version
    )


def report(out: Output, host: HostConfig, sent: Prepared, outcome: Event, facts: HostFacts) -> int:
    """The report of a change's outcome (unless --json, or --quiet and nothing changed); its exit code."""
    context = sent.request.target_context or 0
    rep = ApplyReport(
        host.name,
        host.unit.name,
        context,
        sent.plan,
        redact_flags(_readable_flags(sent.old_text)),
        redact_flags(parse_unit_flags(sent.new_text)),
        str(outcome.data.get("outcome")),
        outcome.message,
        outcome.outcome_data(),
        next_plan=_next_plan(host, context, outcome),
        previous_downtime=_previous_downtime(facts),
        restart_estimate_s=sent.restart.seconds if sent.restart else None,
    )
    if not (out.quiet and rep.outcome == "up_to_date") and out.style is not Style.JSON:
        out.print(render_report(rep))
    return int(exit_code(rep.outcome))


def _previous_downtime(facts: HostFacts) -> DowntimeData | None:
    """The downtime of the newest verified start the host remembers (before this change)."""
    return next((h["downtime"] for h in reversed(facts.get("history") or []) if h.get("downtime")), None)


def allow_context(host: HostConfig, change: Change) -> HostConfig:
    """SGLang >= 0.5.3 refuses a context above the model's own; --allow-longer-context (not --force, which
    applies an infeasible plan) sets SGLang's override in the unit."""
    limit = host.model.max_context
    if limit is None or change.context <= limit:
        return host
    if not change.allow_longer_context:
        yarn = (
            yarn_override(limit, change.context, host.model.trained_context) if yarn_allowed(host) else None
        )
        raise UsageError(
            f"--context {change.context:,} is above the model's own context of {limit:,}: "
            "SGLang would refuse to start; nothing was changed",
            hint=(f"scale RoPE with YaRN: {yarn_hint(yarn)}; or pass " if yarn else "pass ")
            + "--allow-longer-context to set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (the model then "
            "runs past its trained length, unscaled)",
        )
    env = {**host.unit.environment, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    return host.model_copy(update={"unit": host.unit.model_copy(update={"environment": env})})


def show_plan(  # noqa: PLR0913 - the plan, the unit before and after, and the restart's estimate
    out: Output,
    host: HostConfig,
    plan: Plan,
    old_text: str,
    new_text: str,
    restart: RestartEstimate | None = None,
) -> None:
    if out.style is Style.JSON:
        return
    secrets = host.unit.secret_environment
    changes = redact_changes(diff_flags(_readable_flags(old_text), parse_unit_flags(new_text)))
    # the same text `deployctl plan` prints, the restart's estimate included
    out.note(plan_with_chart(host.name, plan, _readable_flags(old_text), unicode=out.style is Style.TTY))
    if restart is not None:
        out.note("\n".join(restart.lines()))
    env_secrets, flag_secrets = secret_values(host, plan.flags())
    if env_secrets or flag_secrets:
        out.note("   " + secrets_line(host, env_secrets, flag_secrets))
    if changes:
        out.note("== flag changes")
        out.note("\n".join("   " + line for line in flag_table(changes).splitlines()))
        diff = unit_diff(old_text, new_text, host.unit.name)
        out.note(redact(diff, secrets).rstrip())
    else:
        out.note("== the unit would not change")


def _readable_flags(text: str) -> dict[str, FlagValue]:
    """The flags of a unit found on the host; {} when there is none or deployctl cannot read it."""
    try:
        return dict(parse_unit_flags(text)) if text else {}
    except FlagsError:
        return {}


def _next_plan(host: HostConfig, context: int, outcome: Event) -> Plan | None:
    """After a rejected change, re-plan from what that very start measured."""
    summary: StartFigures = outcome.data.get("summary") or StartFigures()
    if outcome.data.get("outcome") not in ("rolled_back", "rollback_failed") or not summary.get("kv_tokens"):
        return None
    if outcome.data.get("failure_kind") == "pool_anomaly":
        return None  # an SGLang anomaly calibrates nothing: no fraction is suggested from it
    try:
        return plan_for_host(host, Target(context), [summary], {**host.sglang.flags})
    except UsageError:
        return None
