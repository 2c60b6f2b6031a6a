"""What the collection's action plugins do, typed and testable without Ansible: args in, result out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from agent.errors import DeployError
from agent.fleet import events
from agent.fleet.calibrate import MeasuredFact, peers_for
from agent.fleet.hostrun import apply_host, host_status, measurement, rollback_host
from agent.fleet.results import HostResult, HostResultData, HostStatus
from agent.inventory import HostConfig, load_host, units_dir
from agent.orchestrate.asked import ArgError, parse_context
from agent.render import check_with_sglang_table
from agent.sglang.flags import FlagInput

FACT = "deployctl_measured"


class ModuleResult(HostResultData, total=False):
    """What an action gives Ansible: the host's result (or why its arguments were refused), and a message."""

    msg: str
    ansible_facts: dict[str, MeasuredFact]  # a canary's measurement, under FACT
    deployctl: HostStatus  # sglang_facts'


def raw_fact(hostvars: Any, name: str) -> Mapping[str, Any] | None:
    """A host's measurement fact from Ansible's hostvars, without templating anything."""
    try:
        found = hostvars.raw_get(name).get(FACT) if hasattr(hostvars, "raw_get") else hostvars[name].get(FACT)
    except (KeyError, AttributeError):
        return None
    return dict(found) if isinstance(found, Mapping) else None


def _host(args: Mapping[str, Any], task_vars: Mapping[str, Any]) -> HostConfig:
    name = str(args.get("host") or task_vars.get("inventory_hostname"))
    folder = args.get("units_dir") or task_vars.get("deployctl_units_dir")
    return load_host(name, units_dir(str(folder) if folder else None))


def _context(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return parse_context(str(value), "context")
    except ArgError as exc:
        raise DeployError(str(exc)) from None


def _set_flags(host: HostConfig, value: Any) -> dict[str, FlagInput]:
    """`set:` FLAG: VALUE pairs (deployctl fleet apply --set), checked against SGLang's table."""
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in value.items()
    ):
        raise DeployError("set: must map flag names to values, e.g. {kv-cache-dtype: fp8_e4m3}")
    flags: dict[str, FlagInput] = dict(value)
    check_with_sglang_table(host, flags)
    return flags


def _module_result(result: HostResult) -> ModuleResult:
    data = cast(ModuleResult, result.to_dict())  # a result with no message or facts yet
    data["msg"] = f"{result.host}: {result.outcome}: {result.message}"
    events.write({"kind": "result", "host": result.host, "result": result.to_dict()})
    return data


def _bad_args(exc: DeployError) -> ModuleResult:
    return {"failed": True, "changed": False, "outcome": "error", "msg": exc.message}


def apply(
    args: Mapping[str, Any],
    task_vars: Mapping[str, Any],
    peer_facts: list[Mapping[str, Any]],
    check: bool = False,
) -> ModuleResult:
    """sglang_apply: the host's result; a canary also publishes its measured start as a fact."""
    try:
        host = _host(args, task_vars)
        context = _context(args.get("context"))
        flags = _set_flags(host, args.get("set"))
    except DeployError as exc:
        return _bad_args(exc)
    peers = peers_for(host, task_vars.get("deployctl_flags") or dict(host.sglang.flags), peer_facts)
    result = apply_host(host, context, peers, events.emitter(host.name), check=check, flags=flags)
    data = _module_result(result)
    measured = measurement(host, result)
    if args.get("canary") and measured is not None:
        data["ansible_facts"] = {FACT: measured.to_fact()}
    return data


def rollback(args: Mapping[str, Any], task_vars: Mapping[str, Any]) -> ModuleResult:
    try:
        host = _host(args, task_vars)
    except DeployError as exc:
        return _bad_args(exc)
    to = args.get("to")
    return _module_result(rollback_host(host, str(to) if to else None, events.emitter(host.name)))


def facts(args: Mapping[str, Any], task_vars: Mapping[str, Any]) -> ModuleResult:
    """sglang_facts: read-only; unreachable hosts fail so that a status run shows them."""
    try:
        host = _host(args, task_vars)
        context = _context(args["context"]) if args.get("context") else None
    except DeployError as exc:
        return _bad_args(exc)
    status = host_status(host, context)
    events.write({"kind": "status", "host": host.name, "status": status})
    return {
        "changed": False,
        "failed": not status["reachable"],
        "deployctl": status,
        "msg": status.get("message", ""),
    }
