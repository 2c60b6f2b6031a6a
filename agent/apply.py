"""One host's change as apply makes it: plan from the host's facts, render, show, then the report.

deploy.py loads this module once the facts request is on its way, so the host gathers its facts while
the laptop loads the planner, the template engine and the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.cli.options import Change
from agent.errors import UsageError
from agent.inventory import HostConfig
from agent.output import Output, Style
from agent.plan.choose import Plan, Target, plan_for_host
from agent.protocol import DowntimeData, Event, HostFacts, Request, exit_code, unit_sha256
from agent.remote.client import base_request
from agent.render import (
    check_with_sglang_table,
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
from agent.sglang.flags import FlagsError, FlagValue, diff_flags, flag_table, parse_unit_flags
from agent.sglang.logs.summary import StartFigures
from agent.sglang.long_context import yarn_override
from agent.verify import render_checked


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


def with_set_flags(host: HostConfig, change: Change, facts: HostFacts) -> tuple[HostConfig, HostFacts]:
    """The inventory and the host's facts with the --set flags over the baseline and the running flags:
    the plan sizes the pool of the unit that will run (an fp8 KV cache, another TP size)."""
    if not change.flags:
        return host, facts
    extra = dict(change.flags)
    flags = {**host.sglang.flags, **extra}
    host = host.model_copy(update={"sglang": host.sglang.model_copy(update={"flags": flags})})
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


def make_plan(host: HostConfig, change: Change, facts: HostFacts) -> Plan:
    from agent.plan.from_facts import plan_from_host_facts  # the host read its config.json: plan from that

    host, facts = with_set_flags(host, change, facts)
    asked = Target(change.context, change.mem_fraction_static, change.max_running_requests)
    from_host = plan_from_host_facts(host, facts, calibration_from(facts), asked)
    if from_host is not None:
        return from_host
    running = facts.get("flags") or dict(host.sglang.flags)
    return plan_for_host(host, asked, calibration_from(facts), running)


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


def prepare(out: Output, host: HostConfig, change: Change, facts: HostFacts) -> Prepared | None:
    """Plan from the host's facts, render, show the plan and the diff; None for a dry run."""
    check_with_sglang_table(host, dict(change.flags))  # before the plan: a typo is not planned for
    if change.allow_longer_context:  # planned with SGLang's override in the unit, as it will run
        host = allow_context(host, change)
    plan = make_plan(host, change, facts)
    flags = {**dict(change.flags), **plan.flags()}
    old_text = facts.get("unit_text") or ""
    if not plan.feasible and not change.force:
        show_plan(out, host, plan, old_text, render_unit(host, flags, template_dir()))
        raise UsageError(
            f"the plan cannot reach {change.context:,} tokens on {host.name}: {plan.binding}; "
            "nothing was changed",
            hint="see the alternatives above, or pass --force to try the highest safe fraction anyway",
        )
    target_host = allow_context(host, change)
    new_text = render_checked(target_host, flags, installed=old_text)
    env_secrets, flag_secrets = secret_values(target_host, flags)
    show_plan(out, host, plan, old_text, new_text)
    if change.dry_run:
        out.note("dry run: nothing was changed")
        return None
    req = base_request(
        host,
        "apply",
        unit_text=new_text,
        target_context=change.context,
        planned_pool=plan.predicted_pool_tokens or None,  # a forced plan may predict no pool at all
        expect_sha256=installed_sha256(facts),
        secret_env=env_secrets,
        secret_flags=flag_secrets,
    )
    return Prepared(plan, old_text, new_text, req)


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
        yarn = yarn_override(limit, change.context) if host.model.attention != "mla" else None
        raise UsageError(
            f"--context {change.context:,} is above the model's own context of {limit:,}: "
            "SGLang would refuse to start; nothing was changed",
            hint=(
                f"scale RoPE with YaRN: --set json-model-override-args='{yarn}'; or pass "
                if yarn
                else "pass "
            )
            + "--allow-longer-context to set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (the model then "
            "runs past its trained length, unscaled)",
        )
    env = {**host.unit.environment, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    return host.model_copy(update={"unit": host.unit.model_copy(update={"environment": env})})


def show_plan(out: Output, host: HostConfig, plan: Plan, old_text: str, new_text: str) -> None:
    if out.style is Style.JSON:
        return
    secrets = host.unit.secret_environment
    changes = redact_changes(diff_flags(_readable_flags(old_text), parse_unit_flags(new_text)))
    # the same text `deployctl plan` prints
    out.note(plan_with_chart(host.name, plan, _readable_flags(old_text), unicode=out.style is Style.TTY))
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
    try:
        return plan_for_host(host, Target(context), [summary], {**host.sglang.flags})
    except UsageError:
        return None
