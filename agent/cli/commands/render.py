"""`deployctl render HOST`: print the unit a change would install, or its differences from the baseline."""

from __future__ import annotations

import argparse
import json

from agent.cli.options import OPTION_FLAGS, add_set_arg, add_target_args
from agent.errors import UsageError
from agent.group.nodes import node_host
from agent.inventory import HostConfig, load_service, units_dir
from agent.orchestrate.asked import warn_flag_table
from agent.output import Output
from agent.sglang.flags import FlagInput, diff_flags, flag_table, parse_unit_flags

# agent.render (jinja2) and agent.verify load inside the functions: every command builds this parser,
# and apply loads them only once its facts request is on its way (agent/deploy.py).


def configure(p: argparse.ArgumentParser) -> None:
    add_target_args(p, context_required=True)
    add_set_arg(p)
    p.add_argument(
        "--diff",
        action="store_true",
        help="show the flag changes and a unified diff against the host's baseline unit instead",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: the unit's text, or with --diff its flag changes and the diff",
    )
    p.epilog = (
        "example: deployctl render ct200 --context 200k --set mem-fraction-static=0.94 --diff\n"
        "example: deployctl render ct200 --context 200k --mem-fraction-static 0.93 --json"
    )


def requested_flags(args: argparse.Namespace) -> dict[str, FlagInput]:
    """The flags asked for on the command line; a flag given both ways is refused."""
    flags: dict[str, FlagInput] = dict(args.set_flags)
    for flag, (attr, _) in OPTION_FLAGS.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        if flag in flags:
            raise UsageError(f"--set {flag} and --{attr.replace('_', '-')} both given; use one")
        flags[flag] = value
    return flags


def diff_report(host: HostConfig, baseline: str, text: str, flags: dict[str, FlagInput]) -> str:
    """The flag table and the unified diff against the baseline unit, secrets redacted."""
    from agent.render import redact, redact_changes, secret_values, secrets_line, unit_diff

    changes = redact_changes(diff_flags(parse_unit_flags(baseline), parse_unit_flags(text)))
    secret = host.unit.secret_environment
    if not changes and baseline == text:
        return f"{host.unit.name} for {host.name}: no change from the baseline unit\n"
    table = flag_table(changes) if changes else "no flag changes"
    diff = redact(unit_diff(baseline, text, host.unit.name), secret)
    env, secret_flags = secret_values(host, flags)
    said = secrets_line(host, env, secret_flags) + "\n" if env or secret_flags else ""
    return f"flags of {host.unit.name} on {host.name}, baseline -> rendered:\n{table}\n{said}\n{diff}"


def pool_note(host: HostConfig, flags: dict[str, FlagInput]) -> str | None:
    """render does not plan: a context raised with the fraction kept is the seed's trap, said out loud."""
    context = flags.get("context-length")
    before = host.sglang.flags.get("context-length")
    if "mem-fraction-static" in flags or not isinstance(context, int):
        return None
    if isinstance(before, (int, str)) and str(before).isdigit() and context <= int(before):
        return None
    kept = host.sglang.flags.get("mem-fraction-static", "SGLang's default")
    return (
        f"--context-length alone does not grow the KV pool: this unit keeps --mem-fraction-static {kept}. "
        f"`deployctl plan {host.name} --context {context}` chooses the fraction; apply plans it itself"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from agent.apply import refuse_weight_cache
    from agent.render import render_unit, template_dir
    from agent.sglang import version_flags
    from agent.verify import render_checked

    loaded = load_service(args.host, units_dir(args.units))
    if loaded.pd is not None:  # a prefill-decode service: each role's unit and the router's
        from agent.cli.commands import pd

        return pd.render(args, out, loaded)
    host = node_host(loaded, 0)  # a multi-node service: rank 0
    flags = requested_flags(args)
    refuse_weight_cache(host, flags, None)  # as apply refuses it, before a unit it would not install
    text = render_checked(host, flags)
    warn_flag_table(out.stderr, host.sglang.version, dict(args.set_flags))
    for warning in version_flags.deprecated(host.sglang.version, {**host.sglang.flags, **flags}):
        print(f"deployctl: warning: {warning}", file=out.stderr)
    said = pool_note(host, flags)
    if said:
        print(f"deployctl: note: {said}", file=out.stderr)
    if args.json:
        baseline = render_unit(host, {}, template_dir()) if args.diff else None
        out.print(json.dumps(json_report(host, baseline, text), sort_keys=True))
    elif args.diff:
        report = diff_report(host, render_unit(host, {}, template_dir()), text, flags)
        out.write(report)
    else:
        out.write(text)
    return 0


def json_report(host: HostConfig, baseline: str | None, text: str) -> dict[str, object]:
    """render --json: the unit (secrets are never in it), or with a baseline the redacted changes and diff."""
    from agent.render import redact, redact_changes, unit_diff

    doc: dict[str, object] = {"host": host.name, "unit_name": host.unit.name}
    if baseline is None:
        return {**doc, "unit": text}
    changes = redact_changes(diff_flags(parse_unit_flags(baseline), parse_unit_flags(text)))
    return {
        **doc,
        "changes": [{"flag": c.name, "before": c.before, "after": c.after} for c in changes],
        "diff": redact(unit_diff(baseline, text, host.unit.name), host.unit.secret_environment),
    }
