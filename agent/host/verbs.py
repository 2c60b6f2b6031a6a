"""The agent's verbs on the host: the read-only ones (facts, backups, status) answer here; the changing
ones (apply, rollback, recover) and follow go to the runner."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO, cast

from agent import __version__
from agent.host import adopt, hostmem, model_facts, runner
from agent.host.change import orphans
from agent.host.roles import pdfacts
from agent.host.state import StateDir
from agent.host.systemd import Systemd, SystemdError
from agent.host.units import UnitFiles
from agent.host.watch import gpu_at_start
from agent.host.watch.journal import Journal
from agent.protocol.answers import (
    BackupRow,
    BackupsAnswer,
    GpuRow,
    HostFacts,
    SignalAnswer,
    StatusAnswer,
    UnitStateData,
    UnitView,
)
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import EventJson
from agent.protocol.requests import Request
from agent.sglang.flags import FlagsError, FlagValue, diff_flags, parse_unit_flags
from agent.sglang.logs.summary import StartFigures, start_figures
from agent.sglang.redact import redact, redact_changes, redact_flags, redact_log_line
from agent.sglang.weight_cache import daemon_unit_name

CHANGING_VERBS = ("apply", "rollback", "recover")


def dispatch(req: Request, out: TextIO) -> int:
    if req.verb in CHANGING_VERBS:
        return runner.start(req, out)
    if req.verb == "compare":
        return runner.compare(req, out)
    if req.verb == "follow":
        assert req.txn is not None
        return runner.follow(req, req.txn, out)
    verbs: dict[str, Callable[[Request], Mapping[str, object]]] = {
        "facts": facts, "backups": backups, "status": status, "inspect": adopt.inspect, "signal": signal
    }  # fmt: skip
    result = dict(verbs[req.verb](req))
    result["orphan"] = orphans.orphaned(req, lambda: runner.running(req))
    out.write(json.dumps(result, sort_keys=True, default=str) + "\n")
    return 0


# -- read-only verbs ---------------------------------------------------------------------------
def facts(req: Request) -> HostFacts:
    """What the laptop needs to plan: the unit, its flags, the service state, the last start's figures."""
    files = UnitFiles(req.unit_dir)
    text = files.read(req.unit)
    lines = Journal().last_invocation_lines(req.unit, 20000)
    state_dir = StateDir(req.state_dir)
    view = unit_view(text, req.secret_names)
    state = _state(req.unit)
    # what the GPU processes held when the running start logged its pool, if the agent watched that start
    at_start = gpu_at_start.load(state_dir.unit_dir(req.unit), state["invocation_id"] if state else "")
    return {
        "agent_version": __version__,
        "unit_text": view["unit_text"],
        "unit_sha256": view["unit_sha256"],
        "flags": view["flags"],
        "state": state,
        "last_start": _last_start(lines),
        "history": state_dir.history(req.unit, 10),
        "gpus": _gpus(),
        "lock": runner.running(req),
        "last_txn": state_dir.last_txn(req.unit),
        "backups": [b.name for b in files.backups(req.unit)],
        "model_facts": model_facts.collect(text, lines, req.secret_names, req.unit, at_start),
        "mem_available_bytes": _mem_available(),
        "host_memory": hostmem.collect(req.unit),
        # the unit about to be written (a [pd] apply sends it), else the installed one
        "pd": pdfacts.collect(req.unit_text or text, req.secret_names),
    }


def _mem_available() -> int | None:
    """MemAvailable: what the page cache can hold of the checkpoint (plan/restart_time.py)."""
    from agent.host.prewarm import mem_available

    try:
        return mem_available() or None
    except OSError:
        return None


def unit_view(text: str | None, secret_names: Sequence[str]) -> UnitView:
    """The installed unit as it may leave the host: its text and flags with secret values replaced by ***
    (Environment= of secret-looking names, secret --flags, SetCredential= data), and the sha256 of the
    real text, which is what an apply must name to change it."""
    flags = _flags(text)
    return {
        "unit_text": redact(text, secret_names) if text is not None else None,
        "unit_sha256": sha256(text) if text is not None else None,
        "flags": redact_flags(flags) if flags is not None else None,
    }


def _last_start(lines: Sequence[str]) -> StartFigures | None:
    """The newest start's figures; the failure line it quotes with secret values replaced."""
    if not lines:
        return None
    figures = start_figures(lines)
    failure = figures.get("failure")
    if isinstance(failure, dict) and isinstance(failure.get("line"), str):
        figures["failure"] = {**failure, "line": redact_log_line(failure["line"])}
    return figures


def backups(req: Request) -> BackupsAnswer:
    """Newest first, each with its flag differences against the installed unit, its own flags and the group
    change that took it (where one did)."""
    files = UnitFiles(req.unit_dir)
    installed = files.read(req.unit) or ""
    now_flags = _flags(installed) or {}
    groups = StateDir(req.state_dir).backup_groups(req.unit)
    rows: list[BackupRow] = []
    for b in files.backups(req.unit):
        text = b.path.read_text(encoding="utf-8", errors="replace")
        flags = _flags(text)
        changes = redact_changes(diff_flags(flags or {}, now_flags))
        row: BackupRow = {
            "name": b.name,
            "taken": b.taken.isoformat(),
            "size": b.size,
            "same_as_installed": text == installed,
            "changes": [[c.name, c.before, c.after] for c in changes],
            "flags": redact_flags(flags) if flags is not None else None,
        }
        if b.name in groups:
            row["group"] = groups[b.name]
        rows.append(row)
    return {
        "unit": req.unit,
        "installed_sha256": sha256(installed) if installed else None,
        "flags": unit_view(installed or None, req.secret_names)["flags"],
        "backups": rows,
    }


def status(req: Request) -> StatusAnswer:
    """The unit's state, the change running, the last one's outcome; with req.txn, that one's too."""
    state_dir = StateDir(req.state_dir)
    record = orphans.record_state(state_dir, req.unit)
    txn = state_dir.last_txn(req.unit)
    events = _events(state_dir, txn) if txn else []
    answer: StatusAnswer = {
        "state": _state(req.unit),
        "daemon": _daemon_state(req.unit),
        "running": runner.running(req),
        "last_txn": txn,
        "last_outcome": _outcome(events),
        "last_events": events[-8:],
        "pending": record is not orphans.RecordState.NONE,
        "record": record.value,
    }
    if req.txn is not None:  # a re-attach asks after the transaction it started, by the id it chose
        known = (state_dir.txn_dir(req.txn) / "request.json").is_file()
        answer["txn"] = {"id": req.txn, "known": known, "outcome": _outcome(_events(state_dir, req.txn))}
    return answer


def signal(req: Request) -> SignalAnswer:
    """A multi-node change's coordinator to this node's transaction: "go" (every rank stopped: start), or
    the group's decision; the answer is the decision that stands, which may be the node's own."""
    from agent.host.roles.groupsignal import Signals
    from agent.protocol.groupmachine import Decision

    assert req.txn is not None and req.signal is not None
    folder = StateDir(req.state_dir).txn_dir(req.txn)
    if not (folder / "request.json").is_file():
        return {"known": False, "go": False, "decision": None}
    signals = Signals(folder)
    if req.signal in ("go", "go-back"):
        (signals.for_rollback() if req.signal == "go-back" else signals).go()
    else:
        signals.claim(Decision(req.signal), req.reason, "deployctl")
    stands = signals.decided()
    if stands is None:
        return {"known": True, "go": signals.gone(), "decision": None}
    return {
        "known": True, "go": signals.gone(), "decision": stands.decision.value, "by": stands.by,
        "reason": stands.reason,
    }  # fmt: skip


def _events(state_dir: StateDir, txn: str) -> list[EventJson]:
    return [json.loads(line) for line in state_dir.read_events(txn)]


def _outcome(events: list[EventJson]) -> EventJson | None:
    return next((e for e in reversed(events) if e.get("kind") == "outcome"), None)


def _flags(text: str | None) -> dict[str, FlagValue] | None:
    """The unit's SGLang flags; None for a unit deployctl cannot read (hand-edited oddly), never a crash."""
    if not text:
        return None
    try:
        return dict(parse_unit_flags(text))
    except FlagsError:
        return None


def _state(unit: str) -> UnitStateData | None:
    try:
        with Systemd() as sd:
            return cast(UnitStateData, sd.unit_state(unit).__dict__)
    except SystemdError:
        return None


def _daemon_state(engine: str) -> UnitStateData | None:
    """The weight-cache daemon's state, only where its unit is loaded: an engine stopped beside a running
    daemon is a dead service that `systemctl is-active` on the daemon alone would hide."""
    state = _state(daemon_unit_name(engine))
    if state is None or (state["load_state"] == "not-found" and state["active_state"] == "inactive"):
        return None  # no such unit; a running one whose file was deleted is still shown
    return state


def _gpus() -> list[GpuRow]:
    if shutil.which("nvidia-smi") is None:
        return []
    argv = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
    try:
        text = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows: list[GpuRow] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            rows.append(GpuRow(index=parts[0], name=parts[1], total_mib=parts[2], used_mib=parts[3]))
    return rows
