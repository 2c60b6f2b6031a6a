"""The simulated SGLang server as a real process on loopback: logs, HTTP, SIGTERM and its faults."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

SIM = Path(__file__).resolve().parents[1] / "sim"
SEED_FLAGS = [
    "--model-path", "/models/Kimi-K2.6", "--served-model-name", "kimi-k2.6", "--tp-size", "8",
    "--context-length", "200000", "--mem-fraction-static", "0.94", "--max-running-requests", "8",
    "--chunked-prefill-size", "8192", "--trust-remote-code", "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", "/models/Kimi-K2.6-DFlash",
]  # fmt: skip
NEEDLE = "The quick brown fox jumps over the lazy dog. " * 6000 + "In one word, what animal is mentioned?"
POOL = re.compile(
    r"^\[[\d: -]+ TP0\] KV Cache is allocated\. dtype: (\S+), #tokens: (\d+), KV size: ([\d.]+) GB$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sim:
    """One simulated server process whose merged output is collected line by line."""

    def __init__(self, flags: list[str], port: int | None = None, **knobs: str) -> None:
        self.port = port or free_port()
        env = {**os.environ, "PYTHONPATH": str(SIM), "SGLANG_SIM_LOAD_SECONDS": "0.2"}
        env |= {"SGLANG_SIM_STEP_SECONDS": "0.05", "SGLANG_SIM_WARMUP_SECONDS": "1.0"}
        env |= {f"SGLANG_SIM_{k.upper()}": v for k, v in knobs.items()}
        argv = [sys.executable, "-m", "sglang.launch_server", *flags, "--port", str(self.port)]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.raw: list[bytes] = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in self.proc.stdout:
            self.raw.append(chunk)

    @property
    def lines(self) -> list[str]:
        return b"".join(self.raw).decode(errors="replace").split("\n")

    # Generous bounds: a start on a loaded 2-core machine can take many seconds to print its first line;
    # a process that exits ends the wait at once, so only a hung one costs the whole bound.
    def wait_line(self, needle: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if needle in line]
            if found:
                return found[0]
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no line with {needle!r}; last lines: {self.lines[-8:]}")

    def wait_exit(self, timeout: float = 120.0) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(5)
        return code

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def chat(self, content: str) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"model": "kimi-k2.6", "messages": [{"role": "user", "content": content}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", body)
        request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def start(sims: list[Sim], flags: list[str] = SEED_FLAGS, port: int | None = None, **knobs: str) -> Sim:
    sim = Sim(flags, port, **knobs)
    sims.append(sim)
    return sim


def health_until_ready(sim: Sim, timeout: float = 15.0) -> list[int]:
    """Every /health status seen from the bind until the first 200."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and seen[-1:] != [200]:
        with contextlib.suppress(OSError):  # not bound yet
            seen.append(sim.get("/health")[0])
        time.sleep(0.05)
    return seen


def test_seed_start_logs_the_pool_then_serves_and_stops_on_sigterm(sims: list[Sim]) -> None:
    sim = start(sims)
    match = POOL.match(sim.wait_line("TP0] KV Cache is allocated"))
    assert match is not None
    assert match.group(1) == "torch.bfloat16"
    assert abs(int(match.group(2)) - 218_484) <= 3
    sched = sim.wait_line("max_total_num_tokens=")
    assert "context_len=200000" in sched and "max_running_requests=8" in sched
    left = float(re.findall(r"available_gpu_mem=([\d.]+) GB", sched)[0])
    assert 3.9 <= left <= 4.5

    statuses = health_until_ready(sim)
    assert statuses[0] == 503 and statuses[-1] == 200
    sim.wait_line("The server is fired up and ready to roll!")

    info = json.loads(sim.get("/server_info")[1])
    assert info["max_total_num_tokens"] == int(match.group(2))
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert (info["context_length"], info["max_running_requests"], info["mem_fraction_static"]) == (
        200000,
        8,
        0.94,
    )
    models = json.loads(sim.get("/v1/models")[1])
    assert (models["data"][0]["id"], models["data"][0]["max_model_len"]) == ("kimi-k2.6", 200000)

    code, reply = sim.chat(NEEDLE)
    assert code == 200
    assert reply["choices"][0]["message"]["content"] == "Dog"
    assert reply["usage"]["prompt_tokens"] == 60_010
    assert reply["usage"]["total_tokens"] == 60_010 + reply["usage"]["completion_tokens"]

    code, error = sim.chat(NEEDLE * 4)
    assert code == 400
    assert "is longer than the model's context length (200000 tokens)" in error["message"]
    sim.wait_line('"POST /v1/chat/completions HTTP/1.1" 400 Bad Request')  # logged just after the reply

    sim.proc.send_signal(signal.SIGTERM)
    began = time.monotonic()
    assert sim.wait_exit(5) == 0
    assert time.monotonic() - began < 2
    assert any("Application shutdown complete." in line for line in sim.lines)


def test_prompt_longer_than_the_pool_is_refused_with_sglangs_message(sims: list[Sim]) -> None:
    flags = [*SEED_FLAGS]
    flags[flags.index("0.94")] = "0.85"  # pool 101,134 < context 200,000
    sim = start(sims, flags)
    health_until_ready(sim)
    assert "fewer than --context-length 200000" in sim.wait_line("KV pool holds")
    code, error = sim.chat(NEEDLE * 2)
    assert code == 400
    assert error["message"].startswith(
        "Input length (120019 tokens) exceeds the maximum allowed length (101128"
    )


def test_oom_during_graph_capture_dies_by_sigkill(sims: list[Sim]) -> None:
    sim = start(sims, fault="oom_graph")
    assert sim.wait_exit() == -signal.SIGKILL
    text = "\n".join(sim.lines)
    assert "Scheduler hit an exception: Traceback (most recent call last):" in text
    assert "torch.OutOfMemoryError: CUDA out of memory." in text
    assert "Exception: Capture cuda graph failed:" in text
    assert sim.lines[-2].endswith("Received sigquit from a child process. It usually means the child failed.")
    assert "max_total_num_tokens=" not in text


def test_fraction_too_low_fails_as_0_5_23_does(sims: list[Sim]) -> None:
    flags = [*SEED_FLAGS]
    flags[flags.index("0.94")] = "0.70"
    sim = start(sims, flags)
    assert sim.wait_exit() == -signal.SIGKILL
    error = sim.wait_line("ValueError: Loaded weights leave no GPU memory")
    assert "--mem-fraction-static=0.7. Raise --mem-fraction-static above 0.772" in error


def test_hang_before_pool_loads_weights_and_never_logs_a_pool(sims: list[Sim]) -> None:
    sim = start(sims, fault="hang_before_pool")
    sim.wait_line("type=DFlash2DraftModel")
    time.sleep(3)
    assert sim.proc.poll() is None
    assert not any("KV Cache is allocated" in line for line in sim.lines)
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit(3) == 0


def test_taken_port_is_uvicorns_errno_98_and_exit_1(sims: list[Sim]) -> None:
    sim = start(sims, fault="port_taken")
    assert sim.wait_exit() == 1
    assert "address already in use" in sim.wait_line("ERROR:    [Errno 98] error while attempting to bind")


def test_really_taken_port_fails_after_the_pool(sims: list[Sim]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        sim = start(sims, port=port)
        assert sim.wait_exit() == 1
    assert any("KV Cache is allocated" in line for line in sim.lines)
    assert any(f"('127.0.0.1', {port}): address already in use" in line for line in sim.lines)


def test_context_above_the_model_is_refused(sims: list[Sim]) -> None:
    flags = [*SEED_FLAGS]
    flags[flags.index("200000")] = "300000"
    sim = start(sims, flags)
    assert sim.wait_exit() == 1
    line = sim.wait_line("ValueError: Warning: User-specified context_length (300000)")
    assert "derived context_length (262144)" in line
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in line


def test_die_after_ready_sends_sigquit_and_dies(sims: list[Sim]) -> None:
    sim = start(sims, fault="die_after_ready", die_after_s="0.3")
    sim.wait_line("The server is fired up and ready to roll!")
    assert sim.wait_exit() == -signal.SIGKILL
    assert any("SIGQUIT received. signum=None, frame=None." in line for line in sim.lines)


def test_garbage_output_still_carries_the_pool(sims: list[Sim]) -> None:
    sim = start(sims, fault="garbage")
    sim.wait_line("The server is fired up and ready to roll!")
    assert b"\xff\xfe" in b"".join(sim.raw)
    assert max(len(line) for line in sim.lines) > 60_000
    assert [m.group(2) for line in sim.lines if (m := POOL.match(line))] == ["218484"]


def test_unknown_flag_is_an_argparse_error(sims: list[Sim]) -> None:
    sim = start(sims, [*SEED_FLAGS, "--no-such-flag"])
    assert sim.wait_exit() == 2
    assert "sglang serve: error: unrecognized arguments: --no-such-flag" in "\n".join(sim.lines)
