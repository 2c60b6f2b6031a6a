"""Holes a hostile review found in the drop-in pre-check, the settle before a commit with [weight_cache]
(host/change/settle.py) and the daemon's status; each test failed before its fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.host.change import settle as settle_mod
from agent.host.change.settle import Seen, Settled, settle
from agent.host.change.write import sets_exec_start
from agent.orchestrate.session import status_text
from agent.protocol.events import Outcome
from agent.protocol.requests import (
    ANSWER_TIMEOUT_S,
    ENGINE_BACK_S,
    MAX_RESTARTS_UNDER_CHECK,
    RESTART_JOB_TIMEOUT_S,
    Request,
    conversation_bound_s,
)
from tests.pure import test_kill_at_every_job as K
from tests.pure.txnfakes import UNIT, FakeProbe, unit_text

# -- d5cac49: sets_exec_start reads a drop-in as systemd does? ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[Service]\nExecStart\t=\nExecStart\t=/bin/other\n",  # systemd strips any whitespace around '='
        "[Service]\n\tExecStart=\n\tExecStart=/bin/other\n",  # leading tab: strip() covers it (passes)
    ],
    ids=["tab-before-equals", "leading-tab"],
)
def test_a_drop_in_that_sets_exec_start_with_whitespace_systemd_accepts_is_seen(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "10-override.conf"
    path.write_text(text)
    assert sets_exec_start(str(path)), "systemd runs this drop-in's ExecStart=, the check misses it"


@pytest.mark.parametrize(
    "text",
    [
        # a continuation line: systemd reads one Environment= assignment, no ExecStart=
        "[Service]\nEnvironment=A=1 \\\nExecStart=/not/a/key\n",
        # ExecStart= in a section that is not [Service]: systemd ignores it ("Unknown key name")
        "[Unit]\nDescription=x\n[X-Notes]\nExecStart=/bin/other\n",
    ],
    ids=["continuation", "other-section"],
)
def test_a_drop_in_that_does_not_set_exec_start_is_not_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "10-override.conf"
    path.write_text(text)
    assert not sets_exec_start(str(path)), (
        "refused (apply and rollback) for an ExecStart= systemd never reads"
    )


# -- 1a787d9: the conversation bound knows nothing of the re-watched starts --------------------------------


def test_the_laptops_bound_covers_the_starts_re_watched_under_the_checks() -> None:
    req = Request(verb="apply", unit_text="x", target_context=1)
    t = req.timeouts
    one_start = RESTART_JOB_TIMEOUT_S + t.weights_s + t.pool_s + t.ready_s
    # recovery's restore, the new start, up to MAX re-watched starts (each after a daemon wait of up to
    # weights_s and with its own smoke test), and the rollback's start
    worst = (
        ANSWER_TIMEOUT_S
        + t.weights_s  # pre-warm
        + (3 + MAX_RESTARTS_UNDER_CHECK) * one_start
        + MAX_RESTARTS_UNDER_CHECK * (t.weights_s + ENGINE_BACK_S)
        + (1 + MAX_RESTARTS_UNDER_CHECK) * req.smoke.timeout_s
    )
    assert conversation_bound_s(req) >= worst, (
        f"the laptop gives up at {conversation_bound_s(req):.0f} s while the host may still be checking "
        f"until {worst:.0f} s, then commits or rolls back unseen"
    )


# -- 1a787d9: settle waits the whole daemon bound for a daemon that will never come back ------------------


def test_a_daemon_stopped_for_good_is_not_waited_for_to_the_weights_bound(monkeypatch) -> None:
    clock = [0.0]
    looks: list[int] = []

    def fake_wait(done, timeout_s):  # type: ignore[no-untyped-def]
        from agent.host.watch.poll import wait_until

        def sleep(s: float) -> None:
            clock[0] += s

        return wait_until(done, timeout_s, clock=lambda: clock[0], sleep=sleep)

    monkeypatch.setattr(settle_mod, "wait_until", fake_wait)

    def look() -> Seen:
        looks.append(1)
        return Seen("inactive", "dead", "inactive", "a" * 32)  # `systemctl stop` of the daemon: no Restart=

    assert settle(look, "a" * 32, daemon_s=1800.0) is Settled.DAEMON_DOWN
    assert clock[0] < 60, f"waited {clock[0]:.0f} s ({len(looks)} looks) for a daemon nothing will restart"


# -- 1a787d9: after_check's "client" is not the daemon's "client" ----------------------------------------


def hand_made_client(context: int) -> str:
    """A unit that predates deployctl: client mode, tied to a daemon of its own name."""
    text = unit_text(context).replace("--context-length", "--weight-cache-mode client --context-length")
    return text.replace("[Unit]\n", "[Unit]\nBindsTo=my-cache.service\nAfter=my-cache.service\n")


def test_a_rollback_to_a_client_unit_tied_to_another_daemon_is_not_rolled_back(tmp_path: Path) -> None:
    """after_check asks weight_cache.client() (the flag alone); DaemonUnit asks daemon_unit() (flag and
    tie). A backup in client mode tied to its own daemon: the rollback stops our daemon (its engine is no
    client of it), then after_check waits weights_s for that daemon and calls it 'down': the person's
    rollback is rolled back to the unit they left."""
    c = K.Class("hand", hand_made_client(K.OLD), False, K.client(K.NEW), K.daemon())
    host, _ = K.rig(tmp_path, c)
    assert K.apply(host, c, K.NEW).outcome is Outcome.APPLIED
    back = host.transaction(replace(host.request(K.OLD), verb="rollback"))
    said = back.rollback()
    on_disk = (host.etc / UNIT).read_text()
    assert on_disk == c.old, f"{said.outcome}: {said.message}"
    assert said.outcome is not Outcome.ROLLED_BACK, said.message


# -- 1a787d9: the same hole the commit closed stays open in the rollback's verify_old ----------------------


class CrashOnHealth(FakeProbe):
    """The daemon crashes (Restart= pending) while deployctl asks the old unit's /health."""

    units: K.TwoUnits | None = None

    def wait_ready(self, timeout_s: float) -> None:
        super().wait_ready(timeout_s)
        assert self.units is not None
        self.units.d_active = "activating"  # waiting for RestartSec
        self.units.active, self.units.sub = "inactive", "dead"  # Requires=/PartOf=: the engine went too


def test_a_daemon_crash_under_the_rollbacks_check_is_not_reported_healthy(tmp_path: Path) -> None:
    c = next(x for x in K.classes(K.CRASH) if x.name == "keep")
    host, units = K.rig(tmp_path, c)
    probe = CrashOnHealth()
    probe.units = units
    probe.unit = lambda: units.loaded
    host.probe = probe
    said = K.apply(host, c, K.CRASH)
    # the daemon never comes back in this fake: the old unit is not said healthy, the daemon is named
    assert said.outcome is Outcome.ROLLBACK_FAILED, said.message
    assert "weight-cache daemon sglang-weight-cache.service went down" in said.message


# -- 1a787d9: bounded: a daemon that crashes under every check rolls back --------------------------------


class CrashOnEveryServerInfo(FakeProbe):
    units: K.TwoUnits | None = None
    crashes: int = 0

    def server_info(self):  # type: ignore[no-untyped-def]
        info = super().server_info()
        u = self.units
        assert u is not None
        if u.loaded == K.client(K.NEW):  # only while the new unit is checked
            self.crashes += 1
            u._daemon_down()
            u._daemon_up()
            u.boot(*u.script.lines(u.loaded))  # systemd restarts the engine after it: a new invocation
        return info


def test_a_daemon_that_crashes_under_every_check_rolls_back_after_the_bound(tmp_path: Path) -> None:
    c = next(x for x in K.classes(K.NEW) if x.name == "keep")
    host, units = K.rig(tmp_path, c)
    probe = CrashOnEveryServerInfo()
    probe.units, probe.unit = units, (lambda: units.loaded)
    host.probe = probe
    said = K.apply(host, c, K.NEW)
    assert said.outcome is Outcome.ROLLED_BACK, said.message
    assert probe.crashes == MAX_RESTARTS_UNDER_CHECK + 1
    assert (host.etc / UNIT).read_text() == c.old


# -- dac8e69: status of a crash-looping engine beside a running daemon -----------------------------------


def test_an_engine_waiting_for_its_restart_beside_a_running_daemon_serves_nothing() -> None:
    st = {
        "state": {"active_state": "activating", "sub_state": "auto-restart"},
        "daemon": {"unit": "sglang-weight-cache.service", "active_state": "active", "sub_state": "running"},
        "last_txn": None,
    }
    assert "serves nothing" in status_text("ct200", "sglang.service", st)  # type: ignore[arg-type]


def test_no_start_it_hint_while_a_change_is_running() -> None:
    st = {
        "state": {"active_state": "inactive", "sub_state": "dead"},
        "daemon": {"unit": "sglang-weight-cache.service", "active_state": "active", "sub_state": "running"},
        "running": {"verb": "apply", "txn": "t", "since": "now", "pid": 1},
        "last_txn": None,
    }
    text = status_text("ct200", "sglang.service", st)  # type: ignore[arg-type]
    assert "systemctl start" not in text, "a person told to start the engine in the middle of a change"


def test_a_running_daemon_whose_unit_file_was_deleted_is_still_shown(monkeypatch) -> None:
    """systemd keeps a running unit whose file is gone (then daemon-reload) as LoadState=not-found, still
    active: the daemon that holds the GPU memory is the one status hides."""
    from agent.host import verbs

    def state(unit: str):  # type: ignore[no-untyped-def]
        return {"unit": unit, "load_state": "not-found", "active_state": "active", "sub_state": "running"}

    monkeypatch.setattr(verbs, "_state", state)
    assert verbs._daemon_state("sglang.service") is not None


def test_a_drop_in_with_a_tab_before_the_equals_sign_is_not_applied_over(tmp_path: Path) -> None:
    """The same misreading in both checks (shadowed before the backup, loaded_elsewhere after the reload):
    systemd runs the drop-in's command, and the change is committed "applied" (on a host: whenever the
    drop-in's command passes /server_info's context, fraction and cap)."""
    from tests.pure.txnfakes import Host, Script

    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, unit_text(100_000))
    drop_in = host.etc / f"{UNIT}.d" / "zz-override.conf"
    drop_in.parent.mkdir()
    drop_in.write_text("[Service]\nExecStart\t=\nExecStart\t=/usr/bin/other --port 1\n")
    host.systemd.drop_ins = (str(drop_in),)
    said = host.transaction(host.request(200_000)).apply()
    assert said.outcome is Outcome.ERROR and str(drop_in) in said.message, f"{said.outcome}: {said.message}"


def test_an_unchanged_unit_under_an_exec_start_drop_in_is_not_up_to_date(tmp_path: Path) -> None:
    """compare() runs before shadowed(): the unit file matches, the running start (the drop-in's command)
    logged a pool that meets the target, and the apply says "already up to date" for a command it never
    wrote."""
    from tests.pure.txnfakes import Host, Script

    host = Host(tmp_path, Script(pools={"200000": 210_000}))
    host.install(host.etc, unit_text(200_000))
    drop_in = host.etc / f"{UNIT}.d" / "zz-override.conf"
    drop_in.parent.mkdir()
    drop_in.write_text("[Service]\nExecStart=\nExecStart=/usr/bin/other --context-length 200000\n")
    host.systemd.drop_ins = (str(drop_in),)
    said = host.transaction(host.request(200_000)).apply()
    assert said.outcome is not Outcome.UP_TO_DATE, said.message
