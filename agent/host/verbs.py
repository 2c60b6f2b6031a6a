"""The agent's verbs on the host: facts, apply, rollback, backups, status, recover, follow.

apply/rollback/recover run detached from the SSH session in a transient unit (systemd-run), write
their events to a file, and the caller follows that file; a dropped connection changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from agent import __version__
from agent.exitcodes import ExitCode
from agent.host import adopt
from agent.host.events import EventLog, journal_note, utc_now
from agent.host.journal import Journal
from agent.host.lock import Locked, UnitLock, describe_holder
from agent.host.state import CorruptRecord, StateDir, write_json_atomic
from agent.host.systemd import Systemd, SystemdError
from agent.host.transaction import Result, Transaction
from agent.host.units import UnitFiles
from agent.protocol import Event, Outcome, Request, Stage, exit_code
from agent.protocol import unit_sha256 as sha256
from agent.sglang.flags import FlagsError, diff_flags, parse_unit_flags
from agent.sglang.logs.summary import start_figures

RUN_DIR = "/run/deployctl"
CHANGING_VERBS = ("apply", "rollback", "recover")
FOLLOW_POLL_S = 0.02
RUNNER_SETTLE_S = 10.0  # how long a started runner may take to lock (Python start-up on a loaded host)


def new_txn_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def dispatch(req: Request, out: TextIO) -> int:
    if req.verb in CHANGING_VERBS:
        return start(req, out)
    if req.verb == "follow":
        assert req.txn is not None
        return follow(req, req.txn, out)
    result = {"facts": facts, "backups": backups, "status": status, "inspect": adopt.inspect}[req.verb](req)
    result["orphan"] = orphaned(req)
    out.write(json.dumps(result, sort_keys=True, default=str) + "\n")
    return 0


def orphaned(req: Request) -> bool:
    """A change whose agent died (SIGKILL, reboot) left its record: the caller runs `recover` next."""
    state_dir = StateDir(req.state_dir)
    if _record_state(state_dir, req.unit) != "pending" or running(req) is not None:
        return False  # a corrupt record is not recovered: every change refuses until a person looks
    last = state_dir.last_txn(req.unit)
    # a change that ended with a failed rollback waits for a person
    return last is None or not _has_outcome(state_dir, last)


def running(req: Request) -> dict[str, Any] | None:
    """The change running on this unit, decided from the lock and from systemd, never from timing.

    A runner that systemd started but that has not taken the lock yet (or has released it and is
    exiting) holds no lock for a moment: wait, boundedly, until it holds the lock or systemd says it
    is gone, so that a caller never mistakes a change that is starting for one whose agent died.
    """
    lock = _lock(req.unit)
    last = StateDir(req.state_dir).last_txn(req.unit)
    deadline = time.monotonic() + RUNNER_SETTLE_S
    while True:
        if lock.is_held():
            return lock.holder() or {"txn": last}
        if last is None or not _runner_alive(last):
            return None
        if time.monotonic() > deadline:  # alive yet never locking: report it, never recover under it
            return {"txn": last, "verb": "?", "since": "?", "pid": "?"}
        time.sleep(0.05)


def _record_state(state_dir: StateDir, unit: str) -> str:
    """ "none", "pending" (an unfinished change's record) or "corrupt" (a record that cannot be read)."""
    try:
        return "none" if state_dir.load_record(unit) is None else "pending"
    except CorruptRecord:
        return "corrupt"


def _has_outcome(state_dir: StateDir, txn: str) -> bool:
    return any('"kind": "outcome"' in line for line in state_dir.read_events(txn))


# -- read-only verbs ---------------------------------------------------------------------------
def facts(req: Request) -> dict[str, Any]:
    """What the laptop needs to plan: the unit, its flags, the service state, the last start's figures."""
    files = UnitFiles(req.unit_dir)
    text = files.read(req.unit)
    lines = Journal().last_invocation_lines(req.unit, 20000)
    state_dir = StateDir(req.state_dir)
    return {
        "agent_version": __version__,
        "unit_text": text,
        "flags": _flags(text),
        "state": _state(req.unit),
        "last_start": start_figures(lines) if lines else None,
        "history": state_dir.history(req.unit, 10),
        "gpus": _gpus(),
        "lock": running(req),
        "last_txn": state_dir.last_txn(req.unit),
        "backups": [b.name for b in files.backups(req.unit)],
    }


def backups(req: Request) -> dict[str, Any]:
    """Newest first, each with its flag differences against the installed unit."""
    files = UnitFiles(req.unit_dir)
    installed = files.read(req.unit) or ""
    now_flags = _flags(installed) or {}
    rows = []
    for b in files.backups(req.unit):
        text = b.path.read_text(encoding="utf-8", errors="replace")
        changes = diff_flags(_flags(text) or {}, now_flags)
        rows.append(
            {
                "name": b.name,
                "taken": b.taken.isoformat(),
                "size": b.size,
                "same_as_installed": text == installed,
                "changes": [[c.name, c.before, c.after] for c in changes],
            }
        )
    return {"unit": req.unit, "installed_sha256": sha256(installed) if installed else None, "backups": rows}


def status(req: Request) -> dict[str, Any]:
    state_dir = StateDir(req.state_dir)
    txn = state_dir.last_txn(req.unit)
    events = [json.loads(line) for line in state_dir.read_events(txn)] if txn else []
    return {
        "state": _state(req.unit),
        "running": running(req),
        "last_txn": txn,
        "last_outcome": next((e for e in reversed(events) if e.get("kind") == "outcome"), None),
        "last_events": events[-8:],
        "pending": _record_state(state_dir, req.unit) != "none",
        "record": _record_state(state_dir, req.unit),
    }


def _flags(text: str | None) -> dict[str, Any] | None:
    """The unit's SGLang flags; None for a unit deployctl cannot read (hand-edited oddly), never a crash."""
    if not text:
        return None
    try:
        return dict(parse_unit_flags(text))
    except FlagsError:
        return None


def _state(unit: str) -> dict[str, Any] | None:
    try:
        with Systemd() as sd:
            return sd.unit_state(unit).__dict__
    except SystemdError:
        return None


def _gpus() -> list[dict[str, Any]]:
    if shutil.which("nvidia-smi") is None:
        return []
    argv = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
    try:
        text = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            rows.append({"index": parts[0], "name": parts[1], "total_mib": parts[2], "used_mib": parts[3]})
    return rows


def _lock(unit: str) -> UnitLock:
    return UnitLock(os.environ.get("DEPLOYCTL_RUN_DIR", RUN_DIR), unit)


# -- changing verbs: start detached, then follow -------------------------------------------------
def start(req: Request, out: TextIO) -> int:
    state_dir = StateDir(req.state_dir)
    holder = running(req)
    if holder is not None:
        if _same_apply(holder, req):
            out.write(_event_line(str(holder["txn"]), "step", f"re-attached: {describe_holder(holder)}"))
            return follow(req, str(holder["txn"]), out)
        return _locked_outcome(holder, out)
    txn = new_txn_id()
    write_json_atomic(state_dir.txn_dir(txn) / "request.json", json.loads(req.to_json()))
    state_dir.set_last_txn(req.unit, txn)
    if req.detach and shutil.which("systemd-run"):
        argv = ["systemd-run", f"--unit=deployctl-{txn}", "--collect", "--quiet", "--no-ask-password"]
        argv += ["--working-directory=/"]
        argv += [
            f"--description=deployctl {req.verb} {req.unit}",
            "--",
            *_self_argv(),
            req.state_dir,
            "run",
            txn,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode == 0:
            return follow(req, txn, out)
        out.write(
            _event_line(txn, "warning", f"systemd-run failed ({proc.stderr.strip()}); running attached")
        )
    return run(req.state_dir, txn, echo=out)


def _same_apply(holder: dict[str, Any], req: Request) -> bool:
    """Whether a re-run of apply asks for the running change, so it re-attaches instead of failing."""
    # The re-run plans from facts the running change already altered (new unit, a half-done start),
    # so its unit may differ in a digit from the running one: the same target is the same request.
    if req.verb != "apply" or holder.get("verb") != "apply" or not holder.get("txn"):
        return False
    same_unit = holder.get("unit_sha256") == sha256(req.unit_text or "")
    same_target = req.target_context is not None and holder.get("target_context") == req.target_context
    return same_unit or same_target


def _self_argv() -> list[str]:
    """How to start this agent again: the bundle it was run from, or the installed package."""
    me = Path(sys.argv[0]).resolve()
    if me.suffix == ".pyz":
        return [sys.executable, "-I", str(me)]
    return [sys.executable, "-I", "-m", "agent.host"]  # -I: never the folder or PYTHONPATH it ran from


def run(state_root: str, txn: str, echo: TextIO | None = None) -> int:
    """The transaction itself: take the lock, run the verb, write the outcome event."""
    state_dir = StateDir(state_root)
    req = Request.from_json((state_dir.txn_dir(txn) / "request.json").read_text())
    log = EventLog(txn, state_dir.events_path(txn), echo)
    lock = _lock(req.unit)
    holder = {"pid": os.getpid(), "since": utc_now(), "verb": req.verb, "txn": txn, "unit": req.unit}
    holder["unit_sha256"] = sha256(req.unit_text) if req.unit_text else None
    holder["target_context"] = req.target_context
    try:
        lock.acquire(holder)
    except Locked as exc:
        log.emit(
            Stage.LOCK,
            "outcome",
            f"{req.unit} is locked: {exc}",
            outcome=Outcome.LOCKED.value,
            holder=exc.holder,
        )
        return int(ExitCode.LOCKED)
    try:
        log.emit(Stage.LOCK, "step", f"locked {req.unit}", pid=os.getpid())
        with Systemd() as sd:
            t = Transaction(req, txn, sd, Journal(), log)
            if req.verb == "apply":
                result = t.apply()
            elif req.verb == "rollback":
                result = t.rollback()
            else:
                result = t.recover_only()
        _write_metrics(req, txn, result, state_dir, log)
        # The runner's peak memory: following a chatty start must not grow it (the benchmark reads it).
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        log.emit(
            Stage.DONE,
            "outcome",
            result.message,
            outcome=result.outcome.value,
            peak_rss_kib=peak,
            **result.data,
        )
        return int(exit_code(result.outcome.value))
    except Exception as exc:
        # A bug must not leave the new unit half-verified: restore now; the record stays if this fails too.
        recovered = _try_recover(req, txn, log)
        msg = f"agent error: {type(exc).__name__}: {exc}; recovery: {recovered}"
        log.emit(Stage.DONE, "outcome", msg, outcome=Outcome.AGENT_ERROR.value)
        raise
    finally:
        lock.release()
        log.close()


def _write_metrics(req: Request, txn: str, result: Result, state_dir: StateDir, log: EventLog) -> None:
    """The node_exporter textfile for alerting; a failure to write it never changes the outcome."""
    if req.metrics_file is None:
        return
    from agent.host import metrics

    events = [Event.from_json(line) for line in state_dir.read_events(txn) if line.startswith("{")]
    data: dict[str, Any] = {
        **result.data,
        "target_context": req.target_context,
        "planned_pool": req.planned_pool,
    }
    if result.outcome is Outcome.ROLLED_BACK:  # the start that runs now is the restored old one
        old = [e.data.get("kv_tokens") for e in events if e.stage == Stage.VERIFY_OLD.value]
        data["summary"] = {"kv_tokens": next((k for k in reversed(old) if k), None)}
    installed = UnitFiles(req.unit_dir).read(req.unit)
    data["unit_sha256"] = sha256(installed) if installed is not None else None
    try:
        run = metrics.run_from(req.host_name, req.unit, result.outcome, time.time(), data, events)
        metrics.record_run(state_dir.unit_dir(req.unit) / "metrics.json", Path(req.metrics_file), run)
    except Exception as exc:  # a bug or a full disk here must never turn a verified change into an error
        log.emit(
            Stage.DONE, "warning", f"metrics not written to {req.metrics_file}: {type(exc).__name__}: {exc}"
        )


def _try_recover(req: Request, txn: str, log: EventLog) -> str:
    try:
        with Systemd() as sd:
            return str(Transaction(req, txn, sd, Journal(), log).recover() or "nothing to do")
    except Exception as exc:  # the record is still on disk: the next agent start tries again
        return f"failed ({type(exc).__name__}: {exc})"


def follow(req: Request, txn: str, out: TextIO) -> int:
    """Copy a transaction's events to `out` until its outcome; finish the job if its runner died."""
    state_dir = StateDir(req.state_dir)
    path = state_dir.events_path(txn)
    offset, quiet_since = 0, time.monotonic()
    while True:
        offset, outcome = _copy_new(path, offset, out)
        if outcome is not None:
            return int(exit_code(str(outcome.data.get("outcome", "error"))))
        if time.monotonic() - quiet_since > 2.0:
            quiet_since = time.monotonic()
            if not _runner_alive(txn) and not _lock(req.unit).is_held():
                offset, outcome = _copy_new(path, offset, out)
                if outcome is None:  # the runner died (killed, host rebooted): recover now
                    out.write(_event_line(txn, "warning", "the transaction's agent died; recovering"))
                    if _record_state(state_dir, req.unit) == "none":
                        return _died_without_record(state_dir, req.unit, txn, out)
                    rec = dataclasses.replace(req, verb="recover", txn=None)
                    return start(rec, out)
        time.sleep(FOLLOW_POLL_S)


def _died_without_record(state_dir: StateDir, unit: str, txn: str, out: TextIO) -> int:
    """No record left: the runner died before its first change, or after its commit cleared it."""
    if any(h.get("txn") == txn for h in state_dir.history(unit, 5)):
        outcome, msg = Outcome.APPLIED, "the change had been verified and committed before its agent died"
    else:
        outcome, msg = Outcome.ERROR, "the agent died before it changed anything; nothing changed: re-run"
    out.write(_event_line(txn, "outcome", msg, outcome=outcome.value))
    return int(exit_code(outcome.value))


def _copy_new(path: Path, offset: int, out: TextIO) -> tuple[int, Event | None]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset, None
    end = chunk.rfind(b"\n") + 1  # only whole lines: the writer may be mid-line
    outcome = None
    for raw in chunk[:end].splitlines():
        line = raw.decode("utf-8", "replace")
        out.write(line + "\n")
        try:
            event = Event.from_json(line)
        except (ValueError, TypeError):
            continue
        if event.is_outcome:
            outcome = event
    out.flush()
    return offset + end, outcome


def _runner_alive(txn: str) -> bool:
    try:
        with Systemd() as sd:
            state = str(sd.unit_state(f"deployctl-{txn}.service").active_state)
            return state in ("active", "activating", "deactivating", "reloading")
    except SystemdError:
        return False


def _locked_outcome(holder: dict[str, Any], out: TextIO) -> int:
    msg = f"locked: {describe_holder(holder)}"
    journal_note(f"{msg}; a second change was refused")  # cron's locked runs show on the host too
    out.write(
        _event_line(str(holder.get("txn", "-")), "outcome", msg, outcome=Outcome.LOCKED.value, holder=holder)
    )
    return int(ExitCode.LOCKED)


def _event_line(txn: str, kind: str, message: str, **data: Any) -> str:
    return Event(txn, 0, utc_now(), Stage.LOCK.value, kind, message, data).to_json() + "\n"
