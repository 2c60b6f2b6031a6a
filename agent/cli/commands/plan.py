"""`deployctl plan HOST --context 200k`: predict the KV pool and choose the flags, touching nothing."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent.cli.commands.parse_log import add_start_arg
from agent.cli.options import add_set_arg, add_target_args, change_of, connection_of
from agent.errors import UsageError
from agent.exitcodes import ExitCode
from agent.group.nodes import node_host
from agent.inventory import load_service, units_dir
from agent.orchestrate.asked import Change, warn_flag_table
from agent.output import Output, Style

if TYPE_CHECKING:
    from agent.inventory import HostConfig
    from agent.plan.choose import Plan, Target
    from agent.plan.facts import PlanInput
    from agent.plan.model import Flags
    from agent.plan.restart_time import RestartEstimate
    from agent.plan.startcheck import Planned, StartIdentity
    from agent.protocol import HostFacts
    from agent.sglang.flags import FlagInput
    from agent.sglang.logs.starts import LoggedStart
    from agent.sglang.logs.summary import StartFigures

# plan's exit status: 0 feasible, NOT_FEASIBLE when the plan cannot reach the target (it is printed all the
# same), 2 bad input, 3 host unreachable. A script can branch on it: `deployctl plan ... && deployctl apply`.
NOT_FEASIBLE = int(ExitCode.NOT_FEASIBLE)


def configure(p: argparse.ArgumentParser) -> None:
    add_target_args(p, context_required=True, host_required=False)
    add_set_arg(p)
    p.add_argument(
        "--facts",
        metavar="FILE",
        help="plan offline from a facts file (deployctl-facts/1, as `deployctl facts HOST --json` prints): "
        "no inventory, no SSH",
    )
    p.add_argument(
        "--from-log",
        action="append",
        default=[],
        metavar="FILE",
        help="calibrate from an earlier start-up log of this host: its last complete start, or --start N "
        "(repeatable: one start of each log is fitted)",
    )
    add_start_arg(p)
    p.add_argument(
        "--offline",
        action="store_true",
        help="do not ask the host for its last start: plan from --from-log or the architecture",
    )
    p.add_argument("--accept-new-host-key", action="store_true", help="trust an unknown SSH host key once")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.epilog = (
        "Without --from-log or --offline the host's last start is read over SSH to calibrate the plan.\n"
        f"exit status: 0 feasible, {NOT_FEASIBLE} not feasible (printed either way), 2 bad input\n"
        "example: deployctl plan ct200 --offline --context 200k\n"
        "example: deployctl plan ct200 --context 200k --from-log examples/ct200-start.log\n"
        "example: deployctl plan --facts examples/ct200.json --context 200k --json\n"
        "example: deployctl plan ct200 --context 400k --set kv-cache-dtype=fp8_e4m3 --offline"
    )


def _asked(change: Change) -> Target:
    from agent.apply import asked_of  # the planner loads when a command plans, not with the parser

    return asked_of(change)


def run(args: argparse.Namespace, out: Output) -> int:
    if args.facts:
        return _run_facts(args, out)
    if not args.host:
        raise UsageError("a host is required (or --facts FILE)", hint="see: deployctl plan --help")
    from agent.apply import check_context, refuse_weight_cache
    from agent.plan.effective import effective_of
    from agent.plan.from_facts import plan_for_host

    service = load_service(args.host, units_dir(args.units))  # loaded once, passed down
    if service.pd is not None:  # a prefill-decode service: one plan per role's unit
        from agent.cli.commands import pd

        return pd.plan(args, out, service)
    change = change_of(args)
    host = node_host(service, 0)  # a multi-node service: rank 0
    shrink = check_context(change, host.sglang.flags, host.model.max_context)
    version = host.sglang.version
    running: Flags = host.sglang.flags  # what the unit runs now, --set not over it: its starts ran under it
    host = effective_of(host, change.flags).host  # the flag table read --set; the weights at its TP x PP
    refuse_weight_cache(host, dict(change.flags), None)  # as apply refuses it (the checkpoint's: apply)
    planned = planned_for(None, host.model.path, host.sglang.flags, host.gpus.count, host.gpus.memory_gib)
    ran = planned_for(None, host.model.path, running, host.gpus.count, host.gpus.memory_gib)
    history: Sequence[StartFigures]  # the starts that calibrate the plan
    history, ids, read = checked_starts(args.from_log, planned, args.start, out, ran)
    asked = _asked(change)
    facts = None
    if not args.from_log and not args.offline:
        from_host, history, running, facts = _from_host(args, service, host, change, asked)
        if from_host is not None:
            warn_flag_table(out.stderr, version, dict(change.flags))  # planned: no error follows it
            return _printed(out, args, host.name, from_host, running, _restart(host, facts, from_host))
    from agent.plan.hostwire import neighbours  # the host's other services: HiCache's host budget

    near = neighbours(host, units_dir(args.units))
    plan = plan_for_host(host, asked, history or None, running, ids if args.from_log else (), near)
    plan = replace(plan, warnings=(*shrink, *plan.warnings))
    restart = _restart(host, facts, plan) if facts is not None else _log_restart(args.from_log, read)
    warn_flag_table(out.stderr, version, dict(change.flags))
    return _printed(out, args, host.name, plan, running, restart)


def _restart(host: HostConfig, facts: HostFacts, plan: Plan) -> RestartEstimate | None:
    """What the restart will cost, from the host's last start (plan/restart_time.py)."""
    from agent.apply import restart_for
    from agent.errors import RenderError
    from agent.render import render_unit, template_dir

    flags = {**host.sglang.flags, **plan.flags()}
    try:
        return restart_for(host, facts, render_unit(host, flags, template_dir()), flags)
    except RenderError:
        return None


def _log_restart(names: Sequence[str], start: LoggedStart | None) -> RestartEstimate | None:
    """What the restart will cost, from the start the plan reads in the newest --from-log (its own phases,
    not another start's of the same log; checked_starts chose it), None without one."""
    from agent.plan.restart_time import from_log

    if not names or start is None:
        return None
    return from_log(list(start.lines), repr(names[-1]))


def _from_host(
    args: argparse.Namespace, service: HostConfig, host: HostConfig, change: Change, asked: Target
) -> tuple[Plan | None, Sequence[StartFigures], Flags, HostFacts]:
    """Ask the host for its facts: the plan from its config.json when it read one, its earlier starts and
    the running unit's flags."""
    from agent.apply import calibration_from, check_context, with_set_flags
    from agent.orchestrate.session import session  # SSH only when the host is asked
    from agent.plan.from_facts import plan_from_host_facts
    from agent.protocol.answers import as_facts
    from agent.remote.client import base_request

    with session(connection_of(args), service) as s:
        facts = as_facts(s.client.call(base_request(s.host, "facts")))
    shrink = check_context(
        change, facts.get("flags") or host.sglang.flags, host.model.max_context
    )  # as it runs
    running: Flags = facts.get("flags") or host.sglang.flags  # as it runs, before --set
    facts = with_set_flags(host, change, facts)[1]
    history = [h.copy() for h in calibration_from(facts) or []]
    from agent.plan.hostwire import neighbours  # the host's other services: HiCache's host budget

    plan = plan_from_host_facts(host, facts, history, asked, neighbours(host, units_dir(args.units)))
    plan = None if plan is None else replace(plan, warnings=(*shrink, *plan.warnings))
    return plan, history, running, facts


def _printed(  # noqa: PLR0913 - the plan, where it runs now, and its restart estimate
    out: Output,
    args: argparse.Namespace,
    name: str,
    plan: Plan,
    running: Mapping[str, FlagInput],
    restart: RestartEstimate | None = None,
) -> int:
    """Print the plan (JSON, or the notes and the chart) and return its exit status."""
    from agent.report import plan_with_chart

    if args.json:
        estimate = restart.to_dict() if restart else {"restart_estimate_s": None}
        out.print(json.dumps({**plan.to_dict(), **estimate}, indent=2))
    else:
        text = plan_with_chart(name, plan, running, unicode=out.style is Style.TTY)
        out.print(text + ("\n" + "\n".join(restart.lines()) if restart else ""))
    return verdict(plan)


def verdict(plan: Plan) -> int:
    """The exit status says whether the plan is feasible; either way the plan was printed."""
    return 0 if plan.feasible else NOT_FEASIBLE


def _own_context(inp: PlanInput) -> int | None:
    """The context SGLang serves the facts' model at without --context-length: its config.json's
    (utils/hf_transformers/common.py get_context_length), None where the config says nothing usable."""
    from agent.inventory import MAX_TOKENS
    from agent.sglang.kvlayout import context_length, text_config

    try:
        own = context_length(text_config(inp.model.config))
    except (ValueError, KeyError, TypeError):
        return None
    return own if 0 < own <= MAX_TOKENS else None  # out of range: the planner refuses it in its own words


def _run_facts(args: argparse.Namespace, out: Output) -> int:
    """Plan from a facts file alone; --from-log adds earlier starts to the one the file may carry."""
    from agent.plan.facts import load_facts
    from agent.plan.from_facts import plan_from_facts
    from agent.sglang import server_args

    if args.host:
        raise UsageError("give a host or --facts FILE, not both")
    from agent.apply import check_context

    change = change_of(args)
    inp = load_facts(Path(args.facts))
    # the unit's --context-length, else the model's own (config.json, as SGLang derives it)
    shrink = check_context(change, inp.flags, _own_context(inp))
    for name, said in server_args.problems(inp.sglang_version, dict(change.flags)):
        raise UsageError(f"--set {name}: {said}")
    inp = _with_set(inp, change)
    archs = inp.model.config.value("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    card = inp.gpus[0].memory_gib if inp.gpus else None
    running = inp.start_flags if inp.start_flags is not None else inp.flags
    starts, ids, read = checked_starts(
        args.from_log,
        planned_for(arch, inp.model.path or "", inp.flags, len(inp.gpus), card),
        args.start,
        out,
        planned_for(arch, inp.model.path or "", running, len(inp.gpus), card),
    )
    # Each start with what its log says it ran (its KV dtype scales its cell: plan/evidence.py as_started)
    inp = replace(inp, starts=(*inp.starts, *starts), start_ids=(*inp.start_ids, *ids))
    plan = plan_from_facts(inp, _asked(change))
    plan = replace(plan, warnings=(*shrink, *plan.warnings))
    restart = _log_restart(args.from_log, read)
    if restart is None and inp.starts:
        from agent.plan.restart_time import from_start

        restart = from_start(inp.starts[-1], f"{args.facts}'s last start")
    warn_flag_table(out.stderr, inp.sglang_version, dict(change.flags))
    return _printed(out, args, inp.name, plan, inp.flags, restart)


def _with_set(inp: PlanInput, change: Change) -> PlanInput:
    """--set over a facts file's flags; the file's own flags stay what the unit runs now (and its starts ran
    under): a shrink is measured from them."""
    if not change.flags:
        return inp
    given = {k: " ".join(v) if isinstance(v, tuple) else v for k, v in change.flags}  # --set: one word
    ran = inp.start_flags if inp.start_flags is not None else dict(inp.flags)
    return replace(inp, flags={**inp.flags, **given}, start_flags=ran)


def planned_for(
    arch: str | None, path: str, flags: Mapping[str, FlagInput], gpus: int, card_gib: float | None = None
) -> Planned:
    from agent.plan.startcheck import Planned

    def number(*names: str, default: int) -> int:
        given = (flags[n] for n in names if flags.get(n) not in (None, False))  # false: the flag left out
        return int(str(next(given, default)))

    tp = number("tp-size", "tensor-parallel-size", default=gpus)
    pp = number("pp-size", "pipeline-parallel-size", default=1)
    return Planned(arch, path, tp, pp, str(flags.get("kv-cache-dtype") or "auto"), card_gib)


def checked_starts(
    names: Sequence[str],
    planned: Planned,
    number: int | None = None,
    out: Output | None = None,
    running: Planned | None = None,
) -> tuple[list[StartFigures], list[StartIdentity], LoggedStart | None]:
    """One start of each --from-log log: the last complete one, or the one --start names (a log is split
    into its starts first, agent/sglang/logs/starts.py). A start of another model, TP, PP or bigger cards
    is refused with one line (plan/startcheck.py), so is a log with no start that logged its pool or its
    memory; a start under another KV dtype calibrates: its cell is scaled by the architecture's ratio
    (plan/evidence.py as_started). A start of the unit as it runs (`running`, before --set) that --set's
    TP or PP moves away from is this host's all the same: the planner sets it aside and says so
    (plan/evidence.py admitted), as the more-GPUs alternative it offered was planned (plan/replan.py)."""
    from agent.plan.startcheck import alike, identity, refusal
    from agent.sglang.logs.starts import plan_figures

    if number is not None and len(names) != 1:
        raise UsageError("--start names a start of one log: give exactly one --from-log with it")
    kept: list[StartFigures] = []
    ids: list[StartIdentity] = []
    start: LoggedStart | None = None  # the newest log's, whose lines time the restart
    for name in names:
        starts, start, said = _evidence(name, number)
        ran = identity(start.lines)
        refused = refusal(ran, planned)
        if refused and (running is None or refusal(ran, running)):
            raise UsageError(
                f"--from-log {name!r}: {refused}: it cannot calibrate this plan",
                hint="give a start-up log of this host's model, or plan without --from-log",
            )
        if out is not None and said:
            print(f"deployctl: note: --from-log {name!r}: {said}", file=out.stderr)
        kept.append(plan_figures(alike(starts, start), start))  # its other failed starts bound the fraction
        ids.append(ran)
    return kept, ids, start


def _evidence(name: str, number: int | None) -> tuple[list[LoggedStart], LoggedStart, str | None]:
    """The log's start the plan reads, and which it is where the log holds several (or one was named)."""
    from agent.cli.commands.parse_log import pick
    from agent.sglang.logs.starts import evidence_said, split  # the parser loads only when a log is read

    starts = split(_lines(Path(name)))
    start = pick(starts, number, f"--from-log {name!r}")
    if start is None or not _calibrates(start.figures()):
        raise UsageError(
            f"--from-log {name!r}: no usable start in it: "
            + ("no start" if start is None else f"start {start.number} of {len(starts)}")
            + " logged neither its KV pool nor its free memory before and after the weights, so it cannot "
            "calibrate this plan",
            hint="deployctl parse-log FILE lists its starts; or plan without --from-log",
        )
    if len(starts) == 1 and number is None:
        return starts, start, None
    fraction = start.summary.mem_fraction_static
    return (
        starts,
        start,
        (
            f"the plan reads start {start.number} of {len(starts)} (line {start.first_line}, {start.outcome}"
            + (f" at --mem-fraction-static {fraction}" if fraction is not None else "")
            + ("" if number is not None else f", {evidence_said(starts, start).split(':')[0]}")
            + "); --start N reads another"
        ),
    )


def _calibrates(f: StartFigures) -> bool:
    """A start that logged its pool, or the memory before and after its weights (plan/predict.py)."""
    post = f.get("avail_mem_before_pool_gb") or f.get("avail_mem_after_weights_gb")
    return bool(
        f.get("kv_tokens") or f.get("max_total_num_tokens") or (f.get("avail_mem_before_weights_gb") and post)
    )


def _lines(path: Path) -> list[str]:
    """The log's lines, refused as parse-log refuses it when no line of it is SGLang's."""
    from agent.cli.commands.parse_log import is_sglang_log, no_sglang, read_log

    lines = read_log(path, f"--from-log {str(path)!r}")
    if not is_sglang_log(lines):
        raise no_sglang(f"--from-log {str(path)!r}")
    return lines
