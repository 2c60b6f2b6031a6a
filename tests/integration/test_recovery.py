"""Recovery on the real test host: never a restart for nothing, never a lost good backup, never a guess.

Each test injects its fault for real (a killed runner, a record written by hand, a hand-edited unit, a
drop-in, a rotated journal) and checks what systemd runs afterwards, not what deployctl says.
"""

from __future__ import annotations

import json

import pytest

from agent.exitcodes import ExitCode
from agent.sglang.flags import parse_unit_flags
from tests import faultkit as fk
from tests.integration.conftest import cli, invocation, popen, wait_pool
from tests.integration.test_faults import NEW_CONTEXT, apply, base

pytestmark = pytest.mark.integration
__all__ = ["base"]  # the fixture, shared with the fault tests

UNITS = "/etc/systemd/system"
RECORD = f"{fk.STATE}/units/sglang.service/pending.json"


def put_backup(sim, name: str, text: str) -> None:
    sim.host.put(f"{UNITS}/{name}", text.encode())


@pytest.mark.parametrize("step", ["backup", "write", "reload"])
def test_killed_before_the_restart_step_puts_the_file_back_without_a_restart(sim, base, step):
    old, pool = base
    before = invocation(sim)
    watcher = fk.Watcher(sim, step)
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()
    fk.kill_runner(sim, hit.txn)
    proc.communicate(timeout=180)
    st = cli(sim, "status", sim.name)  # whoever recovers (the follower or status), the result is the same
    assert st.returncode == ExitCode.OK, st.stderr
    fk.wait_idle(sim)
    assert not fk.pending(sim)
    assert sim.unit_text().encode() == old.encode()
    assert invocation(sim) == before, "the old service was restarted for nothing"
    assert wait_pool(sim) == pool
    assert (
        fk.sh(sim, "systemctl", "show", "-p", "NeedDaemonReload", "--value", "sglang.service").strip() == "no"
    )


@pytest.mark.parametrize("via", ["apply", "orphan"])
def test_a_failed_recovery_stops_everything_and_names_the_good_backup(sim, base, via):
    """`apply` finds the record itself, or (its runner gone without an outcome) recovers it first."""
    old, _ = base
    good = "sglang.service.bak.20260101T000000Z"
    put_backup(sim, good, old)
    put_backup(
        sim, "sglang.service.bak.20250101T000000Z", old + "# an older one\n"
    )  # a default to roll back to
    txn = "20260101T000000Z-abcdef"
    record = {"txn": txn, "unit": "sglang.service", "phase": "restarted"}
    record |= {"backup": good, "new_sha256": "0" * 64, "verb": "apply", "started": "2026-01-01T00:00:00"}
    sim.host.put(RECORD, json.dumps(record).encode())
    fk.sh(sim, "python3", "-c", fk.SET_LAST_TXN, txn)
    if via == "apply":  # that transaction ended (with an outcome): apply meets the record on its own
        sim.host.put(f"{fk.STATE}/txn/{txn}/events.jsonl", b'{"kind": "outcome", "message": "x"}\n')
    sim.set_sim_env({"SGLANG_SIM_FAULT": "crash_loading"})  # the old unit cannot start either ...
    fk.sh(sim, "systemctl", "daemon-reload")
    fk.sh(sim, "systemctl", "restart", "--no-block", "sglang.service")  # ... and is not running now
    backups = sim.backups()
    try:
        r = apply(sim)
        assert r.returncode == ExitCode.ROLLBACK_FAILED, r.stdout + r.stderr
        assert good in r.stdout + r.stderr and "nothing" in r.stdout + r.stderr
        assert sim.backups() == backups  # no backup of a broken unit taken, none pruned
        assert json.loads(sim.host.read(RECORD))["backup"] == good  # the record still points at it
        assert parse_unit_flags(sim.unit_text()) == parse_unit_flags(old)
        r = cli(sim, "rollback", sim.name, "--yes")  # the default rollback is stopped the same way
        assert r.returncode == ExitCode.ROLLBACK_FAILED, r.stdout + r.stderr
    finally:
        sim.set_sim_env({})
        fk.sh(sim, "systemctl", "daemon-reload")
    r = apply(sim)  # the person fixed the host: the next run restores the good unit, then applies
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert not fk.pending(sim)


def test_a_corrupt_record_refuses_every_change_and_says_so(sim, base):
    old, pool = base
    before = invocation(sim)
    sim.host.put(RECORD, b'{"txn": "20260101T000000Z-abcdef", "phase": ')  # torn by a disk fault
    try:
        for argv in (("apply", sim.name, "--context", "200k", "--yes"), ("rollback", sim.name, "--yes")):
            r = cli(sim, *argv)
            assert r.returncode == ExitCode.REFUSED, r.stdout + r.stderr
            assert "pending.json is unreadable" in r.stdout + r.stderr
        st = cli(sim, "status", sim.name)
        assert "recovery record is unreadable" in st.stdout, st.stdout
        assert sim.unit_text().encode() == old.encode() and invocation(sim) == before
    finally:
        fk.sh(sim, "rm", "-f", RECORD)
    assert wait_pool(sim) == pool


def test_a_hand_edited_unit_that_is_not_utf8_is_backed_up_and_restored_byte_for_byte(sim, base):
    old, _ = base
    hand = old.replace("Description=", "# caf\xe9: edited by hand in Latin-1\nDescription=", 1)
    raw = hand.encode("latin-1")
    sim.host.put(f"{UNITS}/sglang.service", raw)
    fk.sh(sim, "systemctl", "daemon-reload")
    r = apply(sim)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    taken = [n for n in sim.backups() if sim.host.read(f"{UNITS}/{n}") == raw]
    assert taken, "no backup holds the hand-edited bytes"
    r = cli(sim, "rollback", sim.name, "--to", taken[-1], "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert sim.host.read(f"{UNITS}/sglang.service") == raw


def test_rollback_to_the_oldest_backup_keeps_it(sim, base):
    old, _ = base
    names = [f"sglang.service.bak.2026010{i}T000000Z" for i in range(1, 10)]
    for i, name in enumerate(names):  # nine distinct backups, the oldest first; with the new one: ten
        put_backup(sim, name, old.replace("[Unit]\n", f"[Unit]\n# version {i}\n", 1))
    r = cli(sim, "rollback", sim.name, "--to", names[0], "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert names[0] in sim.backups(), "the backup just restored was pruned"
    assert sim.unit_text() == sim.host.read(f"{UNITS}/{names[0]}").decode()


def test_rollback_without_to_after_an_automatic_rollback_restores_a_different_unit(sim, base):
    old, _ = base
    assert apply(sim).returncode == ExitCode.OK
    at_200k = sim.unit_text()
    r = apply(sim, "400k", "--force", "--allow-longer-context")
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert sim.unit_text() == at_200k  # its newest backup is a copy of this very unit
    r = cli(sim, "rollback", sim.name, "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert sim.unit_text() != at_200k, r.stdout
    assert sim.unit_text() == old, (r.stdout, sim.backups())


@pytest.mark.parametrize("where", ["drop-in", "run"])
def test_a_unit_that_systemd_would_not_run_as_written_is_refused(sim, base, where):
    old, pool = base
    before = invocation(sim)
    if where == "drop-in":  # a drop-in replacing the command: our ExecStart= would never run
        path = f"{UNITS}/sglang.service.d/zz-override.conf"
        exec_start = old[old.index("ExecStart=") :].split("\n[")[0].split("\nTimeoutStartSec")[0]
        sim.host.put(path, f"[Service]\nExecStart=\n{exec_start}\n".encode())
    else:  # a copy in a folder systemd searches before /etc/systemd/system shadows ours
        path = "/run/systemd/system.control/sglang.service"
        fk.sh(sim, "mkdir", "-p", "/run/systemd/system.control")
        fk.sh(sim, "cp", f"{UNITS}/sglang.service", path)
    fk.sh(sim, "systemctl", "daemon-reload")
    backups = sim.backups()
    try:
        r = apply(sim)
        assert r.returncode == ExitCode.REFUSED, r.stdout + r.stderr
        assert path in r.stdout + r.stderr
        assert sim.backups() == backups  # refused before the backup: nothing of this run is left
        assert sim.unit_text().encode() == old.encode()
        assert invocation(sim) == before and not fk.pending(sim)
    finally:
        fk.sh(sim, "rm", "-f", path)
        fk.sh(sim, "systemctl", "daemon-reload")
    assert wait_pool(sim) == pool


def test_no_restart_when_the_verified_starts_log_is_gone_after_a_restart(sim, base):
    r = apply(sim)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    fk.sh(sim, "systemctl", "restart", "sglang.service")  # as a reboot would: a start deployctl never saw
    pool = wait_pool(sim)
    assert pool >= 200_000
    fk.sh(sim, "journalctl", "--rotate")
    fk.sh(sim, "journalctl", "--vacuum-time=1s")
    before = invocation(sim)
    r = apply(sim)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert "up to date" in r.stdout + r.stderr
    assert invocation(sim) == before
    assert parse_unit_flags(sim.unit_text())["context-length"] == NEW_CONTEXT
