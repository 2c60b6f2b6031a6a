"""Restarts that lose no request: a request in flight during `deployctl apply`, on the simulated server.

The simulated SGLang drains on SIGTERM as 0.5.23 does (503 on /health, a line every few seconds, exit when
nothing is left) and has a scheduler child without a SIGTERM handler, so the unit's KillMode decides.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agent.exitcodes import ExitCode
from agent.sglang.flags import parse_unit_flags
from tests import simhost
from tests.integration.conftest import boot_sim, cli, invocation, wait_pool

pytestmark = pytest.mark.integration

DECODE_S = 0.1  # seconds per generated token: a request's length is max_tokens x this
PROM = "/var/lib/prometheus/node-exporter/deployctl_sglang.service.prom"


@pytest.fixture
def slow_sim() -> Iterator[simhost.SimHost]:
    host = boot_sim(
        {"SGLANG_SIM_DECODE_SECONDS_PER_TOKEN": str(DECODE_S), "SGLANG_SIM_DRAIN_CHECK_SECONDS": "1"}
    )
    try:
        yield host
    finally:
        host.stop()


@dataclass
class InFlight:
    """One chat request sent from a thread: its HTTP status, or the error that ended it."""

    status: int | None = None
    error: str | None = None
    seconds: float = 0.0


def port_of(sim: simhost.SimHost) -> int:
    return int(parse_unit_flags(sim.unit_text())["port"])


def loads(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/loads", timeout=5) as r:
        return sum(d["num_running_reqs"] + d["num_waiting_reqs"] for d in json.load(r)["loads"])


def send(port: int, seconds: float) -> tuple[InFlight, threading.Thread]:
    """A request that generates for `seconds`; returns once the server counts it as running."""
    body = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": int(seconds / DECODE_S)}  # fmt: skip
    result = InFlight()

    def run() -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode()
        )
        req.add_header("content-type", "application/json")
        start = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=seconds + 300) as r:
                r.read()
                result.status = r.status
        except urllib.error.HTTPError as exc:
            result.status = exc.code
        except OSError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.seconds = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while loads(port) < 1:
        assert time.monotonic() < deadline, "the request never showed in /v1/loads"
        time.sleep(0.1)
    return result, thread


def set_drain(sim: simhost.SimHost, table: str) -> None:
    path = sim.units_dir / f"{sim.name}.toml"
    path.write_text(path.read_text() + "\n[drain]\n" + table)


def prom(sim: simhost.SimHost, name: str) -> dict[str, float]:
    text = sim.host.read(PROM).decode()
    found = re.findall(rf'^{name}{{[^}}]*?(?:state="(\w+)")?}} (\S+)$', text, re.M)
    return {state or "": float(value) for state, value in found}


def test_a_request_in_flight_during_apply_finishes_before_the_restart(slow_sim):
    sim, port = slow_sim, port_of(slow_sim)
    wait_pool(sim)
    before = invocation(sim)
    request, thread = send(port, 45.0)  # longer than the apply takes to reach its drain, generously
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes", timeout=600)
    thread.join(timeout=60)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert invocation(sim) != before
    assert (request.status, request.error) == (200, None)
    assert "drain:                 1 in flight, 1 finished, 0 cut" in r.stdout, r.stderr
    assert prom(sim, "deployctl_drain_requests") == {"in_flight": 1, "finished": 1, "cut": 0}
    assert prom(sim, "deployctl_drain_seconds")[""] >= 5.0


def test_a_request_longer_than_the_drain_timeout_is_cut_and_said_so(slow_sim):
    sim, port = slow_sim, port_of(slow_sim)
    wait_pool(sim)
    # TimeoutStopSec = 2 + 10: deployctl waits 2 s, SGLang's own drain gets 10 s more, then SIGKILL.
    set_drain(sim, "timeout_s = 2\nstop_allowance_s = 10\n")
    request, thread = send(port, 60.0)
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes", timeout=600)
    thread.join(timeout=60)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert "TimeoutStopSec=12" in sim.unit_text()
    assert request.status is None and request.error is not None and request.seconds < 40
    assert re.search(r"drain: +1 in flight, 0 finished, 1 cut, .*the wait timed out after 2 s", r.stdout), (
        r.stdout
    )
    assert prom(sim, "deployctl_drain_requests") == {"in_flight": 1, "finished": 0, "cut": 1}


def test_sglang_own_drain_finishes_what_the_wait_left_under_killmode_mixed(slow_sim):
    sim, port = slow_sim, port_of(slow_sim)
    wait_pool(sim)
    set_drain(sim, "timeout_s = 2\n")  # TimeoutStopSec = 122: the request outlives the wait, not the stop
    # 60 s: still running when a loaded machine's apply reaches its drain (CLI, facts and plan took up to
    # 30 s there), and well short of the stop's 122 s.
    request, thread = send(port, 60.0)
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes", timeout=600)
    thread.join(timeout=180)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert (request.status, request.error) == (200, None)
    assert re.search(r"drain: +1 in flight, 1 finished, 0 cut, .*the wait timed out after 2 s", r.stdout), (
        r.stdout
    )
    journal = sim.host.ssh(["journalctl", "-u", "sglang.service", "--no-pager", "-o", "cat"]).stdout.decode()
    assert "Gracefully exiting... Remaining number of requests 1." in journal
    assert "Gracefully exiting... Remaining number of requests 0." in journal
