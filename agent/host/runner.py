"""Changing verbs (apply, rollback, recover): start a runner detached from the SSH session, run it, follow it.

The runner is a transient systemd unit (systemd-run) that writes its events to a file; callers follow
that file, so a dropped connection changes nothing. A runner that died is finished by recovery.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from agent.exitcodes import ExitCode
from agent.host.change import folder, orphans
from agent.host.change.transaction import Result, Transaction
from agent.host.events import EventLog, journal_note, utc_now
from agent.host.lock import Locked, UnitLock, describe_holder
from agent.host.state import StateDir
from agent.host.systemd import Systemd, SystemdError
from agent.host.units import UnitFiles
from agent.host.watch.journal import Journal
from agent.protocol.answers import Holder
from agent.protocol.common import new_txn_id
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Event, Outcome, Stage, exit_code
from agent.protocol.requests import Request

RUN_DIR = "/run/deployctl"
FOLLOW_POLL_S = 0.02
RUNNER_SETTLE_S = 10.0  # how long a started runner may take to lock (Python start-up on a loaded host)


def running(req: Request) -> Holder | None:
    """The change running on this unit, decided from the lock and from systemd, never from timing.

    A runner that systemd started but that has not taken the lock yet (or has released it and is
    exiting) holds no lock for a moment: wait, boundedly, until it holds the lock or systemd says it
    is gone, so that a caller never mistakes a change that is starting for one whose agent died.
    """
    lock = _lock(req.unit)
    state_dir = StateDir(req.state_dir)
    last = state_dir.last_txn(req.unit)
    # the runner last asked for (it may not have locked yet) and the last one that held the lock
    asked = [t for t in dict.fromkeys((state_dir.starting_txn(req.unit), last)) if t is not None]
    deadline = time.monotonic() + RUNNER_SETTLE_S
    while True:
        if lock.is_held():
            return lock.holder() or {"txn": last}
        # A transaction that logged its outcome has done its work: no need to ask systemd (every
        # read-only call, cron's included, comes here).
        alive = [t for t in asked if not state_dir.has_outcome(t) and _runner_alive(t)]
        if not alive:
            return None
        if time.monotonic() > deadline:  # alive yet never locking: report it, never recover under it
            return {"txn": alive[0], "verb": "?", "since": "?", "pid": "?"}
        time.sleep(0.05)


def start(req: Request, out: TextIO) -> int:
    state_dir = StateDir(req.state_dir)
    holder = running(req)
    if holder is not None:
        if _same_apply(holder, req):
            out.write(
                _event_line(str(holder["txn"]), "step", f"re-attached: {describe_holder(holder)}", Stage.LOCK)
            )
            return follow(req, str(holder["txn"]), out)
        return _locked_outcome(holder, out)
    txn = req.txn or new_txn_id()
    if state_dir.txn_dir(txn).exists():  # an id the caller chose must name this run and no other
        msg = f"transaction id {txn} is already taken on this host: nothing changed; re-run"
        out.write(_event_line(txn, "outcome", msg, Stage.LOCK, outcome=Outcome.ERROR.value))
        return int(ExitCode.REFUSED)
    if req.verb == "apply":
        done = _in_place(req, txn, out)
        if done is not None:
            return done
    try:
        folder.stage_secrets(req, txn)  # the runner takes them from there
    except OSError as exc:
        msg = (
            f"cannot stage the secret values for the runner: {exc.strerror or exc}; {req.unit} left as it was"
        )
        out.write(_event_line(txn, "outcome", msg, Stage.LOCK, outcome=Outcome.ERROR.value))
        return int(ExitCode.REFUSED)
    record_request(state_dir, req, txn)
    return _spawn(req, txn, out)


def _spawn(req: Request, txn: str, out: TextIO) -> int:
    """Run the transaction as a transient unit when detached (it outlives this SSH session) and follow it;
    in this process otherwise, or when systemd-run is missing or fails."""
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
            _event_line(
                txn, "warning", f"systemd-run failed ({proc.stderr.strip()}); running attached", Stage.LOCK
            )
        )
    return run(req.state_dir, txn, echo=out)


def record_request(state_dir: StateDir, req: Request, txn: str) -> None:
    """The runner's request, secrets named by digest only. The unit's last_txn moves only once a runner
    holds the lock: a change that lost the lock to another (LOCKED) must not hide the winner's outcome."""
    folder.write_request(state_dir, req, txn)
    state_dir.set_starting_txn(req.unit, txn)


def _in_place(req: Request, txn: str, out: TextIO) -> int | None:
    """An apply that changes nothing, answered in this process: no transient unit, no second agent.

    Only when no earlier change waits for recovery and the comparison (under the lock) finds nothing to
    do; otherwise None, having written nothing, and the detached runner takes over and checks again.
    Nothing changes on this path, so a dropped connection cannot leave anything half done.
    """
    state_dir = StateDir(req.state_dir)
    kept, seen = EventLog(txn, None), list[Event]()  # in memory until this run is known to end here
    kept.listeners.append(seen.append)
    with _compared(req, txn, kept) as result:
        if result is None:
            return None
        record_request(state_dir, req, txn)
        state_dir.set_last_txn(req.unit, txn)  # this process holds the lock
        log = EventLog(txn, state_dir.events_path(txn), out)
        for event in seen:
            log.emit(event.stage, event.kind, event.message, **event.data)
        try:
            return _finish(req, txn, result, log)
        finally:
            log.close()


@contextlib.contextmanager
def _compared(req: Request, txn: str, log: EventLog) -> Iterator[Result | None]:
    """The one check of "nothing to do" (Transaction.compare: the unit, the secrets' content, a
    daemon-reload pending, the running process started from that file, the pool against the target), under
    the unit's lock, held while the body runs. None when an earlier change waits for recovery, another run
    holds the lock, or the check did not end in a result: then the change itself runs and checks again."""
    if orphans.record_state(StateDir(req.state_dir), req.unit) is not orphans.RecordState.NONE:
        yield None
        return
    lock = _lock(req.unit)
    try:
        lock.acquire(_holder(req, txn))
    except Locked:
        yield None  # the runner's own path reports who holds it
        return
    try:
        log.emit(Stage.LOCK, "step", f"locked {req.unit}", pid=os.getpid())
        try:
            with Systemd() as sd:
                result = Transaction(req, txn, sd, Journal(), log).compare(wait=False)
        except Exception:  # nothing written: the runner meets it again and reports it as it does
            result = None
        yield result if isinstance(result, Result) else None
    finally:
        lock.release()


def compare(req: Request, out: TextIO) -> int:
    """The `compare` verb: whether an apply of this unit would find nothing to do, decided by the check the
    one-host apply makes (`_compared`); nothing is written. A multi-node service's laptop asks every node
    before it starts a change of all of them, so each node's agent decides, as for one host."""
    txn = new_txn_id()
    with _compared(dataclasses.replace(req, verb="apply", group=None), txn, EventLog(txn, None)) as result:
        same = result is not None and result.outcome is Outcome.UP_TO_DATE
        why = result.message if result is not None else "the agent did not find it up to date"
    out.write(json.dumps({"up_to_date": same, "message": why}, sort_keys=True) + "\n")
    return 0


def _same_apply(holder: Holder, req: Request) -> bool:
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
    log = EventLog(txn, state_dir.events_path(txn), echo)
    try:
        req = folder.load_request(state_dir, txn)
    except folder.StagedSecretsError as exc:
        log.emit(Stage.LOCK, "outcome", f"{exc}; nothing changed: re-run", outcome=Outcome.ERROR.value)
        log.close()
        return int(ExitCode.REFUSED)
    lock = _lock(req.unit)
    try:
        lock.acquire(_holder(req, txn))
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
        state_dir.set_last_txn(req.unit, txn)
        log.emit(Stage.LOCK, "step", f"locked {req.unit}", pid=os.getpid())
        return _finish(req, txn, _transact(req, txn, log), log)
    except Exception as exc:
        # A bug must not leave the new unit half-verified: restore now; the record stays if this fails too.
        recovered = orphans.try_recover(req, txn, log)
        msg = f"agent error: {type(exc).__name__}: {exc}; recovery: {recovered}"
        _write_metrics(req, txn, Result(Outcome.AGENT_ERROR, msg), state_dir, log)  # the alert's outcome
        log.emit(Stage.DONE, "outcome", msg, outcome=Outcome.AGENT_ERROR.value)
        raise
    finally:
        lock.release()
        log.close()


def _transact(req: Request, txn: str, log: EventLog) -> Result:
    """The verb's transaction, run under the lock."""
    with Systemd() as sd:
        t = Transaction(req, txn, sd, Journal(), log)
        if req.verb == "apply":
            return t.apply()
        if req.verb == "rollback":
            return t.rollback()
        return t.recover_only()


def _holder(req: Request, txn: str) -> Holder:
    """What the lock records about its holder: a re-run of the same apply re-attaches by it."""
    return {
        "pid": os.getpid(), "since": utc_now(), "verb": req.verb, "txn": txn, "unit": req.unit,
        "unit_sha256": sha256(req.unit_text) if req.unit_text else None,
        "target_context": req.target_context,
    }  # fmt: skip


def _finish(req: Request, txn: str, result: Result, log: EventLog) -> int:
    """Old transaction folders pruned, metrics, then the outcome event; the exit status it maps to."""
    try:
        folder.prune(req, req.keep_backups, protect=(txn,))
    except OSError as exc:  # a full or broken disk: the outcome stands, the folders wait for the next run
        log.emit(Stage.DONE, "warning", f"old transaction folders not pruned: {exc}")
    _write_metrics(req, txn, result, StateDir(req.state_dir), log)
    # The runner's peak memory: following a chatty start must not grow it (the benchmark reads it).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    log.emit(
        Stage.DONE, "outcome", result.message, outcome=result.outcome.value, peak_rss_kib=peak, **result.data
    )
    return int(exit_code(result.outcome.value))


def _write_metrics(req: Request, txn: str, result: Result, state_dir: StateDir, log: EventLog) -> None:
    """The node_exporter textfile for alerting; a failure to write it never changes the outcome."""
    if req.metrics_file is None:
        return
    from agent.host import metrics

    events = [Event.from_json(line) for line in state_dir.read_events(txn) if line.startswith("{")]
    data: dict[str, object] = {  # metrics.run_from reads each figure by its type
        **result.data,
        "target_context": req.target_context,
        "planned_pool": req.planned_pool,
        "planned_host_pool": req.planned_host_pool,
        "host_budget_pinned": req.host_budget_pinned,
        "host_budget_capacity": req.host_budget_capacity,
    }
    if result.outcome is Outcome.ROLLED_BACK:  # the start that runs now is the restored old one
        old = [e.data.get("kv_tokens") for e in events if e.stage == Stage.VERIFY_OLD.value]
        data["summary"] = {"kv_tokens": next((k for k in reversed(old) if k), None)}
    installed = UnitFiles(req.unit_dir).read(req.unit)
    data["unit_sha256"] = sha256(installed) if installed is not None else None
    try:
        run = metrics.run_from(req, result.outcome, time.time(), data, events)
        metrics.record_run(state_dir.unit_dir(req.unit) / "metrics.json", Path(req.metrics_file), run)
    except Exception as exc:  # a bug or a full disk here must never turn a verified change into an error
        log.emit(
            Stage.DONE, "warning", f"metrics not written to {req.metrics_file}: {type(exc).__name__}: {exc}"
        )


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
                    out.write(
                        _event_line(txn, "warning", "the transaction's agent died; recovering", Stage.RECOVER)
                    )
                    if orphans.record_state(state_dir, req.unit) is orphans.RecordState.NONE:
                        return _close_dead(req, txn, out)
                    return start(recover_request(req, txn), out)
        time.sleep(FOLLOW_POLL_S)


def recover_request(req: Request, died: str) -> Request:
    """The `recover` run that finishes a dead runner's change. Never a group node's request: recovery
    reads the change's own request (its rank, its bounds) from the transaction's folder."""
    return dataclasses.replace(req, verb="recover", txn=None, group=None, died=died)


def _close_dead(req: Request, txn: str, out: TextIO) -> int:
    """A runner that died and left no record: its outcome goes into its own events file too (the
    transaction is finished, for status and pruning alike), and the secret values staged for it are
    removed: a runner killed in its start-up never read them, and nothing else would."""
    state_dir = StateDir(req.state_dir)
    outcome, msg = orphans.died_without_record(state_dir, req.unit, txn)
    line = _event_line(txn, "outcome", msg, Stage.RECOVER, outcome=outcome.value)
    try:
        with open(state_dir.events_path(txn), "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError:  # a full disk: the client is still told, the next prune keeps the folder
        pass
    folder.drop_staged(req, txn)
    out.write(line)
    return int(outcome.exit_code)


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


def _locked_outcome(holder: Holder, out: TextIO) -> int:
    msg = f"locked: {describe_holder(holder)}"
    journal_note(f"{msg}; a second change was refused")  # cron's locked runs show on the host too
    out.write(
        _event_line(
            str(holder.get("txn", "-")),
            "outcome",
            msg,
            Stage.LOCK,
            outcome=Outcome.LOCKED.value,
            holder=holder,
        )
    )
    return int(ExitCode.LOCKED)


def _event_line(txn: str, kind: str, message: str, stage: Stage, **data: Any) -> str:
    """An event the runner's caller writes itself (no runner wrote it): stamped with the stage it is about."""
    return Event(txn, 0, utc_now(), stage.value, kind, message, data).to_json() + "\n"


def _lock(unit: str) -> UnitLock:
    return UnitLock(os.environ.get("DEPLOYCTL_RUN_DIR", RUN_DIR), unit)
