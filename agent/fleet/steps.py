"""The steps of one host's change in a fleet run: plan from the facts and the canaries' starts, render,
the apply request, follow it to its outcome, and the result. The per-host run (hostrun.py) and the
per-group run (grouprun.py) are two uses of these steps; neither imports the other's caller."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent.apply import (
    allow_context,
    asked_of,
    calibration_from,
    daemon_text,
    installed_sha256,
    planned_pools,
    with_set_flags,
)
from agent.fleet.calibrate import Measured
from agent.fleet.results import HostResult, PlanFigures
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change
from agent.plan.choose import Plan
from agent.plan.from_facts import plan_for_host
from agent.protocol.answers import HostFacts
from agent.protocol.common import new_txn_id
from agent.protocol.events import Event, OutcomeData
from agent.protocol.requests import Request
from agent.remote.client import AgentClient, Conversation, base_request
from agent.remote.follow import Watch, connected, follow
from agent.remote.transport import ConnectionLost
from agent.render import secret_values
from agent.sglang.flags import FlagInput, FlagsError, FlagValue, parse_unit_flags
from agent.sglang.logs.summary import StartFigures
from agent.verify import render_checked

Emit = Callable[[str, str], None]  # (phase, message)


def flags_of(text: str | None) -> dict[str, FlagValue]:
    try:
        return dict(parse_unit_flags(text)) if text else {}
    except FlagsError:
        return {}


def plan_host(
    host: HostConfig,
    context: int,
    facts: HostFacts,
    peers: Sequence[Measured],
    flags: Mapping[str, FlagInput] | None = None,
) -> tuple[Plan, tuple[str, ...]]:
    """Plan from the host's own last start plus the canaries' measured starts, else the architecture;
    with the --set flags over the running ones, a fraction or request count among them kept as asked."""
    change = as_change(context, flags or {})
    host, facts = with_set_flags(host, change, facts)
    running = facts.get("flags") or dict(host.sglang.flags)
    own = list(calibration_from(facts) or [])
    # The canaries' starts come first: the planner credits CUDA-graph memory from the last start that
    # logged it and takes the largest runtime need of all. Canary first reproduced the canary's own
    # request count on identical hosts (32 at 200k on the simulated ct200); canary last gave 16.
    calibration = [*(p.start for p in peers), *own]
    sources = tuple(f"canary {p.host}" for p in peers) + (("own start",) if own else ())
    asked = asked_of(change)
    plan = plan_for_host(host, asked, calibration or None, running)
    return plan, sources if plan.basis == "calibrated" else ()


def as_change(context: int, flags: Mapping[str, FlagInput]) -> Change:
    """The fleet's --set as the Change `deployctl apply` makes of it."""
    rest = dict(flags)
    fraction, requests = rest.pop("mem-fraction-static", None), rest.pop("max-running-requests", None)
    return Change(
        context,
        float(str(fraction)) if fraction is not None else None,
        int(str(requests)) if requests is not None else None,
        flags=tuple(rest.items()),
    )


def render_for(host: HostConfig, context: int, unit_flags: Mapping[str, FlagInput], facts: HostFacts) -> str:
    """The unit for `context` with the plan's flags, rendered with this host's (or node's) inventory."""
    target_host = allow_context(host, Change(context))
    return render_checked(target_host, unit_flags, installed=facts.get("unit_text") or "")


def apply_request(  # noqa: PLR0913 - the request's parts: whose, what target, which unit, flags, pool, facts
    host: HostConfig,
    context: int,
    text: str,
    unit_flags: Mapping[str, FlagInput],
    plan: Plan,
    facts: HostFacts,
    daemon: bool = False,
) -> Request:
    """What `deployctl apply` sends for the same plan; `daemon`: with the weight-cache daemon's unit."""
    env_secrets, flag_secrets = secret_values(allow_context(host, Change(context)), unit_flags)
    return base_request(
        host,
        "apply",
        txn=new_txn_id(),  # chosen here: a re-attach then knows this transaction's outcome from any other
        unit_text=text,
        target_context=context,
        **planned_pools(plan),
        expect_sha256=installed_sha256(facts),
        secret_env=env_secrets,
        secret_flags=flag_secrets,
        daemon_text=daemon_text(host, text) if daemon else None,
    )


def plan_figures(plan: Plan, sources: tuple[str, ...], emit: Emit) -> PlanFigures:
    """The plan's figures for the result, told to the operator as they are known."""
    basis = ", ".join(sources) or "architecture"
    emit(
        "plan",
        f"fraction {plan.mem_fraction_static:.3f}, {plan.max_running_requests} requests, "
        f"predicted pool {plan.predicted_pool_tokens:,} ({basis})",
    )
    return PlanFigures(
        plan.mem_fraction_static,
        plan.max_running_requests,
        plan.predicted_pool_tokens,
        plan.feasible,
        plan.basis,
        sources,
    )


@dataclass(frozen=True)
class Applied:
    """What the controller knew of a host when it sent the apply: the result adds the host's outcome."""

    host: str
    context: int
    figures: PlanFigures
    before: Mapping[str, FlagValue]  # the installed unit's flags, redacted
    after: Mapping[str, FlagValue]  # the rendered unit's flags, redacted

    def checked(self, differs: bool) -> HostResult:
        """Ansible's check mode: whether the unit would change; nothing was sent to the host."""
        return HostResult(
            self.host, "would_change" if differs else "up_to_date",
            "check mode: the unit would change" if differs else "check mode: the unit would not change",
            self.context, self.figures, before=dict(self.before), after=dict(self.after),
        )  # fmt: skip

    def result(self, message: str, data: OutcomeData, facts: HostFacts) -> HostResult:
        outcome = str(data.get("outcome"))
        summary: StartFigures = data.get("summary") or {}
        if outcome == "up_to_date":
            summary = facts.get("last_start") or {}
        smoke = data.get("smoke")
        ran = outcome in ("applied", "up_to_date")
        measured = summary if summary.get("kv_tokens") and ran else None
        return HostResult(
            self.host,
            outcome,
            message,
            self.context,
            self.figures,
            measured_pool=summary.get("kv_tokens"),
            before=dict(self.before),
            after=dict(self.after) if ran else dict(self.before),
            backup=data.get("backup"),
            smoke_seconds=smoke.get("seconds") if smoke else None,
            downtime_s=downtime_of(data),
            measured_start=measured.copy() if measured else None,
        )


def follow_outcome(
    client: AgentClient, host: HostConfig, req: Request, emit: Emit, talk: Conversation | None = None
) -> tuple[str, OutcomeData]:
    """The transaction's outcome (message, data with "outcome"), re-attaching after a dropped link
    (remote/follow.py, the follower deploy uses too); steps and warnings go to emit.

    With `talk`, the request goes to the agent process that answered the facts it was planned from.
    """

    def on_event(event: Event) -> None:
        if event.kind in ("step", "warning"):
            emit(event.stage, event.message)

    def lost(why: str) -> None:
        emit("reattach", f"connection lost ({why}); the host goes on alone, re-attaching")

    watch = Watch(on_event, lost, lambda: connected(host), lambda s: time.sleep(s))
    try:
        outcome = follow(talk if talk is not None else client, host, req, watch)
    except ConnectionLost as exc:
        raise ConnectionLost(f"{host.name}: {exc.message}") from None
    return outcome.message, outcome.outcome_data().copy()


def downtime_of(data: OutcomeData) -> float | None:
    """The restart's downtime: the agent's stop-to-answer figure where it reports one, else the start's."""
    down = data.get("downtime")
    seconds = down.get("seconds") if down else None
    return float(seconds) if seconds is not None else data.get("start_seconds")
