"""`deployctl plan` and `deployctl render` of a [pd] service: one plan and one unit per role's unit, and the
router's unit; every refusal (agent/pd/refusals.py) before anything else is said."""

from __future__ import annotations

import argparse
import json

from agent.cli.options import change_of
from agent.errors import InventoryError, RenderError, UsageError
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change
from agent.output import Output
from agent.sglang.flags import FlagInput


def _only_context(args: argparse.Namespace) -> Change:
    """The context and the fraction (--mem-fraction-static or --set mem-fraction-static, for every role):
    the rest of each role's flags are its [pd] unit's."""
    change = change_of(args)
    if change.flags or change.max_running_requests is not None:
        raise UsageError(
            "--set and --max-running-requests: not for a [pd] service; set each role's flags in its [pd] unit"
        )
    if getattr(args, "from_log", None):
        raise UsageError("--from-log: not for a [pd] service yet; plan it from the inventory (--offline)")
    return change


def _refuse(said: tuple[str, ...]) -> None:
    if said:
        more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
        raise InventoryError(f"{said[0]}{more}", hint="nothing was changed on any host")


def _warn(out: Output, warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        print(f"deployctl: warning: {warning}", file=out.stderr)


def plan(args: argparse.Namespace, out: Output, host: HostConfig) -> int:
    """Plan every unit from the inventory; a refusal exits 2, a prefill short of its need NOT_FEASIBLE."""
    from agent.pd import plan as pd_plan
    from agent.pd.refusals import check

    change = _only_context(args)
    context = change.context
    _refuse(check(host).refusals)  # the inventory's own refusals before any planning
    plans = pd_plan.role_plans(host, context, change.mem_fraction_static)
    verdict = check(host, decodes=pd_plan.decode_needs(plans, context))
    _refuse(verdict.refusals)
    _warn(out, verdict.warnings)
    if not args.offline:
        print(
            "deployctl: note: a [pd] service is planned from its inventory; its hosts are not asked yet",
            file=out.stderr,
        )
    if args.json:
        doc = {"service": host.name, "trade": pd_plan.TRADE, "roles": [p.to_dict() for p in plans]}
        out.print(json.dumps(doc, indent=2))
    else:
        out.print(pd_plan.text(host, plans))
    feasible = all(p.feasible for p in plans)
    return 0 if feasible else int(ExitCode.NOT_FEASIBLE)


def render(args: argparse.Namespace, out: Output, host: HostConfig) -> int:
    """Every role's unit through the one renderer, then the router's unit in PD mode."""
    from agent.pd.refusals import check
    from agent.pd.router import render_router_unit, router_unit_name
    from agent.pd.units import pd_units, router_target, spec
    from agent.verify import render_checked, verify_unit

    if args.diff:
        raise UsageError("--diff: not for a [pd] service yet; render prints each unit")
    change = _only_context(args)
    verdict = check(host)
    _refuse(verdict.refusals)
    _warn(out, verdict.warnings)
    flags: dict[str, FlagInput] = {"context-length": change.context}
    if change.mem_fraction_static is not None:
        flags["mem-fraction-static"] = change.mem_fraction_static
    units = [(u.target, u.host.unit.name, render_checked(u.host, flags)) for u in pd_units(host)]
    router = router_unit_name(host, spec(host).router)
    units.append((router_target(host), router, render_router_unit(host)))
    complaint = verify_unit(units[-1][2], router)
    if complaint:
        raise RenderError(
            f"systemd-analyze verify refused the rendered {router}: {'; '.join(complaint.splitlines())}"
        )
    if args.json:
        doc = {"service": host.name, "units": [{"target": t, "unit_name": n, "unit": x} for t, n, x in units]}
        out.print(json.dumps(doc, sort_keys=True))
    else:
        out.write("".join(f"# ---- {name} on {target}\n{text}" for target, name, text in units))
    return 0
