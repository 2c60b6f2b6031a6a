"""The weight-cache daemon's unit inside a change (agent/host/roles/daemon.py): what its restart decides,
what a rollback puts back, with fake systemd and real files."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.change.record import PHASE_RESTARTED, Record
from agent.host.events import EventLog
from agent.host.roles.daemon import DaemonUnit, Running, Step, decide, mismatch, paired, restore_text
from agent.host.roles.weight_cache import DaemonSeen, Ready
from agent.host.state import StateDir
from agent.host.systemd import JobResult, UnitState
from agent.host.units import UnitFiles

ENGINE, DAEMON = "sglang.service", "sglang-weight-cache.service"
DEAD_PID = 2**22 + 12345  # above Linux's pid_max default: never a live process


def daemon_text(model: str = "/m", dtype: str = "auto") -> str:
    argv = f"/opt/venv/bin/python -m sglang.srt.weight_cache.daemon --model-path {model} --tp-size 8"
    argv += f" --dtype {dtype}"
    return f"[Unit]\nDescription=cache\n\n[Service]\nExecStart={argv}\n"


def engine_text(folder: Path, client: bool = True, fraction: str = "0.9", model: str = "/m") -> str:
    argv = f"/opt/venv/bin/python -m sglang.launch_server --model-path {model} --tp-size 8 --dtype auto"
    argv += f" --mem-fraction-static {fraction}" + (" --weight-cache-mode client" if client else "")
    unit = f"[Unit]\nBindsTo={DAEMON}\nAfter={DAEMON}\n" if client else "[Unit]\n"
    env = f"Environment=SGLANG_WEIGHT_CACHE_READY_TEMPLATE={folder}/{{device_uuid}}.ready\n"
    return f"{unit}\n[Service]\n{env}ExecStart={argv}\n"


def seen(text: str | None, active: str, ready: tuple[bool, ...]) -> DaemonSeen:
    return DaemonSeen(
        DAEMON, text, active, tuple(Ready(f"/run/x/{i}.ready", 1, a) for i, a in enumerate(ready))
    )


# -- decide: every combination --------------------------------------------------------------------------
STATES = ("active", "inactive", "failed", "activating")
READIES = ((), (True,), (True, True), (True, False), (False,))
STARTED = (None, "same", "other")


@pytest.mark.parametrize(
    ("client", "state", "ready", "started", "older"),
    list(itertools.product((True, False), STATES, READIES, STARTED, (True, False))),
)
def test_the_daemon_restarts_only_when_it_changed_or_died(client, state, ready, started, older) -> None:
    text = daemon_text()
    before = {"same": text, "other": daemon_text(dtype="float16"), None: None}[started]
    step = decide(client, Running(seen(text, state, ready), before, older)).step
    running = state in ("active", "activating")
    if not client:
        assert step is (Step.STOP if running else Step.NONE)  # an engine no client of it: its GPU memory back
    elif not running:
        assert step is Step.START
    elif False in ready or started == "other" or (started is None and older):
        assert step is Step.RESTART
    else:
        assert step is Step.KEEP  # nothing restarted without reason: the weights stay resident


def test_a_changed_fingerprint_is_named_in_the_reason() -> None:
    running = Running(seen(daemon_text(dtype="float16"), "active", (True,)), daemon_text(), False)
    decision = decide(True, running)
    assert decision.step is Step.RESTART and "fingerprint changed (dtype)" in decision.why


def test_an_uninstalled_daemon_is_left_to_the_refusal() -> None:
    assert decide(True, Running(seen(None, "inactive", ()), None, False)).step is Step.NONE


# -- the pair's fingerprint -----------------------------------------------------------------------------
@given(st.sampled_from(["0.8", "0.85", "0.93"]), st.sampled_from([True, False]))
def test_a_resize_keeps_the_pair_compatible(fraction: str, client: bool) -> None:
    assert mismatch(engine_text(Path("/run/x"), client, fraction), daemon_text()) is None


def test_a_pair_with_another_model_is_refused() -> None:
    said = mismatch(engine_text(Path("/run/x"), model="/other"), daemon_text())
    assert said is not None and "model-path" in said


def test_the_daemon_backup_shares_the_engine_backups_stamp() -> None:
    assert paired(ENGINE, f"{ENGINE}.bak.20261205T120000Z-1", DAEMON) == f"{DAEMON}.bak.20261205T120000Z-1"


@pytest.mark.parametrize(
    ("old_client", "pair", "installed", "want"),
    [
        (True, "A", "B", (True, "A")),  # the backup's time had daemon unit A
        (True, "A", "A", (False, "A")),  # already the same: nothing written
        (False, None, "B", (True, None)),  # the old engine was no client: the daemon unit goes
        (False, None, None, (False, None)),
        (True, None, "B", (False, "B")),  # a client with no copy of that time: left as it is
    ],
)
def test_a_rollback_puts_back_the_daemon_unit_of_the_backups_time(old_client, pair, installed, want) -> None:
    assert restore_text(old_client, pair, installed) == want


# -- the hooks, on a fake systemd of several units --------------------------------------------------------
@dataclass
class Units:
    """systemd for several units: each its state, invocation, and the calls in order."""

    active: dict[str, str] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)  # units whose start fails and waits for Restart=
    invocation: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    n: int = 0

    def unit_state(self, unit: str) -> UnitState:
        state = self.active.get(unit, "inactive")
        sub = "auto-restart" if unit in self.failing else "running"
        return UnitState(unit, "loaded", state, sub, self.invocation.get(unit, ""), False, 0, 0, 0, "",
                         10**18)  # fmt: skip

    def _up(self, unit: str) -> JobResult:
        self.n += 1
        self.active[unit], self.invocation[unit] = "active", f"{self.n:032x}"
        return JobResult(unit, str(self.n), "done")

    def restart(self, unit: str, timeout: float) -> JobResult:
        self.calls.append(f"restart {unit}")
        return self._up(unit)

    def start(self, unit: str, timeout: float) -> JobResult:
        self.calls.append(f"start {unit}")
        return self._up(unit)

    def stop(self, unit: str, timeout: float) -> JobResult:
        self.calls.append(f"stop {unit}")
        self.active[unit] = "inactive"
        return JobResult(unit, "0", "done")


@dataclass
class Rig:
    root: Path
    units: Units = field(default_factory=Units)

    def __post_init__(self) -> None:
        self.etc = self.root / "etc"
        self.ready = self.root / "run"
        self.etc.mkdir()
        self.ready.mkdir()
        log = EventLog("t", self.root / "events.jsonl")
        state = StateDir(self.root / "state")
        self.hook = DaemonUnit(UnitFiles(self.etc), state, ENGINE, self.units, log, 0.0)
        # every restart runs inside a change, under its recovery record (unitjobs.JobLog refuses without)
        state.save_record(Record("t", ENGINE, PHASE_RESTARTED, None, "0" * 64))

    def running(self, engine: str, daemon: str, pid: int) -> None:
        """Both units installed and running (the daemon started by deployctl with this text), ready."""
        (self.etc / ENGINE).write_text(engine)
        (self.etc / DAEMON).write_text(daemon)
        self.units._up(ENGINE)
        self.units._up(DAEMON)
        self.hook._save(DAEMON, self.units.invocation[DAEMON], daemon)
        (self.ready / "GPU-0.ready").write_text(str(pid))

    def restart(self) -> list[str]:
        self.hook.restart_engine(lambda: self.units.restart(ENGINE, 1), 1)
        return self.units.calls


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_a_fingerprint_keeping_change_restarts_only_the_engine(rig: Rig) -> None:
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    daemon = rig.units.invocation[DAEMON]
    assert rig.restart() == [f"restart {ENGINE}"]
    assert rig.units.invocation[DAEMON] == daemon


def test_a_changed_daemon_unit_restarts_the_daemon_between_the_engines_stop_and_start(rig: Rig) -> None:
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    (rig.etc / DAEMON).write_text(daemon_text(dtype="float16"))
    assert rig.restart() == [f"stop {ENGINE}", f"restart {DAEMON}", f"start {ENGINE}"]
    assert rig.hook._started(rig.units.unit_state(DAEMON)) == daemon_text(dtype="float16")


def test_a_dead_daemon_is_found_before_the_engine_restart_and_restarted(rig: Rig) -> None:
    rig.running(engine_text(rig.ready), daemon_text(), DEAD_PID)  # killed -9: its ready file stays
    assert rig.restart() == [f"stop {ENGINE}", f"restart {DAEMON}", f"start {ENGINE}"]


def test_a_stopped_daemon_is_started_before_the_engine(rig: Rig) -> None:
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    rig.units.stop(DAEMON, 1)
    rig.units.calls.clear()
    assert rig.restart() == [f"stop {ENGINE}", f"start {DAEMON}", f"start {ENGINE}"]


def test_an_engine_no_longer_its_client_stops_the_daemon_after_the_engine(rig: Rig) -> None:
    """The running engine reads its weights through the daemon while it drains: engine, daemon, engine."""
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    (rig.etc / ENGINE).write_text(engine_text(rig.ready, client=False))
    assert rig.restart() == [f"stop {ENGINE}", f"stop {DAEMON}", f"start {ENGINE}"]


def test_the_write_backs_up_under_the_engines_stamp_and_a_restore_puts_it_back(rig: Rig) -> None:
    old, new = engine_text(rig.ready), engine_text(rig.ready, fraction="0.8")
    rig.running(old, daemon_text(), os.getpid())
    backup = f"{ENGINE}.bak.20261205T120000Z"
    (rig.etc / backup).write_text(old)
    rig.hook.write(old, new, backup, daemon_text(dtype="float16"), None)
    assert (rig.etc / DAEMON).read_text() == daemon_text(dtype="float16")
    assert (rig.etc / paired(ENGINE, backup, DAEMON)).read_text() == daemon_text()
    rig.hook.restore(backup)
    assert (rig.etc / DAEMON).read_text() == daemon_text()


def test_a_rollback_to_a_unit_from_before_the_cache_removes_the_daemon_unit(rig: Rig) -> None:
    old, new = engine_text(rig.ready, client=False), engine_text(rig.ready)
    (rig.etc / ENGINE).write_text(old)
    backup = f"{ENGINE}.bak.20261205T120000Z"
    (rig.etc / backup).write_text(old)
    rig.hook.write(old, new, backup, daemon_text(), None)
    assert (rig.etc / DAEMON).is_file() and not (rig.etc / paired(ENGINE, backup, DAEMON)).exists()
    (rig.etc / ENGINE).write_text(new)
    rig.hook.restore(backup)
    assert not (rig.etc / DAEMON).exists()


def test_a_daemon_backup_whose_engine_backup_was_pruned_goes_too(rig: Rig) -> None:
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    orphan = f"{DAEMON}.bak.20250101T000000Z"
    (rig.etc / orphan).write_text(daemon_text())
    rig.hook.write(None, engine_text(rig.ready), None, daemon_text(), None)
    assert not (rig.etc / orphan).exists()


def test_a_daemon_that_fails_to_start_is_not_waited_for_and_the_engine_not_started_onto_it(rig: Rig) -> None:
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    (rig.etc / DAEMON).write_text(daemon_text(dtype="float16"))
    (rig.ready / "GPU-0.ready").unlink()  # the restarted daemon never gets ready: it exits, systemd waits
    rig.units.failing.add(DAEMON)
    rig.hook.ready_s = 3600.0  # a wait to the bound would hang the test
    assert rig.restart() == [f"stop {ENGINE}", f"restart {DAEMON}"]
    assert "did not come up" in (rig.root / "events.jsonl").read_text()
    assert rig.hook.failed is not None and DAEMON in rig.hook.failed  # the outcome names the daemon


def test_a_change_that_goes_back_to_an_older_backup_keeps_that_backups_daemon_copy(rig: Rig) -> None:
    """Installed but not running as written: the transaction names the last other backup instead of taking
    one; its daemon copy is that time's and stays so."""
    old = engine_text(rig.ready, fraction="0.8")
    rig.running(engine_text(rig.ready), daemon_text(dtype="float16"), os.getpid())
    backup = f"{ENGINE}.bak.20261205T120000Z"
    (rig.etc / backup).write_text(old)
    (rig.etc / paired(ENGINE, backup, DAEMON)).write_text(daemon_text())
    rig.hook.write(engine_text(rig.ready), engine_text(rig.ready), backup, daemon_text(dtype="float16"), None)
    assert (rig.etc / paired(ENGINE, backup, DAEMON)).read_text() == daemon_text()


# -- the daemon's one name (an adopted unit's own BindsTo= is never the daemon) ---------------------------
FABRIC = "nvidia-fabricmanager.service"
FOREIGN = st.lists(
    st.sampled_from([f"BindsTo={FABRIC}", "BindsTo=nvidia-persistenced.service", f"After={FABRIC}",
                     "Requires=network-online.target", "BindsTo=a.service b.service"]),
    min_size=1, max_size=4,
)  # fmt: skip


def adopted(folder: Path, foreign: list[str], fraction: str = "0.9") -> str:
    """An adopted unit: its verbatim [Unit] lines first (an HGX host's fabric manager), then the daemon's."""
    text = engine_text(folder, fraction=fraction)
    return text.replace("[Unit]\n", "[Unit]\n" + "".join(f"{line}\n" for line in foreign), 1)


@given(FOREIGN)
def test_an_adopted_units_own_binds_to_is_never_taken_for_the_daemon(foreign: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig(Path(tmp))
        fabric = "[Unit]\nDescription=NVIDIA fabric manager\n[Service]\nExecStart=/usr/bin/nv-fabricmanager\n"
        (rig.etc / FABRIC).write_text(fabric)
        old, new = adopted(rig.ready, foreign), adopted(rig.ready, foreign, fraction="0.8")
        rig.running(old, daemon_text(), os.getpid())
        backup = f"{ENGINE}.bak.20261205T120000Z"
        (rig.etc / backup).write_text(old)
        rig.hook.write(old, new, backup, daemon_text(dtype="float16"), None)
        (rig.etc / ENGINE).write_text(new)
        calls = rig.restart()
        assert (rig.etc / FABRIC).read_text() == fabric  # never written over
        assert not list(rig.etc.glob(f"{FABRIC}.bak.*"))
        assert (rig.etc / DAEMON).read_text() == daemon_text(dtype="float16")
        assert calls == [f"stop {ENGINE}", f"restart {DAEMON}", f"start {ENGINE}"]
        rig.hook.restore(backup)
        assert (rig.etc / FABRIC).read_text() == fabric and (rig.etc / DAEMON).read_text() == daemon_text()


def test_the_unit_writer_refuses_any_name_but_the_daemons(rig: Rig) -> None:
    from agent.host.units import UnitWriteError

    with pytest.raises(UnitWriteError, match=r"not the weight-cache daemon of sglang\.service"):
        rig.hook._put(FABRIC, None, daemon_text())
    assert not (rig.etc / FABRIC).exists()


def test_a_remembered_foreign_daemon_name_is_ignored(rig: Rig) -> None:
    """weight-cache.json written by an agent that took the fabric manager for the daemon: not trusted."""
    fabric = "[Service]\nExecStart=/usr/bin/nv-fabricmanager\n"
    (rig.etc / FABRIC).write_text(fabric)
    rig.hook._save(FABRIC, "", "")
    (rig.etc / ENGINE).write_text(engine_text(rig.ready, client=False))
    rig.hook.write(None, engine_text(rig.ready, client=False), None, None, None)
    assert rig.restart() == [f"restart {ENGINE}"] and (rig.etc / FABRIC).read_text() == fabric


def test_a_client_unit_tied_to_another_daemon_is_refused(rig: Rig) -> None:
    text = engine_text(rig.ready).replace(f"BindsTo={DAEMON}", f"BindsTo={FABRIC}")
    said = rig.hook.refusal(text, daemon_text())
    assert said is not None and f"names no Requires={DAEMON}" in said
    assert rig.hook.refusal(text, None) == said


# -- the wait for the daemon: every rank's ready file ---------------------------------------------------
@dataclass
class Ranks(Units):
    """The daemon's ranks write their ready files one at a time, a poll apart (tp-size 8)."""

    folder: Path = Path("/nonexistent")
    pid: int = 0
    at_engine_start: list[int] = field(default_factory=list)

    def unit_state(self, unit: str) -> UnitState:
        if unit == DAEMON and self.active.get(DAEMON) == "active":
            have = len(list(self.folder.glob("*.ready")))
            if have < 8:
                (self.folder / f"GPU-{have}.ready").write_text(str(self.pid))
        return super().unit_state(unit)

    def start(self, unit: str, timeout: float) -> JobResult:
        if unit == ENGINE:
            self.at_engine_start.append(len(list(self.folder.glob("*.ready"))))
        return super().start(unit, timeout)


def test_the_engine_starts_only_once_every_ranks_ready_file_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent.host.watch.poll.POLL_S", 0.0)
    units = Ranks(folder=tmp_path / "run", pid=os.getpid())
    rig = Rig(tmp_path, units)
    rig.running(engine_text(rig.ready), daemon_text(), os.getpid())
    (rig.ready / "GPU-0.ready").unlink()
    units.stop(DAEMON, 1)
    units.calls.clear()
    rig.hook.ready_s = 3600.0
    assert rig.restart() == [f"stop {ENGINE}", f"start {DAEMON}", f"start {ENGINE}"]
    assert units.at_engine_start == [8]  # not 1: the first GPU's file alone


def test_an_engine_without_a_ready_folder_is_not_waited_on_for_the_full_weights_time(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ready-file folder in the engine's unit: nothing can show the weights loaded; the daemon's job says
    at once, never after waiting out weights_s for files that cannot appear."""
    from agent.host.roles import daemon as daemon_unit

    waited: list[float] = []
    monkeypatch.setattr(daemon_unit, "wait_until", lambda done, s: waited.append(s) or done())
    text = engine_text(rig.ready).replace(f"Environment=SGLANG_WEIGHT_CACHE_READY_TEMPLATE={rig.ready}", "# ")
    rig.running(text, daemon_text(), os.getpid())
    rig.units.stop(DAEMON, 1)
    rig.hook.ready_s = 1800.0
    rig.units.calls.clear()
    assert rig.restart() == [f"stop {ENGINE}", f"start {DAEMON}", f"start {ENGINE}"]
    assert waited == []
