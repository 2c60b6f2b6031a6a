"""The simulated weight-cache daemon and an engine in client mode, as real processes: the engine maps the
daemon's weights when the fingerprint matches, loads from disk when it does not, waits for a daemon that is
not there, and the refusals come before any load (tests/sim/sglang/weightcache.py, from SGLang's wheel)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_sim_process import SEED_FLAGS, SIM, Sim

pytestmark = pytest.mark.integration

# The seed's flags without its DFLASH draft: the weight cache refuses speculative decoding.
FLAGS = [f for f in SEED_FLAGS if "DFLASH" not in f and "speculative" not in f and "DFlash" not in f]
CLIENT = [*FLAGS, "--weight-cache-mode", "client", "--weight-cache-timeout", "20"]


@pytest.fixture
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE", f"{tmp_path}/{{device_uuid}}.sock")
    monkeypatch.setenv("SGLANG_WEIGHT_CACHE_READY_TEMPLATE", f"{tmp_path}/{{device_uuid}}.ready")
    yield tmp_path


def daemon(*extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(SIM), "SGLANG_SIM_LOAD_SECONDS": "0.2"}
    argv = [sys.executable, "-m", "sglang.srt.weight_cache.daemon", "--model-path", "/models/Kimi-K2.6",
            "--tp-size", "8", *extra]  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def ready(folder: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("*.ready"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(folder.glob("*.ready"))) == 8


def engine(flags: list[str]) -> Sim:
    return Sim(flags)


def test_a_client_maps_the_daemons_weights_and_a_resize_keeps_them(cache_env: Path) -> None:
    d = daemon()
    sims: list[Sim] = []
    try:
        ready(cache_env)
        for fraction in ("0.94", "0.90"):  # a re-size: the same fingerprint
            flags = [*CLIENT]
            flags[flags.index("--mem-fraction-static") + 1] = fraction
            sims.append(engine(flags))
            sims[-1].wait_line("Loaded model via IPC (mode=client)")
            sims[-1].wait_line("KV Cache is allocated")
            sims[-1].stop()
        assert d.poll() is None  # the daemon outlives both engines
    finally:
        for s in sims:
            s.stop()
        d.send_signal(signal.SIGTERM)
        d.wait(10)
    assert not list(cache_env.glob("*.ready"))  # a stopped daemon takes its ready files


def test_another_fingerprint_falls_back_to_disk(cache_env: Path) -> None:
    d = daemon()
    sim = None
    try:
        ready(cache_env)
        sim = engine([*CLIENT, "--dtype", "float16"])
        sim.wait_line("CacheConfig mismatch; falling back to disk loading")
        sim.wait_line("KV Cache is allocated")
    finally:
        if sim:
            sim.stop()
        d.kill()
        d.wait(10)


def test_no_daemon_is_waited_for_then_fails(cache_env: Path) -> None:
    flags = [*CLIENT]
    flags[flags.index("--weight-cache-timeout") + 1] = "1"
    sim = engine(flags)
    try:
        sim.wait_line("weight cache daemon not ready within 1 s")
    finally:
        sim.stop()


def test_speculative_decoding_and_an_unshared_quantization_are_refused(cache_env: Path) -> None:
    sim = engine([*SEED_FLAGS, "--weight-cache-mode", "client"])
    assert sim.wait_exit() == 1
    assert any("not supported together with speculative decoding" in line for line in sim.lines)
    d = daemon("--quantization", "awq")
    out, _ = d.communicate(timeout=120)
    assert d.returncode == 1 and b"UnsupportedQuantForIPCError" in out
