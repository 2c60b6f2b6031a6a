"""A re-size restart's start with SGLang's weight-cache daemon holding the weights, against the same start
loading them, on the simulated server (processes on loopback; `python -m tests.bench.weight_cache` runs it
alone).

The seed's public phase timings (Qwen3-235B FP8 on 4 x H20, LMSYS blog: weights 306 s, CUDA graphs 34.9 s,
DeepGEMM warm-up 23.1 s, init 17.3 s) are scaled down 100 x into the simulator's knobs. Each start runs from
the process launch to SGLang's "fired up" line; the modes alternate; medians are compared. This is the
server's own start, not deployctl's downtime (apply with the daemon is not timed here).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.test_sim_process import SEED_FLAGS, SIM, Sim

SCALE = 100.0
KNOBS = {  # Sim(**knobs) sets them as SGLANG_SIM_<NAME>
    "load_seconds": f"{306.0 / SCALE:.2f}",
    "warmup_seconds": f"{(34.9 + 23.1) / SCALE:.2f}",
    "step_seconds": f"{17.3 / SCALE / 4:.3f}",  # init spread over the start's steps
}
FLAGS = [f for f in SEED_FLAGS if "DFLASH" not in f and "speculative" not in f and "DFlash" not in f]


def _start(flags: list[str]) -> float:
    t0 = time.monotonic()
    sim = Sim(flags, **KNOBS)
    try:
        sim.wait_line("fired up", timeout=120)
        return time.monotonic() - t0
    finally:
        sim.stop()


def measure(rounds: int, say: Callable[[str], None]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="deployctl-wc-") as tmp:
        saved = {k: os.environ.get(k) for k in ("SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE",
                                                 "SGLANG_WEIGHT_CACHE_READY_TEMPLATE")}  # fmt: skip
        os.environ["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] = f"{tmp}/{{device_uuid}}.sock"
        os.environ["SGLANG_WEIGHT_CACHE_READY_TEMPLATE"] = f"{tmp}/{{device_uuid}}.ready"
        daemon = _daemon(Path(tmp))
        try:
            return _rounds(rounds, say)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(10)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _daemon(folder: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "sglang.srt.weight_cache.daemon", "--model-path", "/models/Kimi-K2.6",
            "--tp-size", "8"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SIM), "SGLANG_SIM_LOAD_SECONDS": KNOBS["load_seconds"]}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list(folder.glob("*.ready"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def _rounds(rounds: int, say: Callable[[str], None]) -> dict[str, float]:
    client = [*FLAGS, "--weight-cache-mode", "client"]
    seen: dict[bool, list[float]] = {True: [], False: []}
    _start(FLAGS)  # not timed: the first start of the simulator compiles its modules
    for i in range(rounds):
        for cached in (True, False) if i % 2 == 0 else (False, True):
            seconds = _start(client if cached else FLAGS)
            seen[cached].append(seconds)
            say(f"  round {i + 1}: {'weight cache' if cached else 'loading':12} start {seconds:.2f} s")
    cached, loading = statistics.median(seen[True]), statistics.median(seen[False])
    return {
        "start_weight_cache_s_median": round(cached, 3),
        "start_loading_s_median": round(loading, 3),
        "downtime_weight_cache_ratio": round(cached / loading, 3),
    }


if __name__ == "__main__":
    print(measure(int(os.environ.get("ROUNDS", "3")), lambda text: print(text, flush=True)))
