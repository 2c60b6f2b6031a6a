"""Review of the unit-job record and the boot guard: kills the existing matrix does not make (a kill inside
the recovery's own jobs, a kill between a record's removal and its guard's), with a fake systemd whose
dependencies are the loaded unit's, as systemd's are after daemon-reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.change.bootguard import BootGuard
from agent.protocol.events import Outcome
from agent.protocol.groupmachine import Decision
from tests.pure import test_kill_at_every_job as K
from tests.pure.test_boot_guard import guard, reboot, starts_at_boot
from tests.pure.test_group_node import (
    agent_died_mid_change,
    coordinator,
    node_request,
    node_unit,
    recover_verb,
)
from tests.pure.txnfakes import Host, Script

OLD, NEW = K.OLD, K.NEW


class Loaded(K.TwoUnits):
    """A stop of the daemon propagates (Requires=/BindsTo=/PartOf=) to the engine only when the engine's
    LOADED unit names it: after a daemon-reload onto a unit without the tie, systemd knows no dependency,
    whatever the running start was started from."""

    def _daemon_down(self) -> None:
        self.d_active = "inactive"
        if self.active == "active" and f"BindsTo={K.DAEMON}" in self.loaded:
            self.active, self.sub = "inactive", "dead"


def rig(root: Path, c: K.Class) -> tuple[Host, K.TwoUnits]:
    host, units = K.rig(root, c)
    units.__class__ = Loaded
    return host, units


STOP = next(c for c in K.classes(NEW) if c.name == "stop")  # [weight_cache] turned off: stop the daemon first


@pytest.mark.parametrize("fwd", [(1, "after"), (2, "before")])
def test_a_recovery_killed_after_planning_its_jobs_is_not_taken_for_untouched(tmp_path: Path, fwd) -> None:
    """The forward change stopped the daemon (its old engine keeps running: its loaded unit no longer ties
    it). Recovery 1 restores the client unit and plans [stop engine, start daemon, start engine] over the
    record's job list, then dies before its first job. Recovery 2 sees only engine jobs begun, the engine
    running its recorded invocation: "untouched", "restored and healthy", with the daemon down."""
    host, units = rig(tmp_path, STOP)
    units.kill_at = fwd
    with pytest.raises(K.Killed):
        K.apply(host, STOP, NEW)
    units.kill_at = (len(units.calls) + 1, "before")
    with pytest.raises(K.Killed):
        host.transaction(host.request(OLD)).recover_only()
    units.kill_at = None
    said = host.transaction(host.request(OLD)).recover_only()
    K.check_end(host, units, STOP, K.daemon(), said)


def test_a_change_killed_before_its_first_job_restarts_nothing(tmp_path: Path) -> None:
    """Killed before the daemon's stop was sent: nothing ran, the daemon runs its remembered invocation and
    the engine its recorded one. The recovery still restarts the engine (a model load for nothing)."""
    host, units = rig(tmp_path, STOP)
    units.kill_at = (1, "before")
    with pytest.raises(K.Killed):
        K.apply(host, STOP, NEW)
    before = len(units.calls)
    units.kill_at = None
    said = host.transaction(host.request(OLD)).recover_only()
    K.check_end(host, units, STOP, K.daemon(), said)
    assert units.calls[before:] == [], f"needless jobs: {units.calls[before:]}"


class Died(BaseException):
    pass


@pytest.mark.parametrize("decision", [Decision.COMMIT, Decision.ABORT])
def test_a_kill_between_the_records_removal_and_the_guards_leaves_no_unit_that_never_boots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decision: Decision
) -> None:
    """Ports.clear_record removes the record, then the drop-in. Killed in between, then rebooted: the unit's
    start is skipped at every boot, and the next recovery finds no record, so it never lets it through nor
    removes the drop-in: a group node that never starts again."""
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    coordinator(txn, decision)

    def die(self: BootGuard) -> None:
        raise Died

    monkeypatch.setattr(BootGuard, "disarm", die)
    with pytest.raises(Died):
        txn.apply()
    monkeypatch.undo()
    reboot(host)
    recover_verb(host, died=None)
    assert not guard(host).armed() and starts_at_boot(host), "the drop-in outlived its record"


def test_a_rank_left_in_doubt_does_not_start_its_old_unit_at_the_next_boot(tmp_path: Path) -> None:
    """Recovery leaves an in-doubt rank stopped, its old unit back, "never a generation of its own"; it
    clears the record and with it the boot guard, so the next boot starts the old server (enabled units
    start at boot) against peers that may run the new generation."""
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
    agent_died_mid_change(host, 1, go_age_s=1e6)
    guard(host).arm()
    _, outcome, message = recover_verb(host)
    assert outcome is Outcome.ROLLBACK_FAILED and "in doubt" in message, message
    reboot(host)
    assert not starts_at_boot(host), "an in-doubt rank's old unit starts at boot"


def boot(host: Host) -> None:
    """A reboot: /run empty, and the unit started at boot only where its drop-ins' conditions hold."""
    reboot(host)
    host.systemd.stop("sglang.service", 5.0)
    if starts_at_boot(host):
        host.systemd.start("sglang.service", 5.0)


def test_a_verified_group_record_found_after_a_reboot_is_not_kept_with_its_unit_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit() writes PHASE_VERIFIED (re-arming the guard) then clears both. Killed in between and rebooted,
    the guard skipped the start at boot; recovery takes the verified record, clears it and says "kept"
    (APPLIED) with the committed unit inactive: nothing starts it."""
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    coordinator(txn, Decision.COMMIT)

    def die(self: BootGuard) -> None:
        raise Died

    from agent.host.change import ports as txn_ports

    monkeypatch.setattr(txn_ports.Ports, "clear_record", lambda self: die(self.guard))
    with pytest.raises(Died):
        txn.apply()
    monkeypatch.undo()
    boot(host)
    _, outcome, message = recover_verb(host, died=None)
    assert host.systemd.active == "active" or outcome is not Outcome.APPLIED, (outcome, message)


def test_a_group_recovery_keeps_its_record_until_the_old_unit_is_back(tmp_path: Path) -> None:
    """recover_group clears the record (and the boot guard) before group_back starts the old unit: an old
    unit that then fails (or an agent killed during that start) leaves no record; the verb says "an earlier
    change (?) could not be rolled back ... backup (none: there was no unit)" and the next run recovers
    nothing."""
    host = Host(tmp_path, Script(pools={"200000": 210_000}, crash={"100000"}))  # the old unit fails to start
    signals = agent_died_mid_change(host, 1, go_age_s=1e6)
    signals.for_rollback().go()  # every rank stopped: the coordinator's go-back is there
    _, outcome, message = recover_verb(host)
    assert outcome is Outcome.ROLLBACK_FAILED, message
    record = tmp_path / "state" / "units" / "sglang.service" / "pending.json"
    assert record.exists() and "(?)" not in message, message


def test_the_model_reboots_an_in_doubt_node_as_the_code_leaves_it() -> None:
    """The model check's reboot keeps an in-doubt node stopped ("the boot guard"); the code clears the
    record and the guard of a node its recovery left in doubt, so its old unit starts at boot. With that
    one line of physics the model check's own invariant fails: two generations at once."""
    from tests.pure import test_group_model as M

    real = M.reboot

    def reboot_as_coded(w: M.World, i: int) -> M.World:
        booted = real(w, i)
        node = w.nodes[i]
        if node.phase.value == "in-doubt" and not w.record[i] and w.known[i]:  # no record, no guard
            booted = M.set_gen(booted, i, M.Gen.OLD)
        return booted

    M.reboot = reboot_as_coded
    try:
        M.explore(2, 2)
    finally:
        M.reboot = real


def test_converges_rollback_of_the_kept_rank_never_restarts_the_new_unit_alone(tmp_path: Path) -> None:
    """converge (group/run.py) rolls the one kept rank back with a plain one-host `rollback --to BACKUP`
    (group/apply.py and fleet/grouprun.py _rollback: no group in its request). When that old start fails
    its gate (a rendezvous that times out, an OOM), the one-host path rolls the rollback back: it restores
    the NEW unit and restarts it alone, while every other rank runs or waits on the old one. The model
    check takes converge's rollback as an atomic success (converge_moves: set_gen(OLD))."""
    host = Host(tmp_path, Script(pools={"200000": 210_000}, crash={"100000"}))
    host.install(host.etc, node_unit(NEW, 0))
    (host.etc / "sglang.service.bak.20261201T000000Z").write_text(node_unit(OLD, 0))
    restarts = host.systemd.restarts + host.systemd.starts
    req = host.request(OLD, verb="rollback", backup="sglang.service.bak.20261201T000000Z")
    host.transaction(req, txn="20261201T000200Z-conver").rollback()
    new_started_alone = (host.etc / "sglang.service").read_text() == node_unit(NEW, 0) and (
        host.systemd.active == "active" and host.systemd.restarts + host.systemd.starts > restarts + 1
    )
    assert not new_started_alone, "the kept rank's new unit was restarted alone after its rollback failed"


def test_a_hand_edited_daemon_file_is_written_back_without_restarting_the_engine(tmp_path: Path) -> None:
    """The daemon runs deployctl's text (weight-cache.json says so), the engine's unit is unchanged; only
    the daemon's file was edited by hand. compare's repair forces a change, and the change always
    restarts the engine (restart_engine): a model load to rewrite a file nothing runs."""
    keep = next(c for c in K.classes(OLD) if c.name == "keep")
    host, units = rig(tmp_path, keep)
    (host.etc / K.DAEMON).write_text(K.daemon() + "# edited by hand\n")
    said = K.apply(host, keep, OLD)
    assert (host.etc / K.DAEMON).read_text() == K.daemon(), said.message
    assert units.calls == [], f"{said.outcome}: {units.calls}"


def test_the_host_refuses_a_group_node_in_weight_cache_client_mode(tmp_path: Path) -> None:
    """[weight_cache] with [nodes] is refused by the laptop's inventory only. The host agent takes a group
    request whose unit is a daemon client (an older laptop, a hand-written request): it writes the daemon's
    new unit, and the group path (stop_then_start) never runs the daemon's jobs: the daemon keeps its old
    fingerprint under its new file, and the change is reported applied."""
    from dataclasses import replace

    def node(text: str, context: int) -> str:
        return text.replace(
            f"--context-length {context}", f"--context-length {context} --nnodes 2 --node-rank 1"
        )

    restart = next(c for c in K.classes(NEW) if c.name == "restart")
    host, units = rig(tmp_path, replace(restart, old=node(restart.old, OLD)))
    req = node_request(host, NEW, 1)
    txn = host.transaction(replace(req, unit_text=node(restart.new, NEW), daemon_text=restart.sent))
    coordinator(txn, Decision.COMMIT)
    said = txn.apply()
    on_disk = (host.etc / K.DAEMON).read_text()
    assert said.outcome is Outcome.ERROR or units.d_text == on_disk, (said.outcome, units.calls)
