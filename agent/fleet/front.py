"""deployctl fleet apply|status: validate, run the playbook, stream one line per host and phase, report."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from agent.errors import UsageError
from agent.exitcodes import ExitCode
from agent.fleet.inventory import group_hosts
from agent.fleet.results import (
    FleetEvent,
    FleetReport,
    HostStatus,
    progress_line,
    render_fleet,
    results_from_events,
)
from agent.fleet.runner import ansible_failed, forks_for, run_playbook
from agent.inventory import HostConfig, units_dir
from agent.output import Output
from agent.protocol.textrules import GROUP_NAME
from agent.sglang.flags import FlagInput


def _check(args: argparse.Namespace) -> None:
    if not (GROUP_NAME.fullmatch(args.group) or args.group == "all"):
        raise UsageError(f"group {args.group!r} is not a valid group name (letters, digits, '_', '-')")


def _printer(out: Output, as_json: bool) -> Any:
    def show(event: FleetEvent) -> None:
        if as_json:
            out.print(json.dumps(event, sort_keys=True, default=str))
            return
        line = progress_line(event)
        if line:
            out.note(line)

    return show


def check_canary(group: str, hosts: int, canary: int) -> None:
    """Refused rather than clamped: a canary bigger than the group is a typo or the wrong group, and
    clamping would restart every host at once, with no canary left to halt a bad change early."""
    if canary > hosts:
        raise UsageError(
            f"--canary {canary} is more than the {hosts} host{'s' * (hosts != 1)} in group {group}",
            hint=f"--canary {hosts} or fewer; or check the group name",
        )


def set_flags(args: argparse.Namespace, members: Sequence[HostConfig], out: Output) -> dict[str, FlagInput]:
    """--set for every host of the group, checked against each host's SGLang table before Ansible runs."""
    from agent.orchestrate.asked import warn_flag_table
    from agent.render import check_with_sglang_table

    flags: dict[str, FlagInput] = dict(args.set_flags)
    if "context-length" in flags:
        raise UsageError("--set context-length: the target context is --context")
    for name in ("mem-fraction-static", "max-running-requests"):  # as apply: the option or --set, not both
        given = getattr(args, name.replace("-", "_"), None)
        if given is not None and name in flags:
            raise UsageError(f"--set {name} and --{name} both given; use one")
        if given is not None:
            flags[name] = given
    for host in members:
        check_with_sglang_table(host, flags)
    for version in sorted({h.sglang.version for h in members}):
        warn_flag_table(out.stderr, version, dict(args.set_flags))
    return flags


def refuse_weight_cache(members: Sequence[HostConfig], flags: dict[str, FlagInput]) -> None:
    """[weight_cache]: what SGLang's daemon cannot serve (speculative decoding, a --quantization off its
    IPC allowlist) is refused here, before Ansible runs and any host is reached, as `apply` refuses it;
    each host checks its checkpoint's own quantization from its facts again (fleet/hostrun.py)."""
    from agent.apply import refuse_weight_cache as refuse

    for host in members:
        try:
            refuse(host, flags, None)
        except UsageError as exc:
            raise UsageError(f"{host.name}: {exc.message}", hint=exc.hint) from None


def apply(args: argparse.Namespace, out: Output) -> int:
    _check(args)  # --canary, --batch and --max-fail were checked by argparse (cli.commands.fleet)
    folder = units_dir(args.units)
    members = group_hosts(folder, args.group)
    hosts = [h.name for h in members]
    check_canary(args.group, len(hosts), args.canary)
    flags = set_flags(args, members, out)
    refuse_weight_cache(members, flags)
    if not args.yes and not getattr(args, "dry_run", False):
        if not out.stdin_isatty:
            raise UsageError(
                "not on a terminal and --yes not given: refusing to restart without confirmation"
            )
        if not _yes(f"roll {args.context:,} tokens out to {len(hosts)} hosts of {args.group}? [y/N] "):
            raise UsageError("not confirmed; nothing was changed")
    extra = {
        "deployctl_group": args.group,
        "deployctl_context": args.context,
        "deployctl_canary": args.canary,
        "deployctl_batch": args.batch,
        "deployctl_max_fail": args.max_fail,
        **({"deployctl_set": flags} if flags else {}),
    }
    if not args.json:
        out.note(
            f"== fleet {args.group}: {len(hosts)} hosts, canary {args.canary}, then batches of {args.batch}"
        )
    forks = forks_for(len(hosts), args.canary, args.batch)
    run = run_playbook(
        "rollout", folder, extra, forks, _printer(out, args.json), check=getattr(args, "dry_run", False)
    )
    results = results_from_events(run.events)
    if not results:
        raise ansible_failed(run)
    report = FleetReport(args.group, tuple(hosts), results, args.context)
    if args.json:
        out.print(json.dumps({"kind": "report", **report.to_dict()}, sort_keys=True, default=str))
    else:
        out.print(render_fleet(report).rstrip())
    return int(report.exit_code())


def status(args: argparse.Namespace, out: Output) -> int:
    _check(args)
    folder = units_dir(args.units)
    hosts = [h.name for h in group_hosts(folder, args.group)]
    extra: dict[str, Any] = {"deployctl_group": args.group}
    if args.context:
        extra["deployctl_context"] = args.context
    run = run_playbook("status", folder, extra, min(64, len(hosts)), lambda _e: None)
    found = {e["host"]: e["status"] for e in run.events if e.get("kind") == "status"}
    if not found:
        raise ansible_failed(run)
    rows = [
        found[h] if h in found else HostStatus(host=h, reachable=False, message="no answer") for h in hosts
    ]
    if args.json:
        out.print(json.dumps({"group": args.group, "hosts": rows}, sort_keys=True, default=str))
    else:
        out.print(f"{'host':<20} {'state':<10} {'drift':<6} {'pool':>10}  flags")
        for r in rows:
            if not r.get("reachable"):
                out.print(f"{r['host']:<20} {'unreachable':<10} {'-':<6} {'-':>10}  {r.get('message', '')}")
                continue
            flags = r.get("flags") or {}
            brief = " ".join(
                f"{k}={flags[k]}" for k in ("context-length", "mem-fraction-static") if k in flags
            )
            pool = f"{r['measured_pool']:,}" if r.get("measured_pool") else "-"
            drift = "yes" if r.get("drift") else "no"
            out.print(f"{r['host']:<20} {r.get('active') or '?':<10} {drift:<6} {pool:>10}  {brief}")
        for r in rows:  # a multi-node service with a rank down: rank 0's state alone would look fine
            if r.get("warning"):
                out.print(f"WARNING: {r['host']}: {r['warning']}")
    unreachable = any(not r.get("reachable") for r in rows)
    return int(ExitCode.UNREACHABLE if unreachable else ExitCode.OK)


def _yes(question: str) -> bool:
    """A person's yes; Ctrl-D (end of input) is no."""
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False
