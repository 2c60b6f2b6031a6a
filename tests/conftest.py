"""Shared pytest fixtures and options."""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.testhost import TestHost, TestHostUnavailable, ensure_rootfs, missing_prerequisites

# The same examples on every run: CI must not pass or fail by the luck of a draw. A person exploring
# locally can run with HYPOTHESIS_PROFILE=explore for fresh random examples. Nor by the machine's load:
# no deadline and no health check that times the draws (a loaded 2-core CI machine is slow at both).
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _own_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The backup names deployctl remembers for completion (agent/orchestrate/backup_names.py) go to the
    run's own folder, never to the person's ~/.local/state."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-state"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", default=False, help="rewrite golden files from the output"
    )


def _boot_or_skip() -> TestHost:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    try:
        ensure_rootfs()
    except TestHostUnavailable as exc:
        pytest.skip(f"test host unavailable: {exc}")
    host = TestHost.create()
    atexit.register(host.stop)  # also when the run is interrupted between fixture set-up and teardown
    return host


def _teardown(host: TestHost) -> None:
    host.stop()
    atexit.unregister(host.stop)


@pytest.fixture(scope="session")
def testhost() -> Iterator[TestHost]:
    """One real systemd host shared by the whole run; tests must leave it as they found it."""
    host = _boot_or_skip()
    try:
        yield host
    finally:
        _teardown(host)


@pytest.fixture
def fresh_testhost() -> Iterator[TestHost]:
    """A host of its own for a test that breaks things."""
    host = _boot_or_skip()
    try:
        yield host
    finally:
        _teardown(host)
