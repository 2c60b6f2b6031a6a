"""A start replaced under the watch by a restart deployctl did not make: with [weight_cache], systemd's
Restart=always of a crashed daemon restarts the engine too (Requires=/PartOf=), a new invocation of the
same unit. The watch follows the newest start and judges it on its own, instead of watching the killed one
until "nothing logged" and rolling back a healthy engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.host.watch.start import MAX_RESTARTS_UNDER_WATCH
from agent.protocol.events import Outcome
from tests.pure.txnfakes import OOM_LINE, READY_LINE, Host, Script, kv_line, unit_text

OLD, NEW = 100_000, 200_000


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))


def restarted_under_watch(host: Host, starts: list[tuple[list[str], bool]]) -> None:
    """Once the watch follows a start of deployctl's restart, systemd restarts the service (not its own
    Restart=: NRestarts stays), once per entry of `starts`, each start logging its lines."""
    pending = list(starts)

    def poll() -> None:
        if watched(host) and pending:
            lines, up = pending.pop(0)
            host.systemd.boot(lines, up)

    host.systemd.on_poll = poll


def watched(host: Host) -> bool:
    """Whether the watch follows the service's current start (deployctl's restart's, or a later one)."""
    return host.systemd.restarts == 1 and host.journal.followed[-1:] == [host.systemd.invocation]


def test_a_start_replaced_by_a_daemon_restart_that_serves_is_applied(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    host.script.pools.pop("200000")  # deployctl's own start of the new unit is killed silent
    restarted_under_watch(host, [([kv_line(210_000), READY_LINE], True)])
    txn = host.transaction(host.request(NEW))
    result = txn.apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert host.systemd.restarts == 1 and host.systemd.loaded == unit_text(NEW)


def test_a_replacing_start_that_fails_is_judged_on_its_own(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    host.script.pools.pop("200000")
    restarted_under_watch(host, [([OOM_LINE], False)])
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert "OutOfMemoryError" in result.message and "nothing logged" not in result.message


@settings(deadline=None, max_examples=10)
@given(n=st.integers(min_value=1, max_value=MAX_RESTARTS_UNDER_WATCH + 3))
def test_restarts_under_the_watch_are_followed_up_to_a_bound(tmp_path_factory, n: int) -> None:
    host = Host(tmp_path_factory.mktemp("h"), Script(pools={"100000": 110_000}))
    host.install(host.etc, unit_text(OLD))
    silent: list[tuple[list[str], bool]] = [([], True)] * (n - 1)
    restarted_under_watch(host, [*silent, ([kv_line(210_000), READY_LINE], True)])
    result = host.transaction(host.request(NEW)).apply()
    if n <= MAX_RESTARTS_UNDER_WATCH:
        assert result.outcome is Outcome.APPLIED, result.message
    else:
        assert result.outcome is Outcome.ROLLED_BACK
        assert "restarted" in result.message and "under the watch" in result.message


def test_the_services_own_crash_restart_is_still_a_crash(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    host.script.pools.pop("200000")

    def poll() -> None:  # its own Restart= after a crash: NRestarts grows
        if watched(host) and host.systemd.n_restarts == 0:
            host.systemd.n_restarts = 1
            host.systemd.boot([kv_line(210_000), READY_LINE], True)

    host.systemd.on_poll = poll
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message  # the crashed start, not the next


def test_a_followed_start_records_its_gpu_processes_under_its_own_invocation(host: Host) -> None:
    """The facts give at_start_mib only while the unit runs the recorded invocation: the followed one."""
    from agent.host.watch import gpu_at_start
    from agent.protocol.answers import GpuProcess

    host.install(host.etc, unit_text(OLD))
    host.script.pools.pop("200000")
    restarted_under_watch(host, [([kv_line(210_000), READY_LINE], True)])
    t = host.transaction(host.request(NEW))
    held: GpuProcess = {
        "pid": 4242,
        "name": "python",
        "used_mib": 4096.0,
        "unit": "n.service",
        "service": False,
    }
    t.ports.gpu_procs = lambda unit: {0: [held]}
    assert t.apply().outcome is Outcome.APPLIED
    got = gpu_at_start.load(t.state.unit_dir("sglang.service"), host.systemd.invocation)
    assert got is not None and got.mib(0, 4242, "python") == 4096.0
