"""The weight-cache daemon's unit and the engine's, run by real systemd (the test host's Debian 12, systemd
252): an engine restart leaves the daemon running, a daemon restart restarts the engine after it, a daemon
stop stops the engine, a daemon killed with SIGKILL comes back and the engine after it, serving again, and
both see the socket/ready folder the daemon's RuntimeDirectory= creates."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.inventory import load_host
from agent.plan.weight_cache_unit import DAEMON_MODULE, daemon_unit_name, render_daemon_unit
from agent.render import gpu_environment, render_unit, template_dir
from agent.sglang.flags import parse_unit_flags
from tests.testhost import TestHost

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENGINE = "dctl-wc.service"
DAEMON = daemon_unit_name(ENGINE)
SLEEPER = "/usr/local/bin/dctl-wc-sleep.py"
PORT = 30917  # the stand-in engine's HTTP port inside the test host
# Stands in for both processes: prints the ready template it was given; the engine (given --port) answers
# HTTP there, the daemon sleeps.
SLEEP = (
    "import os, sys, time, http.server\n"
    "print(os.environ.get('SGLANG_WEIGHT_CACHE_READY_TEMPLATE'), flush=True)\n"
    "if '--port' in sys.argv:\n"
    "    port = int(sys.argv[sys.argv.index('--port') + 1])\n"
    "    http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    "time.sleep(3600)\n"
)


def _units() -> tuple[str, str]:
    host = load_host("ct200", REPO / "units")
    host = host.model_copy(
        update={
            "draft": None,
            "unit": host.unit.model_copy(update={"user": None, "name": ENGINE, "secret_environment": []}),
            "sglang": host.sglang.model_copy(
                update={"executable": ["/usr/bin/python3", SLEEPER], "port": PORT}
            ),
            "weight_cache": host.weight_cache.model_copy(update={"enabled": True}),
        }
    )
    engine = render_unit(host, {}, template_dir())
    daemon = render_daemon_unit(host, parse_unit_flags(engine), gpu_environment(host))
    return engine, daemon.replace(f"-m {DAEMON_MODULE}", SLEEPER)


def _main_pid(host: TestHost, unit: str) -> str:
    shown = host.ssh(["systemctl", "show", "-p", "MainPID", "--value", unit])
    return shown.stdout.decode().strip()


def _active(host: TestHost, unit: str) -> str:
    return host.ssh(["systemctl", "is-active", unit]).stdout.decode().strip()


def _settle(host: TestHost, unit: str, want: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while _active(host, unit) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    said = host.ssh(["sh", "-c", f"systemctl status {ENGINE} {DAEMON}; journalctl -n 30 --no-pager"])
    assert _active(host, unit) == want, f"{unit}: {_active(host, unit)}\n{said.stdout.decode()[-3000:]}"


def test_an_engine_restart_leaves_the_daemon_and_a_daemon_restart_takes_the_engine(
    testhost: TestHost,
) -> None:
    _install(testhost)
    try:
        started = testhost.ssh(["sh", "-c", f"systemctl daemon-reload && systemctl start {ENGINE}"])
        assert started.returncode == 0, started.stderr.decode()
        _settle(testhost, ENGINE, "active")
        assert _active(testhost, DAEMON) == "active"  # Requires= pulled it in, After= ordered it first
        assert (testhost.root / "run" / DAEMON.removesuffix(".service")).is_dir()  # RuntimeDirectory=
        daemon_pid, engine_pid = _main_pid(testhost, DAEMON), _main_pid(testhost, ENGINE)

        testhost.ssh(["systemctl", "restart", ENGINE])
        _settle(testhost, ENGINE, "active")
        assert _main_pid(testhost, DAEMON) == daemon_pid  # the weights stay resident
        assert _main_pid(testhost, ENGINE) != engine_pid

        engine_pid = _main_pid(testhost, ENGINE)
        testhost.ssh(["systemctl", "restart", DAEMON])  # a fingerprint change
        _settle(testhost, ENGINE, "active")
        assert _main_pid(testhost, DAEMON) != daemon_pid
        assert _main_pid(testhost, ENGINE) != engine_pid  # PartOf=: restarted with it

        testhost.ssh(["systemctl", "stop", DAEMON])
        _settle(testhost, ENGINE, "inactive")  # Requires=: no engine without its daemon
    finally:
        _remove(testhost)


def _install(host: TestHost) -> None:
    engine, daemon = _units()
    host.put(SLEEPER, SLEEP.encode(), 0o755)
    host.put(f"/etc/systemd/system/{ENGINE}", engine.encode())
    host.put(f"/etc/systemd/system/{DAEMON}", daemon.encode())


def _remove(host: TestHost) -> None:
    host.ssh(
        ["sh", "-c", f"systemctl stop {ENGINE} {DAEMON}; systemctl reset-failed {ENGINE} {DAEMON}; true"]
    )
    for unit in (ENGINE, DAEMON):
        (host.root / f"etc/systemd/system/{unit}").unlink(missing_ok=True)
    host.ssh(["systemctl", "daemon-reload"])


def _serves(host: TestHost) -> bool:
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{PORT}/', timeout=2)"
    return host.ssh(["python3", "-c", probe]).returncode == 0


def _entered(host: TestHost, unit: str) -> int:
    shown = host.ssh(["systemctl", "show", "-p", "ActiveEnterTimestampMonotonic", "--value", unit])
    return int(shown.stdout.decode().strip() or 0)


def test_a_daemon_killed_comes_back_and_the_engine_after_it_serving_again(testhost: TestHost) -> None:
    """Under BindsTo= (round 4) the daemon's crash stopped the engine as a dependency and nothing started it
    again; under Requires= the daemon's own Restart= restarts it and, a restart job, the engine after it."""
    _install(testhost)
    try:
        started = testhost.ssh(["sh", "-c", f"systemctl daemon-reload && systemctl start {ENGINE}"])
        assert started.returncode == 0, started.stderr.decode()
        _settle(testhost, ENGINE, "active")
        deadline = time.monotonic() + 30
        while not _serves(testhost) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _serves(testhost)
        daemon_pid, engine_pid = _main_pid(testhost, DAEMON), _main_pid(testhost, ENGINE)

        testhost.ssh(["kill", "-9", daemon_pid])
        deadline = time.monotonic() + 90  # the daemon's RestartSec=, then the engine's start
        while time.monotonic() < deadline and not (
            _main_pid(testhost, DAEMON) not in ("0", daemon_pid)
            and _main_pid(testhost, ENGINE) not in ("0", engine_pid)
            and _serves(testhost)
        ):
            time.sleep(0.5)
        _settle(testhost, DAEMON, "active")
        _settle(testhost, ENGINE, "active")
        assert _main_pid(testhost, DAEMON) != daemon_pid
        assert _main_pid(testhost, ENGINE) != engine_pid  # restarted: it maps the reloaded weights
        assert _entered(testhost, ENGINE) >= _entered(testhost, DAEMON)  # in order: the daemon first
        assert _serves(testhost)
    finally:
        _remove(testhost)
