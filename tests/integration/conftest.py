"""Fixtures for end-to-end tests: the simulated ct200 on a real systemd host, reached over real SSH."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent.sglang.flags import parse_unit_flags
from tests import realhost, simhost
from tests.testhost import TestHostUnavailable, missing_prerequisites

if TYPE_CHECKING:
    from tests.integration.test_sim_process import Sim

DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))


def boot_sim(sim_env: dict[str, str] | None = None) -> simhost.SimHost:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    try:
        sim = simhost.boot(sim_env)
    except TestHostUnavailable as exc:
        pytest.skip(f"test host unavailable: {exc}")
    wait_pool(sim)
    return sim


@pytest.fixture(scope="session")
def real() -> Iterator[realhost.RealHost]:
    """The real SGLang 0.5.23 on the test host's CPU, started once per session from its hand-written unit
    (a real start is 25-110 s here): every test that changes the unit leaves a healthy server behind, and
    one that needs the hand-written unit calls real.ensure_hand() (a restart only if something else runs).
    Its stand-ins trace to realhost.TRACE inside the host."""
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    try:
        host = realhost.boot(trace=True)
    except TestHostUnavailable as exc:
        pytest.skip(f"real SGLang unavailable: {exc}")
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture(scope="module")
def sim() -> Iterator[simhost.SimHost]:
    """One simulated ct200 per test module, booted at the seed's baseline and serving."""
    host = boot_sim()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def fresh_sim() -> Iterator[simhost.SimHost]:
    host = boot_sim()
    try:
        yield host
    finally:
        host.stop()


def cli(
    sim: simhost.SimHost, *args: str, timeout: float = 180, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real deployctl, as cron would run it: no terminal, the sim host's inventory and ssh config."""
    env = {**os.environ, **sim.env}
    return subprocess.run(
        [DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=timeout, input=input or ""
    )


def variant(sim: simhost.SimHost, name: str, text: str) -> simhost.SimHost:
    """The sim host seen through an inventory folder of its own holding units/<name>.toml: another view of
    the sim's unit (one setting changed). Two inventory files of one unit on one host are refused
    (docs/topologies.md), so the variant never shares the folder of the sim's own file."""
    units = sim.work / f"units-{name}"
    units.mkdir(exist_ok=True)
    (units / f"{name}.toml").write_text(text)
    return dataclasses.replace(sim, units_dir=units, env={**sim.env, "DEPLOYCTL_UNITS": str(units)})


def popen(sim: simhost.SimHost, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, **sim.env}
    return subprocess.Popen(
        [DEPLOYCTL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def server_info(sim: simhost.SimHost) -> dict[str, object]:
    port = parse_unit_flags(sim.unit_text())["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
        data: dict[str, object] = json.load(r)
        return data


def wait_pool(sim: simhost.SimHost, timeout: float = 60) -> int:
    """The pool of the running service, once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(str(server_info(sim)["max_total_num_tokens"]))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def invocation(sim: simhost.SimHost) -> str:
    out = sim.host.ssh(["systemctl", "show", "-p", "InvocationID", "--value", "sglang.service"])
    return out.stdout.decode().strip()


def events_with(sim: simhost.SimHost, stage: str) -> bool:
    """Whether any transaction on the host has logged an event of this stage."""
    root = sim.host.root / "var/lib/deployctl/txn"
    return any(f'"stage": "{stage}"' in p.read_text() for p in root.glob("*/events.jsonl"))


def wait_for(predicate: object, timeout: float = 60, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(interval)


@pytest.fixture
def sims() -> Iterator[list[Sim]]:
    """Simulated servers a test starts as processes (test_sim_process.Sim), stopped after it."""
    started: list[Sim] = []
    yield started
    for sim in started:
        sim.stop()
