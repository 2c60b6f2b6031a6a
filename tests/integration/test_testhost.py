"""The test host itself: strict-host-key ssh, a disk that survives restart, clean removal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.testhost import HostSetup, TestHost, missing_prerequisites
from tests.testhost.instance import INSTANCES, REPO, orphans

pytestmark = pytest.mark.integration


def test_ssh_with_known_host_key_and_bus_socket(testhost: TestHost) -> None:
    done = testhost.ssh(["sh", "-c", "echo $0; systemctl is-system-running", "a b;c"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("\n")[:2] == ["a b;c", "running"]
    assert Path(testhost.bus_address.removeprefix("unix:path=")).is_socket()
    scanned = subprocess.run(
        ["ssh-keygen", "-lf", str(testhost.known_hosts_path)], capture_output=True, text=True, check=True
    )
    assert testhost.host_key_fingerprint in scanned.stdout


def test_restart_keeps_etc_and_stop_removes_everything(fresh_testhost: TestHost) -> None:
    fresh_testhost.put("/etc/dctl-marker", b"kept\n", 0o600)
    before = fresh_testhost.ssh(["cat", "/proc/sys/kernel/random/boot_id"]).stdout
    fresh_testhost.restart()
    after = fresh_testhost.ssh(["cat", "/proc/sys/kernel/random/boot_id", "/etc/dctl-marker"]).stdout
    assert after.endswith(b"kept\n") and not after.startswith(before)
    fresh_testhost.stop()
    assert not fresh_testhost.dir.exists()
    assert not Path(f"/run/systemd/nspawn/propagate/{fresh_testhost.name}").exists()


@pytest.mark.skipif(bool(missing_prerequisites()), reason="test host unavailable: missing prerequisites")
def test_files_and_enabled_units_are_in_place_at_boot() -> None:
    unit = b"[Service]\nExecStart=/bin/sleep 1000\n[Install]\nWantedBy=multi-user.target\n"
    files = {"/etc/systemd/system/dctl-boot.service": (unit, 0o644)}
    with TestHost.create(HostSetup(files, ["dctl-boot.service"])) as host:
        state = host.ssh(["systemctl", "is-active", "dctl-boot.service"]).stdout.decode().strip()
    assert state == "active"


@pytest.mark.skipif(bool(missing_prerequisites()), reason="test host unavailable: missing prerequisites")
def test_instance_of_a_killed_run_is_listed_as_orphan() -> None:
    # Exits without stopping its host, as a test run killed mid-way would.
    code = "import os, tests.testhost as t\nprint(t.TestHost.create().name, flush=True)\nos._exit(9)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    name = done.stdout.strip()
    try:
        assert name and name in orphans()
    finally:
        if name:
            TestHost.attach(name).stop()
    assert not (INSTANCES / name).exists()
