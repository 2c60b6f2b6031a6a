"""The boot guard of a group node's uncommitted change (agent/host/change/bootguard.py): written with the
record, gone once the change is decided; after a reboot (an empty /run) the unit's start at boot is skipped
until the agent has decided. systemd's condition is modelled by `starts_at_boot`."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.change.bootguard import DROP_IN, BootGuard
from agent.protocol.events import Outcome
from agent.protocol.groupmachine import Decision
from tests.pure.test_group_node import coordinator, node_request, node_unit, on_vote
from tests.pure.txnfakes import UNIT, Host, Script, unit_text

OLD, NEW = 100_000, 200_000


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))


def guard(host: Host) -> BootGuard:
    return BootGuard(host.etc, UNIT, host.root / "run/deployctl")


def starts_at_boot(host: Host) -> bool:
    """systemd at boot: every ConditionPathExists= of the unit's drop-ins must name a path that exists."""
    folder = host.etc / f"{UNIT}.d"
    for conf in sorted(folder.glob("*.conf")) if folder.is_dir() else []:
        for line in conf.read_text().splitlines():
            if line.startswith("ConditionPathExists=") and not Path(line.split("=", 1)[1]).exists():
                return False
    return True


def reboot(host: Host) -> None:
    """/run is a tmpfs: empty after a boot."""
    for f in (host.root / "run/deployctl").glob("*"):
        f.unlink()


@pytest.mark.parametrize("decision", [Decision.COMMIT, Decision.ABORT])
def test_a_nodes_unit_is_guarded_while_undecided_and_unguarded_once_decided(host: Host, decision) -> None:
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    coordinator(txn, decision)
    during: list[tuple[bool, bool]] = []
    on_vote(txn, "stopped", lambda s: during.append((guard(host).armed(), starts_at_boot(host))))
    result = txn.apply()
    assert result.outcome is (Outcome.APPLIED if decision is Decision.COMMIT else Outcome.ROLLED_BACK)
    assert during == [(True, True)]  # guarded, and this boot's agent may start it
    assert not guard(host).armed() and starts_at_boot(host)
    assert not (host.etc / f"{UNIT}.d").exists()


def test_a_rebooted_node_of_an_uncommitted_change_does_not_start_at_boot(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    on_vote(txn, "stopped", lambda s: reboot(host))  # the node reboots while it waits for "go"
    seen: list[bool] = []
    on_vote(txn, "stopped", lambda s: seen.append(starts_at_boot(host)))
    result = txn.apply()  # no word from the coordinator
    assert seen == [False]  # a boot then would have skipped the new server
    record = Path(txn.req.state_dir) / "units" / UNIT / "pending.json"
    assert guard(host).armed() == record.exists(), result.message  # the guard lives as long as the record
    if guard(host).armed():
        assert "ConditionPathExists=" in (host.etc / f"{UNIT}.d" / DROP_IN).read_text()


def test_a_recovery_after_a_reboot_lets_its_own_start_through_and_removes_the_guard(host: Host) -> None:
    from tests.pure.test_group_node import agent_died_mid_change, recover_verb

    signals = agent_died_mid_change(host, 1, go_age_s=1e6)
    guard(host).arm()  # the dead change's guard, as its record's write left it
    reboot(host)
    assert not starts_at_boot(host)
    signals.for_rollback().go()
    _, outcome, message = recover_verb(host)
    assert outcome is Outcome.ROLLED_BACK, message
    assert host.systemd.active == "active" and not guard(host).armed()


def test_a_one_host_change_writes_no_guard(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    assert host.transaction(host.request(NEW)).apply().outcome is Outcome.APPLIED
    assert not (host.etc / f"{UNIT}.d").exists() and not (host.root / "run/deployctl").exists()


def test_a_guard_found_with_no_record_is_removed(host: Host) -> None:
    """An older agent killed between a record's removal and its guard's: no change is pending, so the
    guard would only skip the unit's start at every boot."""
    from tests.pure.test_group_node import recover_verb

    host.install(host.etc, node_unit(OLD, 1))
    guard(host).arm()
    reboot(host)
    _, outcome, _ = recover_verb(host, died=None)
    assert outcome is Outcome.UP_TO_DATE and not guard(host).armed() and starts_at_boot(host)


def test_a_kill_while_arming_leaves_a_record_to_recover(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is saved before the guard is armed: a guard never exists without its record."""

    class Died(BaseException):
        pass

    def die(self: BootGuard) -> None:
        raise Died

    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    monkeypatch.setattr(BootGuard, "arm", die)
    with pytest.raises(Died):
        txn.apply()
    assert (host.root / "state" / "units" / UNIT / "pending.json").exists() and not guard(host).armed()


@pytest.mark.parametrize("decision", [Decision.COMMIT, Decision.ABORT])
def test_systemd_is_reloaded_once_the_guard_is_gone(
    host: Host, decision: Decision, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd loaded the guard's drop-in with the new unit; its removal unreloaded leaves the unit reading
    NeedDaemonReload=yes, so the next apply found it not running as installed and restarted it for nothing
    (a [pd] router, unchanged, restarted by the next change after a group rollback on the test hosts)."""
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    coordinator(txn, decision)
    loaded: list[bool] = []  # at each reload: whether systemd read the guard's drop-in
    reload = host.systemd.daemon_reload

    def seen_reload() -> None:
        loaded.append(guard(host).armed())
        reload()

    monkeypatch.setattr(host.systemd, "daemon_reload", seen_reload)
    txn.apply()
    assert True in loaded and loaded[-1] is False  # the last reload saw the unit without it
