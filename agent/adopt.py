"""`deployctl adopt`: a hand-written SGLang unit, as the host's `inspect` verb read it -> units/HOST.toml.

Pure: the host's answer in, TOML text out. The inventory renders (with the adopted template) a unit that
systemd runs as it ran the hand-written one: the same argv, environment, user and other directives.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tomlkit
from pydantic import ValidationError

from agent.errors import UsageError
from agent.inventory import NODE_FLAGS, VISIBLE, Nodes, visible_devices
from agent.protocol.answers import GpuRow, HomeData, InspectAnswer
from agent.sglang.flags import FlagValue, parse_flag_words
from agent.sglang.unitfile import AdoptError, command_words

TEMPLATE = "sglang-adopted.service.j2"
STOP_KEYS = ("KillMode", "TimeoutStopSec")  # rendered from [drain] by the template
DRAFT_ALGORITHMS = ("DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


@dataclass(frozen=True)
class DropIn:
    path: str
    lines: list[str]
    sets_exec_start: bool = False


@dataclass(frozen=True)
class Inspected:
    """One unit as the host's `inspect` verb described it (no secret value in it)."""

    name: str
    fragment_path: str
    problems: list[str] = field(default_factory=list)
    description: str | None = None
    user: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    secret_environment: list[str] = field(default_factory=list)
    directives: list[tuple[str, str, str]] = field(default_factory=list)
    exec_start_raw_count: int = 0
    exec_start_prefix: str = ""
    exec_path: str | None = None
    exec_argv: list[str] = field(default_factory=list)
    secret_flags: list[str] = field(default_factory=list)
    secret_directives: list[str] = field(default_factory=list)  # their values came redacted: never copied
    config_json: str | None = None
    sglang_version: str | None = None
    drop_ins: list[DropIn] = field(default_factory=list)
    home: HomeData | None = None  # the service user's home

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Inspected:
        data = dict(raw)
        data["directives"] = [tuple(d) for d in data.get("directives", [])]
        data["environment"] = dict(data.get("environment") or [])
        data["drop_ins"] = [
            DropIn(d["path"], list(d.get("lines", [])), bool(d.get("sets_exec_start")))
            for d in data.get("drop_ins", [])
        ]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def choose_unit(answer: InspectAnswer, wanted: str | None) -> Inspected:
    """The unit to adopt: --unit, else the one unit that runs SGLang; none or several is refused."""
    units = answer.get("units") or {}
    candidates = list(answer.get("candidates") or [])
    if wanted:
        if wanted not in units:
            raise UsageError(f"--unit {wanted}: no such loaded unit on the host")
        return Inspected.from_json(units[wanted])
    if not candidates:
        raise UsageError(
            "no unit on the host runs SGLang (ExecStart= with `-m sglang.launch_server` or `sglang serve`)",
            hint="name it with --unit NAME",
        )
    if len(candidates) > 1:
        raise UsageError(
            f"several units run SGLang: {', '.join(candidates)}", hint="choose one with --unit NAME"
        )
    return Inspected.from_json(units[candidates[0]])


def _refuse_unmodelable(unit: Inspected) -> None:
    where = f"{unit.name} ({unit.fragment_path})"
    if unit.problems:
        raise UsageError(f"{where}: {unit.problems[0]}")
    for d in unit.drop_ins:
        if d.sets_exec_start:
            raise UsageError(
                f"{d.path} sets ExecStart=: deployctl writes the command in {unit.fragment_path}",
                hint="move the ExecStart= into the unit file first",
            )
    if unit.exec_start_raw_count != 1 or unit.exec_path is None:
        raise UsageError(f"{where}: expected exactly one ExecStart= in the unit file")
    if unit.exec_start_prefix in tuple("-@+!:"):
        raise UsageError(f"{where}: ExecStart={unit.exec_start_prefix}... (a prefix) is not supported")
    if unit.secret_directives:
        raise UsageError(
            f"{where}: {'=, '.join(unit.secret_directives)}= holds a secret inline (e.g. SetCredential=)",
            hint="its value would have to leave the host: move it into a drop-in (left on the host as it "
            "is) or a root-only file read by LoadCredential=, then adopt",
        )
    if unit.secret_flags:
        raise UsageError(
            f"{where}: the command line holds secret flags (--{', --'.join(unit.secret_flags)})",
            hint="their values would have to leave the host: add them to the inventory by hand after adopt",
        )


def _toml_value(value: FlagValue) -> str | int | float | bool:
    """The inventory value that renders back to exactly the same word."""
    if isinstance(value, tuple):
        raise UsageError(f"a flag with several values ({' '.join(value)}) is not supported by the inventory")
    if value is True:
        return True
    assert isinstance(value, str)
    if value.isdigit() and str(int(value)) == value:
        return int(value)
    try:
        number = float(value)
    except ValueError:
        return value
    return number if repr(number) == value else value


def split_command(unit: Inspected) -> tuple[list[str], dict[str, FlagValue]]:
    """systemd's argv -> (the executable words, the flags in order); argv[0] is systemd's resolved path."""
    assert unit.exec_path is not None
    try:
        words = command_words(unit.exec_argv)
    except AdoptError as exc:
        raise UsageError(str(exc)) from None
    first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    return [unit.exec_path, *words[1:first]], parse_flag_words(words[first:])


def _gpus_table(
    gpus: Sequence[GpuRow], flags: Mapping[str, FlagValue], environment: Mapping[str, str], nnodes: int = 1
) -> Any:
    table = tomlkit.table()
    # A unit that pins its GPUs (CUDA_VISIBLE_DEVICES, kept in [unit.environment] as written, so the unit
    # runs as it ran) is a service of those GPUs alone: their count, their cards.
    visible = visible_devices(environment[VISIBLE]) if VISIBLE in environment else None
    if gpus:
        own = [g for g in gpus if visible is None or str(g.get("index")) in {str(i) for i in visible}] or gpus
        table.add("count", len(visible) if visible else len(gpus))
        if visible:
            table["count"].comment(f"the GPUs of {VISIBLE} in [unit.environment]")
        table.add("memory_gib", round(min(float(g["total_mib"]) for g in own) / 1024, 1))
        table.add("name", str(own[0]["name"]))
        return table
    # --tp-size spans every node of a multi-node service; [gpus] is one node's
    per_node = " / --nnodes" if nnodes > 1 else ""
    table.add(
        tomlkit.comment(f"CHECK: nvidia-smi gave nothing on the host; the count is --tp-size{per_node}")
    )
    table.add("count", max(1, int(str(flags.get("tp-size", flags.get("tp", "1")))) // nnodes))
    table.add("memory_gib", 80.0)
    table["memory_gib"].comment("CHECK: per GPU, as the driver reports it")
    return table


def _model_table(unit: Inspected, flags: Mapping[str, FlagValue], model_path: str) -> Any:
    model = tomlkit.table()
    model.add("path", model_path)
    served = flags.get("served-model-name")
    if isinstance(served, str):
        model.add("served_name", served)
    if unit.config_json:
        model.add("config_json", unit.config_json)
        model["config_json"].comment("the planner reads the architecture here on the host")
    else:
        model.add(tomlkit.comment("CHECK: no config.json under the model path; give the architecture here"))
    return model


def _draft_table(flags: Mapping[str, FlagValue]) -> Any | None:
    """The [draft] table when the unit runs a draft model from an absolute path; None otherwise."""
    algorithm, draft_path = flags.get("speculative-algorithm"), flags.get("speculative-draft-model-path")
    if algorithm not in DRAFT_ALGORITHMS or not isinstance(draft_path, str) or not draft_path.startswith("/"):
        return None
    draft = tomlkit.table()
    draft.add("algorithm", str(algorithm))
    draft.add("path", draft_path)
    return draft


def inventory_text(
    host: str,
    ssh_target: str,
    sudo: bool,
    unit: Inspected,
    gpus: Sequence[GpuRow] = (),
) -> str:
    """The commented units/HOST.toml for a hand-written unit."""
    _refuse_unmodelable(unit)
    executable, flags = split_command(unit)
    _refuse_one_node_of_several(unit, flags)
    command = NodeCommand(executable, flags, None, None, None, port_of(unit, flags))
    return tomlkit.dumps(_document(host, _ssh_table(ssh_target, sudo), unit, gpus, command))


def _ssh_table(target: str, sudo: bool) -> Any:
    ssh = tomlkit.table()
    ssh.add("target", target)
    ssh.add("sudo", sudo)
    return ssh


def _document(host: str, ssh: Any, unit: Inspected, gpus: Sequence[GpuRow], command: NodeCommand) -> Any:
    """The inventory's tables for `unit` running `command` ([nodes] is the caller's)."""
    flags, nnodes = command.shared, command.nnodes or 1
    model_path = flags.get("model-path")
    if not isinstance(model_path, str) or not model_path.startswith("/"):
        raise UsageError(
            f"{unit.name}: no absolute --model-path in ExecStart (a positional model path "
            "or a hub name cannot be planned for)"
        )
    doc = tomlkit.document()
    doc.add(
        tomlkit.comment(f"{host}: adopted from the hand-written {unit.fragment_path} by `deployctl adopt`.")
    )
    doc.add(tomlkit.comment("Rendering this inventory without a change gives a unit systemd runs as it ran"))
    doc.add(tomlkit.comment("that one; `deployctl apply` then changes only what its plan changes."))
    doc.add(tomlkit.nl())
    doc.add("ssh", ssh)
    doc.add("gpus", _gpus_table(gpus, flags, unit.environment, nnodes))
    doc.add("model", _model_table(unit, flags, model_path))
    draft = _draft_table(flags)
    if draft is not None:
        doc.add("draft", draft)
    doc.add("unit", _unit_table(unit))
    doc.add("sglang", _sglang_table(unit, command.executable, flags, command.port))
    return doc


def port_of(unit: Inspected, flags: Mapping[str, FlagValue]) -> int:
    port = _int_flag(unit, flags, "port")
    return 30000 if port is None else port


def _int_flag(unit: Inspected, flags: Mapping[str, FlagValue], name: str) -> int | None:
    value = flags.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.isdigit():
        raise UsageError(f"{unit.name}: --{name} {value!r} is not a number")
    return int(value)


def _refuse_one_node_of_several(unit: Inspected, flags: Mapping[str, FlagValue]) -> None:
    """A unit of a multi-node service (--nnodes N > 1) is adopted with every node's unit (--node)."""
    nnodes = _int_flag(unit, flags, "nnodes") or 1
    if nnodes <= 1:
        return
    rank = _int_flag(unit, flags, "node-rank") or 0
    others = " ".join(f"--node TARGET{r}" for r in range(1, nnodes))
    raise UsageError(
        f"{unit.name} runs node rank {rank} of {nnodes} (--nnodes {nnodes}): adopt reads every node, "
        f"--ssh TARGET0 (node rank 0) {others}, in rank order",
        hint="one inventory with [nodes] for all of them",
    )


# A multi-node service written by hand: one unit per node, the same but for --node-rank (and --port where
# nodes share one machine's network), read into one inventory with [nodes].

DIST_ALIAS = "nccl-init-addr"  # SGLang's other name for --dist-init-addr
OWN_FLAGS = (*NODE_FLAGS, DIST_ALIAS, "port")  # a node's own; [nodes] and [sglang] port render them


@dataclass(frozen=True)
class Node:
    """One node of a multi-node service: its SSH target and its unit as `inspect` read it."""

    target: str
    unit: Inspected


@dataclass(frozen=True)
class NodeCommand:
    """A unit's ExecStart=: the executable, the flags every node shares, and the node's own (a single-node
    unit: all its flags are `shared`, the node's own are None)."""

    executable: list[str]
    shared: dict[str, FlagValue]
    nnodes: int | None
    rank: int | None
    dist_init_addr: str | None
    port: int


def check_node_targets(ssh_target: str, others: Sequence[str]) -> None:
    """--ssh and each --node name a different host (checked before any connection)."""
    if ssh_target in others:
        raise UsageError(f"--node {ssh_target}: it is --ssh, node rank 0")
    for i, target in enumerate(others):
        if target in others[:i]:
            raise UsageError(f"--node {target} is given twice")


def pick_node_unit(answer: InspectAnswer, name: str, target: str) -> Inspected:
    """Node `target`'s unit of the name node rank 0 runs."""
    units = answer.get("units") or {}
    if name not in units:
        raise UsageError(f"node {target}: no loaded unit {name} (the unit of node rank 0)")
    return Inspected.from_json(units[name])


def node_command(node: Node) -> NodeCommand:
    """What a node's unit runs; a unit adopt cannot model is refused with the node's name."""
    try:
        _refuse_unmodelable(node.unit)
        executable, flags = split_command(node.unit)
        addr = flags.get("dist-init-addr", flags.get(DIST_ALIAS))
        return NodeCommand(
            executable=executable,
            shared={k: v for k, v in flags.items() if k not in OWN_FLAGS},
            nnodes=_int_flag(node.unit, flags, "nnodes"),
            rank=_int_flag(node.unit, flags, "node-rank"),
            dist_init_addr=addr if isinstance(addr, str) else None,
            port=port_of(node.unit, flags),
        )
    except UsageError as exc:
        raise UsageError(f"node {node.target}: {exc.message}", hint=exc.hint) from None


def nodes_inventory_text(host: str, sudo: bool, nodes: Sequence[Node], gpus: Sequence[GpuRow] = ()) -> str:
    """The commented units/HOST.toml for a multi-node service written by hand: `nodes` in rank order,
    node rank 0 first; `gpus` are node rank 0's."""
    check_node_targets(nodes[0].target, [n.target for n in nodes[1:]])
    commands = [node_command(n) for n in nodes]
    for rank, (node, command) in enumerate(zip(nodes, commands, strict=True)):
        _check_position(node, rank, command, len(nodes), commands[0].dist_init_addr)
        detail = _first_difference(nodes[0], commands[0], node, command)
        if detail:
            raise UsageError(
                f"node {node.target} (rank {rank}) differs from node rank 0 ({nodes[0].target}): {detail}",
                hint="an inventory renders the same unit on every node but for --node-rank (and --port, "
                "kept in [nodes] ports): make the units the same first",
            )
    doc = _document(host, _ssh_table(nodes[0].target, sudo), nodes[0].unit, gpus, commands[0])
    doc.add("nodes", _nodes_table(nodes, commands))
    return tomlkit.dumps(doc)


def _check_position(node: Node, rank: int, command: NodeCommand, count: int, addr: str | None) -> None:
    """The node's --nnodes, --node-rank and --dist-init-addr say it is node `rank` of these `count`."""
    where = f"node {node.target} ({node.unit.name})"
    if command.nnodes != count:
        given = "missing" if command.nnodes is None else f"--nnodes {command.nnodes}"
        raise UsageError(f"{where}: {given}, but {count} nodes are given (--ssh and {count - 1} --node)")
    # SGLang's --node-rank defaults to 0: node rank 0 may leave it out
    found = command.rank if command.rank is not None or rank > 0 else 0
    if found != rank:
        raise UsageError(
            f"{where}: --node-rank {'missing' if found is None else found}, but it is given as node rank "
            f"{rank} (--ssh is rank 0, then each --node in order)"
        )
    if addr is None:
        raise UsageError(f"{where}: no --dist-init-addr (node rank 0's HOST:PORT for the rendezvous)")
    if command.dist_init_addr != addr:
        raise UsageError(
            f"{where}: --dist-init-addr {command.dist_init_addr or 'missing'}, node rank 0 has {addr}"
        )


def _first_difference(a: Node, ca: NodeCommand, b: Node, cb: NodeCommand) -> str | None:
    """The first thing node b's unit does otherwise than node rank 0's (a), or None."""
    ua, ub = a.unit, b.unit
    plain: list[tuple[str, object, object]] = [
        ("unit", ua.name, ub.name),
        ("unit folder", posixpath.dirname(ua.fragment_path), posixpath.dirname(ub.fragment_path)),
        ("executable", " ".join(ca.executable), " ".join(cb.executable)),
        ("User=", ua.user, ub.user),
        ("Description=", ua.description, ub.description),
        ("SGLang version", ua.sglang_version, ub.sglang_version),
        ("secret variables", ", ".join(ua.secret_environment), ", ".join(ub.secret_environment)),
    ]
    for what, mine, theirs in plain:
        if mine != theirs:
            return f"{what} {_shown(theirs)} here, {_shown(mine)} on rank 0"
    return (
        _mapping_difference("--", ca.shared, cb.shared)
        or _mapping_difference("Environment ", ua.environment, ub.environment)
        or _directive_difference(ua, ub)
    )


def _shown(value: object) -> str:
    return "missing" if value is None or value == "" else "given" if value is True else str(value)


def _mapping_difference(prefix: str, a: Mapping[str, object], b: Mapping[str, object]) -> str | None:
    for key in [*a, *(k for k in b if k not in a)]:
        if a.get(key) != b.get(key):
            return f"{prefix}{key} {_shown(b.get(key))} here, {_shown(a.get(key))} on rank 0"
    return None


def _directive_difference(a: Inspected, b: Inspected) -> str | None:
    """The first directive (outside the stop, which the template renders) that differs."""
    la, lb = ([f"[{s}] {k}={v}" for s, k, v in u.directives if k not in STOP_KEYS] for u in (a, b))
    for i in range(max(len(la), len(lb))):
        mine, theirs = (la[i] if i < len(la) else None), (lb[i] if i < len(lb) else None)
        if mine != theirs:
            return f"directive {_shown(theirs)} here, {_shown(mine)} on rank 0"
    return None


def _nodes_table(nodes: Sequence[Node], commands: Sequence[NodeCommand]) -> Any:
    """[nodes]: the other nodes in rank order, the rendezvous, and their --port where it is not rank 0's."""
    ports = [c.port for c in commands[1:]]
    try:
        section = Nodes(
            others=[n.target for n in nodes[1:]],
            dist_init_addr=str(commands[0].dist_init_addr),
            ports=ports if any(p != commands[0].port for p in ports) else None,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{nodes[0].unit.name}: [nodes] {where}: {err['msg']}") from None
    table = tomlkit.table()
    table.add(tomlkit.comment("Node rank 0 is [ssh] target; each node's unit gets its own --node-rank."))
    table.add("others", list(section.others))
    table.add("dist_init_addr", section.dist_init_addr)
    if section.ports is not None:
        table.add("ports", list(section.ports))
        table["ports"].comment("their --port, as written by hand ([sglang] port is node rank 0's)")
    return table


def _service_value(unit: Inspected, key: str) -> str | None:
    """The last assignment of a [Service] directive in the unit file, as systemd would take it."""
    values = [v.strip() for s, k, v in unit.directives if s == "Service" and k == key]
    return values[-1] if values else None


def stop_notes(unit: Inspected, stop_timeout_s: int) -> list[str]:
    """What the hand-written unit's stop does to requests in flight, and what the first apply renders."""
    kill = _service_value(unit, "KillMode")
    stop = _service_value(unit, "TimeoutStopSec") or _service_value(unit, "TimeoutSec")
    notes = []
    if (kill or "control-group") != "mixed":
        notes.append(
            f"{unit.name} stops with KillMode={kill or 'control-group (systemd default)'}: SIGTERM reaches "
            "SGLang's schedulers too, which have no handler and die at once, so every stop or restart cuts "
            "the requests in flight (the log says 'Subprocess scheduler_0 ... crashed with exit code -15' "
            "and 'SIGQUIT received')"
        )
    if kill != "mixed" or stop != str(stop_timeout_s):
        notes.append(
            f"the first apply renders KillMode=mixed and TimeoutStopSec={stop_timeout_s} (was "
            f"{stop or '90s, the default'}): SGLang's own SIGTERM drain gets [drain] timeout_s"
        )
    for d in unit.drop_ins:
        for line in d.lines:
            if re.match(r"\[Service\] (KillMode|TimeoutStopSec|TimeoutSec)=", line):
                notes.append(
                    f"the drop-in {d.path} sets {line.split('] ', 1)[1]}: it overrides the rendered unit"
                )
    return notes


_YES = ("1", "yes", "true", "on")


def cache_notes(unit: Inspected) -> list[str]:
    """Where SGLang's compile caches (DeepGEMM, FlashInfer, Triton, Inductor, JIT: minutes per start)
    would land, when that is a place that does not survive a restart or cannot be written."""
    env = unit.environment
    if "SGLANG_CACHE_DIR" in env:
        base, why = env["SGLANG_CACHE_DIR"], "SGLANG_CACHE_DIR"
    else:
        home = env.get("HOME") or (unit.home.get("path") if unit.home else None)
        base, why = (f"{home}/.cache/sglang" if home else "~/.cache/sglang"), "SGLang's default"
    notes = []
    private = (_service_value(unit, "PrivateTmp") or "no").lower() in _YES
    if private and base.startswith(("/tmp/", "/var/tmp/")):
        notes.append(
            f"SGLang's compile caches go to {base} ({why}), in a private /tmp (PrivateTmp=yes) that is "
            "emptied at every stop: each start compiles again"
        )
    lost = _home_lost(unit)
    if lost and "SGLANG_CACHE_DIR" not in env and "HOME" not in env:
        notes.append(
            f"SGLang's compile caches go to {base} ({why}), which {unit.user or 'root'} cannot keep "
            f"({lost}): each start compiles again; set SGLANG_CACHE_DIR (unit.environment) to a folder "
            "of CacheDirectory= (unit.verbatim)"
        )
    return notes


def _home_lost(unit: Inspected) -> str | None:
    """Why the service user's home cannot hold a cache, or None."""
    protect = (_service_value(unit, "ProtectHome") or "no").lower()
    if protect in (*_YES, "read-only", "tmpfs"):
        return f"ProtectHome={protect}"
    if unit.home is not None and not unit.home.get("writable"):
        return f"its home {unit.home.get('path') or '(none)'} is missing or not writable"
    return None


def _verbatim_table(unit: Inspected) -> Any:
    """The directives the template does not model, section by section, as written; the stop (KillMode=,
    TimeoutStopSec=) is the template's, derived from [drain]."""
    verbatim = tomlkit.table()
    for section in ("Unit", "Service", "Install"):
        lines = [f"{k}={v}" for s, k, v in unit.directives if s == section and k not in STOP_KEYS]
        if lines:
            array = tomlkit.array()
            array.extend(lines)
            array.multiline(True)
            verbatim.add(section, array)
    others = sorted({s for s, _k, _v in unit.directives} - {"Unit", "Service", "Install"})
    if others:
        raise UsageError(f"{unit.name}: section [{others[0]}] is not supported in an adopted unit")
    return verbatim


def _unit_table(unit: Inspected) -> Any:
    table = tomlkit.table()
    table.add("name", unit.name)
    table.add("directory", posixpath.dirname(unit.fragment_path))
    table.add("template", TEMPLATE)
    # systemd's own Description is the unit's name when the file gives none
    table.add("description", unit.description if unit.description is not None else unit.name)
    if unit.user:
        table.add("user", unit.user)
    if unit.environment:
        env = tomlkit.inline_table()
        env.update(unit.environment)
        table.add("environment", env)
    if unit.secret_environment:
        table.add(
            tomlkit.comment("Values never left the host: the first apply moves them from the unit into")
        )
        table.add(tomlkit.comment("a root-only file (EnvironmentFile=) and keeps them there."))
        table.add("secret_environment", list(unit.secret_environment))
        table.add("secret_environment_on_host", list(unit.secret_environment))
    verbatim = _verbatim_table(unit)
    if unit.drop_ins:
        table.add(tomlkit.comment("Drop-ins: left on the host as they are; systemd keeps merging them."))
        for d in unit.drop_ins:
            table.add(tomlkit.comment(f"  {d.path}"))
            for line in d.lines:
                table.add(tomlkit.comment(f"    {line}"))
    if verbatim:
        table.add(tomlkit.comment("The directives the template does not model, kept exactly as written."))
        table.add("verbatim", verbatim)
    return table


def _sglang_table(unit: Inspected, executable: list[str], flags: Mapping[str, FlagValue], port: int) -> Any:
    table = tomlkit.table()
    table.add(tomlkit.comment("As the unit runs it: [python, -m, sglang.launch_server] or [sglang, serve]"))
    table.add("executable", executable)
    if unit.sglang_version:
        table.add("version", unit.sglang_version)
    else:
        table.add(tomlkit.comment("CHECK: SGLang's version was not found next to the executable"))
    table.add("host", str(flags.get("host", "127.0.0.1")))
    table.add("port", port)
    baseline = tomlkit.table()
    for name, value in flags.items():
        baseline.add(name, _toml_value(value))
    table.add(tomlkit.comment("The flags in the order the unit gives them; the planner changes a few."))
    table.add("flags", baseline)
    return table
