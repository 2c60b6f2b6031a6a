"""`deployctl plan` and `deployctl render` of a [pd] service: one plan and one unit per role's unit, and the
router's unit; every refusal (agent/pd/refusals.py) before anything else is said."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from agent.cli.options import change_of
from agent.errors import InventoryError, RenderError, UsageError
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change
from agent.output import Output
from agent.sglang.flags import FlagInput

if TYPE_CHECKING:
    from agent.pd.plan import RolePlan


def _only_context(args: argparse.Namespace) -> Change:
    """The context and the fraction (--mem-fraction-static or --set mem-fraction-static, for every role):
    the rest of each role's flags are its [pd] unit's."""
    change = change_of(args)
    typed = [f"--set {name}" for name, _ in change.flags]
    if change.max_running_requests is not None:  # named as typed: its option, or --set
        by_option = getattr(args, "max_running_requests", None) is not None
        typed.append("--max-running-requests" if by_option else "--set max-running-requests")
    if typed:
        raise UsageError(
            f"{', '.join(typed)}: not for a [pd] service (--set takes mem-fraction-static alone); set each "
            "role's flags in its [pd] unit"
        )
    if getattr(args, "from_log", None):
        raise UsageError("--from-log: not for a [pd] service yet; plan it from the inventory (--offline)")
    start = getattr(args, "start", None)
    if isinstance(start, int) and not isinstance(start, bool):  # plan's --start N; apply's is a flag
        raise UsageError(
            "--start names a start of one --from-log log: not for a [pd] service, which reads none"
        )
    return change


def _refuse(said: tuple[str, ...]) -> None:
    if said:
        more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
        raise InventoryError(f"{said[0]}{more}", hint="nothing was changed on any host")


def _warn(out: Output, warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        print(f"deployctl: warning: {warning}", file=out.stderr)


def _planned(out: Output, host: HostConfig, change: Change) -> list[RolePlan]:
    """Every refusal (the inventory's, then each decode's pool against its plan), warnings, then the plans:
    plan and render refuse alike (docs/pd.md)."""
    from agent.pd import plan as pd_plan
    from agent.pd.refusals import check

    _refuse(check(host).refusals)  # the inventory's own refusals before any planning
    plans = pd_plan.role_plans(host, change.context, change.mem_fraction_static)
    verdict = check(host, decodes=pd_plan.decode_needs(plans, change.context))
    # a decode's pool at a context SGLang refuses is moot: the context is named first (else plan ends
    # NOT FEASIBLE on it, as a plain service's plan does)
    _refuse((*longer_context(plans, change.context)[:1], *verdict.refusals) if verdict.refusals else ())
    _warn(out, verdict.warnings)
    return plans


def longer_context(plans: list[RolePlan], context: int) -> list[str]:
    """Each role's SGLang refusal of a context above the model's own (configs/model_config.py
    _derive_context_length), unless its environment sets SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN."""
    from agent.plan.refusals import longer_context as said

    return list(dict.fromkeys(s for p in plans for s in said(p.unit.host, context)))


def plan(args: argparse.Namespace, out: Output, host: HostConfig) -> int:
    """Plan every unit from the inventory; a refusal exits 2, a prefill short of its need NOT_FEASIBLE."""
    from agent.pd import plan as pd_plan

    change = _only_context(args)
    plans = _planned(out, host, change)
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


def _fraction_notes(out: Output, host: HostConfig, plans: list[RolePlan], context: str) -> None:
    """render does not plan, as a plain service's render (cli/commands/render.py pool_note): each unit
    keeps its fraction; what plan chose, and that apply renders it, said out loud."""
    for p in plans:
        kept = p.unit.host.sglang.flags.get("mem-fraction-static", "SGLang's default")
        print(
            f"deployctl: note: {p.unit.label}: this unit keeps --mem-fraction-static {kept}; "
            f"`deployctl plan {host.name} --context {context}` chooses {p.plan.mem_fraction_static:.3f} and "
            "apply renders it (or give --mem-fraction-static)",
            file=out.stderr,
        )


def render(args: argparse.Namespace, out: Output, host: HostConfig) -> int:
    """Every role's unit through the one renderer, then the router's unit in PD mode."""
    from agent.pd.router import render_router_unit, router_unit_name
    from agent.pd.units import pd_units, router_target, spec
    from agent.verify import render_checked, verify_unit

    if args.diff:
        raise UsageError("--diff: not for a [pd] service yet; render prints each unit")
    change = _only_context(args)
    plans = _planned(out, host, change)
    _warn(out, tuple(longer_context(plans, change.context)))  # plan says NOT FEASIBLE on it (exit 8)
    flags: dict[str, FlagInput] = {"context-length": change.context}
    if change.mem_fraction_static is not None:
        flags["mem-fraction-static"] = change.mem_fraction_static
    else:
        _fraction_notes(out, host, plans, args.context)
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
