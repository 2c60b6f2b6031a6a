"""The weight-cache daemon's unit inside a change of its engine ([weight_cache], client mode).

The laptop sends the daemon's unit beside the engine's (Request.daemon_text). The transaction backs it up
under the engine backup's own stamp (`<daemon>.bak.<stamp>`, so a rollback to an engine backup finds the
daemon unit of that time), writes it atomically beside the engine's, and at the restart decides, from
what the daemon runs (`decide`, pure):
- KEEP: it runs the unit it is asked for and is not dead: only the engine restarts, and maps its weights;
- START: it is not running: started before the engine;
- RESTART: its unit changed (a fingerprint change: model, TP layout, quantization, dtype, revision,
  SGLang version; srt/weight_cache/protocol.py CacheConfig), or its ready file names a dead PID: the
  engine is stopped, the daemon restarted (it reloads from disk), then the engine started;
- STOP: the engine is no longer its client (weight cache turned off, or a rollback to a unit from before
  it): the daemon, which holds GPU memory the engine's pool counts on, stops before the engine restarts.
Which unit text the running daemon was started from is kept in the state folder (weight-cache.json, with
its invocation); for a daemon deployctl did not start, its start time against its file's mtime says.
A rollback or a recovery puts the daemon's unit back with the engine's (`restore_text`, pure).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agent.host.change.jobs import Job, JobLog, snapshot
from agent.host.events import EventLog
from agent.host.model_facts import read_config
from agent.host.roles.weight_cache import DaemonSeen, check, daemon_unit, look, ready_dir, unservable, untied
from agent.host.state import StateDir, write_json_atomic
from agent.host.units import UnitFiles, UnitWriteError
from agent.host.watch.poll import wait_until
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Stage
from agent.sglang import weight_cache as wc
from agent.sglang.flags import FlagsError, parse_unit_flags

if TYPE_CHECKING:
    from agent.host.systemd import JobResult, UnitState

_ACTIVE = ("active", "reloading", "activating")


class Step(str, Enum):
    NONE = "none"  # no daemon to look after
    KEEP = "keep"  # only the engine restarts
    START = "start"
    RESTART = "restart"
    STOP = "stop"


@dataclass(frozen=True)
class Decision:
    step: Step
    why: str


@dataclass(frozen=True)
class Kept:
    """weight-cache.json: the daemon this engine is tied to, and the unit text its start came from."""

    daemon: str | None = None
    invocation: str = ""  # the daemon's InvocationID when deployctl (re)started it
    text: str | None = None


@dataclass(frozen=True)
class Running:
    """The daemon as found before the engine's restart."""

    seen: DaemonSeen
    started_text: str | None  # the unit text its running start came from, when deployctl started it
    older_than_file: bool  # its start began before its file last changed (for a start deployctl did not make)


def decide(client: bool, running: Running) -> Decision:
    """What the daemon needs before the engine restarts; client: the engine's new unit binds to it."""
    seen = running.seen
    active = seen.active_state in _ACTIVE
    if not client:
        if active:
            return Decision(
                Step.STOP, f"{seen.unit} serves no engine any more: stopped, its GPU memory freed"
            )
        return Decision(Step.NONE, "")
    if seen.text is None:
        return Decision(Step.NONE, f"{seen.unit} is not installed")
    if not active:
        return Decision(Step.START, f"{seen.unit} is {seen.active_state}: started before the engine")
    dead = [r.path for r in seen.ready if not r.alive]
    if dead:
        return Decision(Step.RESTART, f"{seen.unit} is dead (its ready file {dead[0]} names no live PID): "
                        "restarted before the engine")  # fmt: skip
    if running.started_text is not None:
        if running.started_text == seen.text:
            return Decision(Step.KEEP, f"{seen.unit} keeps its fingerprint and its weights: only the engine "
                            "restarts")  # fmt: skip
        return Decision(
            Step.RESTART,
            f"{seen.unit} restarts, then the engine: {_changed(running.started_text, seen.text)}",
        )
    if running.older_than_file:
        return Decision(Step.RESTART, f"{seen.unit} runs an older unit file: restarted, then the engine")
    return Decision(Step.KEEP, f"{seen.unit} runs its unit as installed: only the engine restarts")


def mismatch(engine_text: str, daemon_text: str) -> str | None:
    """The engine's fingerprint flags against the daemon unit's: a unit pair that cannot share weights
    (srt/weight_cache/protocol.py: a CacheConfig mismatch loads from disk) is refused before any change."""
    try:
        engine, daemon = parse_unit_flags(engine_text), parse_unit_flags(daemon_text)
    except FlagsError as exc:
        return f"the weight-cache daemon's unit cannot be read: {exc}"
    differ = wc.fingerprint(daemon, "").differs(wc.fingerprint(engine, ""))
    if differ:
        return f"the weight-cache daemon's unit and the engine's differ in {', '.join(differ)}"
    return None


def paired(engine_unit: str, engine_backup: str, daemon: str) -> str:
    """sglang.service.bak.<stamp> -> sglang-weight-cache.service.bak.<stamp>."""
    return daemon + engine_backup[len(engine_unit) :]


def restore_text(old_client: bool, pair: str | None, installed: str | None) -> tuple[bool, str | None]:
    """What the daemon's file becomes when the engine goes back to an old unit: (change it, new text);
    new text None removes it. The daemon unit of the backup's time when kept; none when the old engine
    is no client of the daemon; left as it is when it is one but no copy of that time exists."""
    if pair is not None:
        return pair != installed, pair
    if not old_client:
        return installed is not None, None
    return False, installed


def _config(engine_text: str) -> dict[str, object] | None:
    """The engine's checkpoint config.json when its --model-path is a local folder."""
    try:
        path = parse_unit_flags(engine_text).get("model-path")
    except FlagsError:
        return None
    return read_config(Path(str(path))) if isinstance(path, str) and path.startswith("/") else None


def _changed(old: str, new: str) -> str:
    try:
        differ = wc.fingerprint(parse_unit_flags(old), "").differs(wc.fingerprint(parse_unit_flags(new), ""))
    except FlagsError:
        differ = []
    return f"its fingerprint changed ({', '.join(differ)})" if differ else "its unit changed"


class _Systemd(Protocol):
    def unit_state(self, unit: str) -> UnitState: ...

    def restart(self, unit: str, timeout: float) -> JobResult: ...

    def stop(self, unit: str, timeout: float) -> JobResult: ...

    def start(self, unit: str, timeout: float) -> JobResult: ...


@dataclass
class DaemonUnit:
    """The hooks of a transaction on one engine unit (host/change/transaction.py and its steps)."""

    files: UnitFiles
    state: StateDir
    engine: str
    systemd: _Systemd
    log: EventLog
    ready_s: float = 1800.0  # how long a (re)started daemon may take to load its weights
    failed: str | None = None  # the daemon did not come up at the last restart: why (the outcome says)
    _jobs: JobLog | None = field(default=None, repr=False)

    @property
    def jobs(self) -> JobLog:
        """One log for the transaction: its `finished` counts from this run's last plan."""
        if self._jobs is None:
            self._jobs = JobLog(self.state, self.engine, self._snapshot)
        return self._jobs

    def _snapshot(self, unit: str) -> str:
        state = self.systemd.unit_state(unit)
        return snapshot(state.invocation_id, state.active_state)

    @property
    def name(self) -> str:
        """The daemon's one name, derived from the engine's (sglang/weight_cache.py): no other unit is
        ever written, restarted or stopped as the daemon."""
        return wc.daemon_unit_name(self.engine)

    def _client(self, engine_text: str | None) -> bool:
        return engine_text is not None and daemon_unit(self.engine, engine_text) is not None

    def client_of(self, engine_text: str | None) -> bool:
        """Whether the engine's unit runs in client mode of this daemon (the flag and the tie to its name)."""
        return self._client(engine_text)

    def drift(self, wanted: str | None) -> str | None:
        """The daemon's installed unit against the one sent: deleted or edited by hand (repaired by this
        change), or None when it is as sent (or none was sent)."""
        if wanted is None:
            return None
        installed = self.files.read(self.name)
        if installed == wanted:
            return None
        how = (
            "is missing (deleted by hand?)"
            if installed is None
            else "differs from deployctl's (edited by hand?)"
        )
        return f"{self.files.path(self.name)} {how}: this change writes it back"

    def rewrite(self, wanted: str | None, keep_as: Path, reload: Callable[[], None]) -> bool:
        """The daemon runs the text sent already (deployctl started it from that text, weight-cache.json
        says) and only its file was deleted or edited by hand: the file is written back (a hand edit kept
        at keep_as) and systemd reloads it, nothing restarted. False: a change must repair it."""
        name = self.name
        if wanted is None or not self._remembered():
            return False
        if self._started(self.systemd.unit_state(name)) != wanted:
            return False
        installed = self.files.read(name)
        if installed is not None:
            keep_as.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            keep_as.write_text(installed, encoding="utf-8", errors="surrogateescape")
        self._put(name, installed, wanted)
        reload()
        return True

    # -- before anything changes ----------------------------------------------------------------------
    def refusal(self, engine_text: str, daemon_text: str | None, group: bool = False) -> str | None:
        """Why this change cannot go ahead: a group's node is never a daemon's client (its stop-wait-start
        runs no daemon job: the daemon would keep its old start under a new file); without a daemon unit
        sent, the installed daemon must serve the engine as it is; with one, the two units must share a
        fingerprint."""
        if group and (daemon_text is not None or self._client(engine_text)):
            return (
                f"{self.engine} is one node of a multi-node group and a weight-cache daemon's client: "
                "[weight_cache] does not combine with [nodes]"
            )
        if self._client(engine_text):
            said = unservable(engine_text, daemon_text, _config(engine_text))
            if said is not None:
                return said
        if daemon_text is None:
            return check(self.systemd, str(self.files.dir), self.engine, engine_text)
        if not self._client(engine_text):
            return untied(self.engine, engine_text) or (
                f"a weight-cache daemon unit was sent for {self.engine}, which is not its client"
            )
        return mismatch(engine_text, daemon_text)

    # -- the write ------------------------------------------------------------------------------------
    def write(
        self,
        old_engine: str | None,
        new_engine: str,
        backup: str | None,
        wanted: str | None,
        restored: str | None,
    ) -> None:
        """Back up the daemon's unit with the engine's backup, then write (or remove) it atomically.
        wanted: the daemon unit sent (apply); restored: the engine backup a rollback installs (its copy)."""
        name = self.name
        if not (self._client(new_engine) or self._client(old_engine) or self._remembered()):
            return
        self._prune(name)
        installed = self.files.read(name)
        pair = paired(self.engine, backup, name) if backup is not None else None
        if (
            pair is not None and installed is not None and self.files.read(pair) is None
        ):  # an older one's: kept
            self.files.write(pair, installed, mode=0o600)
        if wanted is None:
            pair = self.files.read(paired(self.engine, restored, name)) if restored is not None else None
            change, wanted = restore_text(self._client(new_engine), pair, installed)
            if not change:
                return
        self._put(name, installed, wanted)

    def _prune(self, name: str) -> None:
        """A daemon backup whose engine backup was pruned goes too."""
        engine = {b.name for b in self.files.backups(self.engine)}
        for b in self.files.backups(name):
            if self.engine + b.name[len(name) :] not in engine:
                b.path.unlink(missing_ok=True)

    def restore(self, backup: str | None) -> None:
        """A rollback or a recovery: the daemon's unit of the engine backup's time back in place."""
        current = self.files.read(self.engine) or ""
        old = self.files.read(backup) if backup is not None else None
        name = self.name
        if not (self._client(current) or self._client(old) or self._remembered()):
            return
        installed = self.files.read(name)
        pair = self.files.read(paired(self.engine, backup, name)) if backup is not None else None
        change, text = restore_text(self._client(old), pair, installed)
        if change:
            self._put(name, installed, text)

    def _put(self, name: str, installed: str | None, text: str | None) -> None:
        if name != self.name:  # the one name: never another unit's file (nvidia-fabricmanager.service)
            raise UnitWriteError(f"{name} is not the weight-cache daemon of {self.engine} ({self.name})")
        self._remember(name)
        if text is None:
            self.files.remove(name)
            self.log.emit(
                Stage.WRITE, "step", f"removed {self.files.path(name)}: the engine is no client of it"
            )
        elif text != installed:
            self.files.write(name, text)
            self.log.emit(Stage.WRITE, "step", f"wrote {self.files.path(name)}")

    # -- the restart ----------------------------------------------------------------------------------
    def restart_engine(self, restart: Callable[[], JobResult], timeout: float) -> JobResult:
        """The engine's restart, with what its daemon needs first (`decide`), as a list of unit jobs
        written to the change's record before the first runs (host/change/jobs.py)."""
        self.failed = None
        engine_text = self.files.read(self.engine) or ""
        engine = Job(self.engine, "restart", sha256(engine_text))
        client = daemon_unit(self.engine, engine_text)
        if client is None and not self._remembered():
            return self.jobs.run([engine], [restart])[-1]
        name = self.name
        state = self.systemd.unit_state(name)
        folder = ready_dir(engine_text)
        seen = look(str(self.files.dir), name, state.active_state, folder)
        decision = decide(client is not None, Running(seen, self._started(state), self._older(name, state)))
        if decision.step in (Step.NONE, Step.KEEP):
            if decision.step is Step.KEEP:
                self.log.emit(Stage.RESTART, "step", decision.why, daemon=decision.step.value)
            return self.jobs.run([engine], [restart])[-1]
        self.log.emit(Stage.RESTART, "step", decision.why, daemon=decision.step.value)
        if decision.step is Step.STOP:  # the engine first (its drain, served by its daemon), then the daemon

            def stop() -> JobResult:
                job = self.systemd.stop(name, timeout)
                self._forget()
                return job

            jobs = [Job(self.engine, "stop", None), Job(name, "stop", None), replace(engine, action="start")]
            calls = [
                lambda: self.systemd.stop(self.engine, timeout),
                stop,
                lambda: self.systemd.start(self.engine, timeout),
            ]
            return self.jobs.run(jobs, calls)[-1]
        return self._with_daemon(name, decision.step, timeout, seen.text or "", folder)

    def _with_daemon(self, name: str, step: Step, timeout: float, text: str, folder: str | None) -> JobResult:
        """Stop the engine, (re)start the daemon and wait for its ready files, then start the engine; a
        daemon that did not come up is named, and the engine is not started onto it."""
        engine_sha = sha256(self.files.read(self.engine) or "")
        action = "restart" if step is Step.RESTART else "start"
        jobs = [
            Job(self.engine, "stop", None),
            Job(name, action, sha256(text)),
            Job(self.engine, "start", engine_sha),
        ]

        def daemon() -> JobResult:
            self._remember_unsure(name)  # a kill mid-job: which text it runs is not known
            job = (
                self.systemd.restart(name, timeout)
                if action == "restart"
                else self.systemd.start(name, timeout)
            )
            self._save(name, self.systemd.unit_state(name).invocation_id, text)
            if not job.ok or not self._ready(name, folder):
                said = f"{name} did not come up ({job.result}, {self.systemd.unit_state(name).active_state})"
                self.failed = f"the weight-cache daemon {said}: the engine was not started onto it"
                self.log.emit(Stage.RESTART, "warning", said)
                return replace(job, result="failed") if job.ok else job
            return job

        calls = [
            lambda: self.systemd.stop(self.engine, timeout),
            daemon,
            lambda: self.systemd.start(self.engine, timeout),
        ]
        return self.jobs.run(jobs, calls)[-1]

    def _ready(self, name: str, folder: str | None) -> bool:
        """Its ready files (one per GPU, each naming a live PID), or it stopped trying: failed, or failed
        and waiting for systemd's Restart= (sub-state auto-restart). An engine unit that names no ready-file
        folder gives nothing to wait on: the daemon's job result alone says, at once."""

        def up() -> bool:
            state = self.systemd.unit_state(name)
            return state.active_state in _ACTIVE and state.sub_state != "auto-restart"

        if folder is None:
            self.log.emit(Stage.RESTART, "warning", f"the engine's unit names no {wc.READY_TEMPLATE}: "
                          f"{name}'s weights cannot be seen loaded, only that it runs")  # fmt: skip
            return up()

        def done() -> bool:
            if not up():
                return True
            seen = look(str(self.files.dir), name, "active", folder)
            return len(seen.ready) >= self._ranks(seen.text) and all(r.alive for r in seen.ready)

        wait_until(done, self.ready_s)
        return up()

    @staticmethod
    def _ranks(text: str | None) -> int:
        """Every rank's ready file, not the first GPU's: one per process of its TP x PP world."""
        try:
            return wc.ranks(parse_unit_flags(text or ""))
        except FlagsError:
            return 1

    # -- what the daemon was started from ------------------------------------------------------------
    def _path(self) -> Path:
        return self.state.unit_dir(self.engine) / "weight-cache.json"

    def _load(self) -> Kept:
        try:
            raw = json.loads(self._path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return Kept()
        if not isinstance(raw, dict):
            return Kept()
        said = {k: v for k, v in raw.items() if isinstance(v, str)}
        return Kept(said.get("daemon"), said.get("invocation", ""), said.get("text"))

    def _remembered(self) -> bool:
        """weight-cache.json names this engine's daemon (a name other than the one derived is ignored)."""
        return self._load().daemon == self.name

    def _remember(self, name: str) -> None:
        if self._load().daemon != name:
            write_json_atomic(self._path(), asdict(Kept(name)))

    def _save(self, name: str, invocation: str, text: str) -> None:
        write_json_atomic(self._path(), asdict(Kept(name, invocation, text)))

    def _remember_unsure(self, name: str) -> None:
        """Before a (re)start of the daemon: no start text is known until it is saved after the job."""
        write_json_atomic(self._path(), asdict(Kept(name)))

    def _forget(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path().unlink()

    def _started(self, state: UnitState) -> str | None:
        kept = self._load()
        return kept.text if state.invocation_id and kept.invocation == state.invocation_id else None

    def _older(self, name: str, state: UnitState) -> bool:
        try:
            return self.files.mtime_us(name) >= state.active_enter_timestamp_us
        except OSError:
            return False
