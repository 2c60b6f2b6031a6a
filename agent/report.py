"""Pure: an outcome -> the report a careful engineer writes afterwards (flags, pool, memory, way back)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.chart import draw, from_plan
from agent.plan.choose import Plan
from agent.plan.restart_time import RESTART_PHASES
from agent.protocol.answers import BackupRow
from agent.protocol.events import (
    DOWNTIME_PHASES,
    DowntimeData,
    DrainData,
    LoadData,
    Outcome,
    OutcomeData,
    PrewarmData,
    RouterData,
)
from agent.sglang.flags import FlagChange, FlagInput, FlagValue, diff_flags, flag_table, flag_words
from agent.sglang.logs.fixes import fix_for
from agent.sglang.logs.summary import StartFigures

TIGHT_RESERVE_GIB = 5.0  # below this, say plainly not to push the fraction higher


@dataclass(frozen=True)
class ApplyReport:
    host: str
    unit: str
    target: int | None  # None: a rollback, which only has to come back healthy
    plan: Plan | None
    before_flags: Mapping[str, FlagValue]
    after_flags: Mapping[str, FlagValue]
    outcome: str
    message: str
    data: OutcomeData
    next_plan: Plan | None = None  # on a rejected change: what the measured figures now recommend
    previous_downtime: DowntimeData | None = None  # the last verified start's, on the same host
    restart_estimate_s: float | None = None  # what plan/restart_time.py expected the restart to cost


def render_report(r: ApplyReport) -> str:
    known = Outcome.read(r.outcome)
    headline = known.headline if known else r.outcome.upper()
    out = [f"== deployctl: {r.host} {r.unit}: {headline}", r.message]
    changes = diff_flags(r.before_flags, r.after_flags)
    if changes and r.outcome != "up_to_date":
        out += ["", "flags (before -> after):", _indent(flag_table(changes))]
    summary: StartFigures = r.data.get("summary") or {}
    if r.outcome in ("applied", "rolled_back", "rollback_failed"):
        out += ["", *_pool_lines(r, summary)]
    smoke = r.data.get("smoke")
    if smoke:
        verdict = "passed" if smoke.get("passed") else "FAILED"
        out.append(
            f"smoke test:            {smoke['prompt_tokens']:,} prompt tokens, prefill+answer "
            f"{smoke['seconds']:.1f} s, answer {smoke['answer']!r} ({verdict})"
        )
    out += _load_lines(r.data.get("load"))
    out += _router_lines(r.data.get("router"))
    out += _drain_lines(r.data.get("drain"))
    out += _downtime_lines(r.data.get("prewarm"), r.data.get("downtime"), r.previous_downtime)
    out += _estimate_lines(r.restart_estimate_s, r.data.get("downtime"))
    out += _way_back(r)
    if r.plan is not None and r.outcome == "applied":
        out += _tradeoffs(r.plan, changes)
    return "\n".join(out).rstrip() + "\n"


def _load_lines(load: LoadData | None) -> list[str]:
    """The load check's verdict and the two figures the context costs: prefill rate, decode time."""
    if not load:
        return []
    head = "load check:            "
    if load["failed"]:
        return [f"{head}{load['failed']} of {load['requests']} requests FAILED: {load['detail']}"]
    line = f"{head}{load['requests']} requests at once, all answered in {load['seconds']:.1f} s"
    if load["prefill_tokens_per_s"] is not None:
        line += f"; prefill {load['prefill_tokens_per_s']:,.0f} tokens/s"
    if load["decode_ms_per_token"] is not None:
        at = load["long_prompt_tokens"] or 0
        line += f", decode {load['decode_ms_per_token']:,.1f} ms/token at {at:,} tokens"
    return [line]


def _router_lines(router: RouterData | None) -> list[str]:
    """How long the router sent this server nothing, and whether it took it back."""
    if not router:
        return []
    head = "router:                "
    if router.get("back") is None:
        return [f"{head}{router['worker']} was not listed in {router['url']}: left as it was"]
    back = "back in once its checks passed" if router["back"] else "NOT back in: put it back by hand"
    return [f"{head}out of {router['url']} for {router['out_s']:.1f} s, {back}"]


def _drain_lines(drain: DrainData | None) -> list[str]:
    """The requests the old server had when the restart was due, and what became of them."""
    if not drain:
        return []
    end = drain.get("end")
    if end == "no_answer" and not drain.get("in_flight"):
        return ["drain:                 none needed: the old server did not answer"]
    if end == "no_load":
        return ["drain:                 not possible: the server reports no load (no /v1/loads, no /metrics)"]
    if end == "off":
        return [
            "drain:                 off ([drain] enabled = false): requests in flight were not waited for"
        ]
    timed_out = f"; the wait timed out after {drain['timeout_s']:g} s" if end == "timeout" else ""
    return [
        f"drain:                 {drain['in_flight']} in flight, {drain['finished']} finished, "
        f"{drain['cut']} cut, {drain['seconds']:.1f} s (deployctl waited {drain['waited_s']:.1f} s "
        f"before the restart{timed_out})"
    ]


def _downtime_lines(
    prewarm: PrewarmData | None, now: DowntimeData | None, before: DowntimeData | None
) -> list[str]:
    """The restart's downtime by phase, next to the previous start's on this host."""
    lines = []
    if prewarm and prewarm.get("skip"):
        lines.append(f"pre-warm:              skipped: {prewarm['skip']}")
    elif prewarm:
        gib = prewarm["read_bytes"] / 2**30
        lines.append(
            f"pre-warm:              {gib:.2f} GiB of weights read in {prewarm['seconds']:.1f} s "
            "while the old server served"
        )
    seconds = now.get("seconds") if now else None
    if not now or seconds is None:
        return lines
    phases = _phases(now["phases"])
    lines.append(f"downtime:              {seconds:.1f} s ({phases})")
    previous = before.get("seconds") if before else None
    if before and previous:
        was = _phases(before.get("phases") or {})
        lines.append(f"previous start:        {previous:.1f} s ({was}); now {seconds / previous:.2f}x")
    return lines


def _estimate_lines(estimate: float | None, now: DowntimeData | None) -> list[str]:
    """The restart's estimate (stop to ready, plan/restart_time.py) against what those phases took."""
    if estimate is None or not now or now.get("seconds") is None:
        return []
    took = sum(v for k, v in now["phases"].items() if k in RESTART_PHASES)
    if not took:
        return []
    return [
        f"restart estimate:      {estimate:.1f} s before; took {took:.1f} s (stop to ready), "
        f"{took / estimate:.2f}x"
    ]


def _phases(seconds: Mapping[str, float]) -> str:
    """Phases in the order they happen (the wire sorts keys by name)."""
    return ", ".join(f"{p} {seconds[p]:.1f}" for p in DOWNTIME_PHASES if p in seconds)


def _pool_lines(r: ApplyReport, s: StartFigures) -> list[str]:
    measured = s.get("kv_tokens")
    context = r.target or s.get("context_len")
    lines = [f"target context:        {r.target:,} tokens"] if r.target else []
    if r.plan is not None:
        lines.append(
            f"predicted pool:        {r.plan.predicted_pool_tokens:,} tokens ({r.plan.basis_line()})"
        )
    if measured is None:
        return [*lines, "measured pool:         not logged"]
    verdict = "" if not r.target else " (meets the target)" if measured >= r.target else " (BELOW the target)"
    lines.append(f"measured pool:         {measured:,} tokens{verdict}")
    if r.plan is not None and r.plan.predicted_pool_tokens:
        err = (measured - r.plan.predicted_pool_tokens) / r.plan.predicted_pool_tokens
        lines.append(f"prediction error:      {err:+.2%}")
    if context:
        lines.append(
            f"full-context requests: {measured // int(context)} at once (pool ÷ context {int(context):,})"
        )
    free = s.get("available_gpu_mem_gb")
    if free is not None:
        warn = "  -- tight: do not push the fraction higher" if free < TIGHT_RESERVE_GIB else ""
        lines.append(f"memory left per GPU:   {free:.2f} GB after the pool and CUDA graphs{warn}")
    return lines


def _way_back(r: ApplyReport) -> list[str]:
    backup = r.data.get("backup")
    lines: list[str] = []
    if r.outcome == "applied" and backup:
        lines += ["", f"backup kept:           {backup}"]
        lines.append(
            f"to revert:             {shlex.join(['deployctl', 'rollback', r.host, '--to', backup])}"
        )
    if r.outcome in ("rolled_back", "rollback_failed"):
        lines += ["", f"why:                   {r.data.get('reason', r.message)}"]
        failure: Mapping[str, object] = (r.data.get("summary") or {}).get("failure") or {}
        if r.data.get("failure_kind") == "pool_anomaly":
            lines += _anomaly_lines(r.data.get("summary") or {})
        elif fixed := fix_for(
            str(failure.get("kind")),
            str(failure.get("line") or ""),
            (r.data.get("summary") or {}).get("host_ranks"),
            (r.data.get("summary") or {}).get("hicache_size"),
        ):
            lines.append(f"what to do:            {fixed}")  # SGLang's line says what to change
        elif r.next_plan is not None:
            lines.append(f"next recommendation:   {_next(r.next_plan)}")
    if r.outcome == "rollback_failed":
        lines += [
            "what to do:            the old unit is back in place but did not start healthy;",
            f"                       look at: journalctl -u {r.unit} -n 200",
            f"                       the rejected unit is kept at {r.data.get('rejected')}",
            f"                       once fixed: deployctl status {r.host}",
        ]
    return lines


def _anomaly_lines(s: StartFigures) -> list[str]:
    """An SGLang anomaly: the evidence SGLang logged, and no new fraction (no fraction would explain it)."""
    said = [
        f"{label} {value}"
        for label, value in (
            ("--mem-fraction-static", s.get("mem_fraction_static")),
            ("free before the weights (GB)", s.get("avail_mem_before_weights_gb")),
            ("free after the weights (GB)", s.get("avail_mem_after_weights_gb")),
            ("KV size (GB)", s.get("kv_size_gb")),
            ("left after the pool (GB)", s.get("available_gpu_mem_gb")),
        )
        if value is not None
    ]
    return [
        f"evidence:              SGLang logged {', '.join(said) or 'no memory figures'}",
        "what to do:            no new fraction: these flags gave the planned pool on this host before;",
        "                       look for memory SGLang kept or double-counted (sglang PR#36583, PR#34053)",
        "                       and at its version before changing the flags again",
    ]


def _next(plan: Plan) -> str:
    if plan.feasible:
        return (
            f"--mem-fraction-static {plan.mem_fraction_static:.3f} --max-running-requests "
            f"{plan.max_running_requests} (predicted pool {plan.predicted_pool_tokens:,}, "
            "calibrated on this start)"
        )
    alts = "".join(f"\n                       - {a.change}: {a.effect}" for a in plan.alternatives[:4])
    return f"the target does not fit on this hardware{'; instead:' + alts if alts else ''}"


def _tradeoffs(plan: Plan, changes: Sequence[FlagChange]) -> list[str]:
    out = ["", "tradeoffs:"]
    out += [f"  - {w}" for w in plan.warnings]
    lowered = any(c.name == "max-running-requests" and c.before is not None for c in changes)
    if lowered:
        out.append(
            "  - the lower --max-running-requests serves fewer short prompts at once: "
            "less throughput for short work"
        )
    out.append("  - --context-length alone never grows the pool; --mem-fraction-static does")
    return out


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def redact_backups(rows: Sequence[BackupRow]) -> None:
    """The values of secret flags (api-key, token...) in a backups listing, replaced for printing."""
    from agent.render import redact_changes

    for row in rows:
        changes = redact_changes(
            [FlagChange(str(name), before, after) for name, before, after in row.get("changes", [])]
        )
        row["changes"] = [[c.name, c.before, c.after] for c in changes]


def backups_table(host: str, rows: Sequence[BackupRow]) -> str:
    """`deployctl backups`: newest first, with what each would change back."""
    if not rows:
        return f"{host}: no backups\n"
    out = [f"{host}: {len(rows)} backup(s), newest first"]
    for row in rows:
        same = " (same as installed)" if row.get("same_as_installed") else ""
        out.append(f"  {row['name']}  {row['taken']}  {row['size']} B{same}")
        for name, before, after in row.get("changes", []):
            out.append(f"      --{name}: {_v(before)} in the backup, {_v(after)} installed")
    return "\n".join(out) + "\n"


def _v(value: Any) -> str:
    return "-" if value is None else "true" if value is True else str(value)


def full_context_at_once(plan: Plan) -> int:
    """Full-context requests served at once: what the pool holds, never more than --max-running-requests."""
    return min(plan.concurrency_at_full_context, plan.max_running_requests)


def render_plan(host: str, plan: Plan) -> str:
    """The plan and its tradeoffs in a few lines for a person."""
    verdict = "feasible" if plan.feasible else "NOT FEASIBLE"
    lines = [
        f"plan for {host}: context {plan.context_length:,} tokens: {verdict} ({plan.basis_line()})"
        + (f"; {plan.shrinks}" if plan.shrinks else ""),
        *([f"  because         {plan.binding}"] if plan.binding else []),
        f"  predicted pool  {plan.predicted_pool_tokens:,} tokens"
        + (  # the low end of a cold estimate is what the verdict compares (plan/verdict.py)
            f", at least {plan.predicted_pool_low_tokens:,}"
            if plan.predicted_pool_low_tokens != plan.predicted_pool_tokens
            else ""
        )
        + f" (target {plan.context_length:,}, with margin {plan.target_pool_tokens:,})",
        "  flags           " + flags_line(plan.printed_flags()) + _left_out(plan),
        f"  full-context requests at once  {full_context_at_once(plan)}",
        f"  memory left per GPU  {plan.reserve_gib_per_gpu:.2f} GiB (floor {plan.reserve_floor_gib:.1f} GiB)",
    ]
    if not plan.feasible:
        if plan.forced_fraction is not None:
            lines.append(
                f"  forced: the highest safe fraction {plan.forced_fraction:.3f} gives about "
                f"{plan.forced_pool_tokens or 0:,} tokens"
            )
        for alt in plan.alternatives:
            lines.append(f"  instead: {alt.change}")
            lines.append(f"           {alt.effect}")
    lines.extend(f"  warning: {w}" for w in plan.warnings)
    lines.extend(f"  note: {n}" for n in plan.notes)
    return "\n".join(lines)


def flags_line(flags: Mapping[str, FlagInput]) -> str:
    """The flags as one shell line a person can paste: each word quoted where the shell would split or
    expand it (a JSON override's braces and spaces), a switch bare and a false one left out, as rendered."""
    words: list[str] = []
    for name, value in flags.items():
        words += flag_words(name, _flag_text(value) if isinstance(value, float) else value)
    return shlex.join(words)


def _left_out(plan: Plan) -> str:
    """The flags the plan removes (`--set FLAG=false`: the unit's flag left out, docs/commands.md), said on
    the flags line as a shell comment, so the line still runs as it is copied."""
    gone = [f"--{k}" for k, v in plan.printed_flags().items() if v is False]
    return f"  # left out: {' '.join(gone)}" if gone else ""


def _flag_text(value: Any) -> str:
    """A flag's value for a person: fractions rounded to 3 decimals (0.766, not 0.7657059374999999)."""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def plan_with_chart(host: str, plan: Plan, running: Mapping[str, FlagInput], *, unicode: bool) -> str:
    """What `plan` and `apply --dry-run` both print: the plan, then the pool against the fraction."""
    chart = draw(from_plan(plan, _running_fraction(running)), unicode=unicode)
    return f"{render_plan(host, plan)}\n\n{chart}"


def _running_fraction(flags: Mapping[str, FlagInput]) -> float | None:
    """The running --mem-fraction-static, if the unit sets one that reads as a number."""
    try:
        value = float(str(flags["mem-fraction-static"]))  # a bool or a list reads as no number
    except (KeyError, ValueError):
        return None
    return value if 0 < value < 1 else None
