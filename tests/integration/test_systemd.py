"""The D-Bus port against the real systemd of the test host."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agent.host.systemd import Systemd, SystemdError
from tests.integration.testunits import CHATTY, installed, unit_text
from tests.testhost import TestHost

pytestmark = pytest.mark.integration


@pytest.fixture
def systemd(testhost: TestHost) -> Iterator[Systemd]:
    with Systemd(testhost.bus_address) as bus:
        yield bus


def test_restart_returns_done_and_a_new_invocation(testhost: TestHost, systemd: Systemd) -> None:
    with installed(testhost, systemd, "dctl-restart.service", CHATTY) as unit:
        assert systemd.start(unit, timeout=10).result == "done"
        before = systemd.unit_state(unit)
        job = systemd.restart(unit, timeout=10)
        after = systemd.unit_state(unit)
    assert job.ok and job.result == "done" and job.job.startswith("/org/freedesktop/systemd1/job/")
    assert (before.active_state, after.active_state, after.sub_state) == ("active", "active", "running")
    assert len(after.invocation_id) == 32 and after.invocation_id != before.invocation_id
    assert after.active_enter_timestamp_us > before.active_enter_timestamp_us
    assert after.fragment_path == "/etc/systemd/system/dctl-restart.service"


def test_failing_unit_is_seen_failed_quickly(testhost: TestHost, systemd: Systemd) -> None:
    with installed(testhost, systemd, "dctl-fail.service", "/bin/sh -c 'echo boom; exit 1'") as unit:
        started = time.monotonic()
        systemd.start(unit, timeout=10)  # Type=simple: the job is done once the process is forked
        state = systemd.unit_state(unit)
        while state.active_state != "failed" and time.monotonic() - started < 5:
            systemd.wait_for_change(unit, timeout=1.0)
            state = systemd.unit_state(unit)
        elapsed = time.monotonic() - started
    assert (state.active_state, state.exec_main_status) == ("failed", 1)
    assert state.exec_main_code == 1  # CLD_EXITED: it exited, it was not killed
    assert elapsed < 1.0


def test_need_daemon_reload_after_edit_is_cleared_by_reload(testhost: TestHost, systemd: Systemd) -> None:
    with installed(testhost, systemd, "dctl-edit.service", CHATTY) as unit:
        # Running, so systemd keeps it loaded (an idle unit is unloaded and re-read from disk anyway).
        systemd.start(unit, timeout=10)
        assert not systemd.unit_state(unit).need_daemon_reload
        testhost.put(f"/etc/systemd/system/{unit}", unit_text("/bin/sleep 1000"))
        assert systemd.unit_state(unit).need_daemon_reload
        systemd.daemon_reload()
        assert not systemd.unit_state(unit).need_daemon_reload


def test_restart_counts_and_reset_failed(testhost: TestHost, systemd: Systemd) -> None:
    exec_start = "/bin/sh -c 'exit 3'"
    testhost.put("/etc/systemd/system/dctl-loop.service", unit_text(exec_start) + b"Restart=always\n")
    systemd.daemon_reload()
    try:
        systemd.start("dctl-loop.service", timeout=10)
        deadline = time.monotonic() + 5
        while systemd.unit_state("dctl-loop.service").n_restarts < 2 and time.monotonic() < deadline:
            systemd.wait_for_change("dctl-loop.service", timeout=0.5)
        assert systemd.unit_state("dctl-loop.service").n_restarts >= 2
    finally:
        systemd.stop("dctl-loop.service", timeout=10)
        systemd.reset_failed("dctl-loop.service")
        (testhost.root / "etc/systemd/system/dctl-loop.service").unlink()
        systemd.daemon_reload()
    assert systemd.unit_state("dctl-loop.service").load_state == "not-found"


def test_unknown_unit_is_not_found_and_cannot_restart(systemd: Systemd) -> None:
    assert systemd.unit_state("dctl-nope.service").load_state == "not-found"
    with pytest.raises(SystemdError, match=r"dctl-nope\.service"):
        systemd.restart("dctl-nope.service", timeout=5)


def test_unreachable_bus_is_a_systemd_error(tmp_path: object) -> None:
    with pytest.raises(SystemdError, match="cannot connect"):
        Systemd(f"unix:path={tmp_path}/no-such-socket")
