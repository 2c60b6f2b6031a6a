"""The simulated SGLang server on two nodes (--nnodes 2) as processes on loopback: the rendezvous at
--dist-init-addr, node 0 alone serving, node 1's placeholder HTTP server, and how each node ends."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.integration.test_sim_process import SEED_FLAGS, Sim
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration

WAIT = 40.0  # a loaded 2-core machine starts two servers at once


def node(sims: list[Sim], rank: int, dist: int, port: int, **knobs: str) -> Sim:
    flags = [*SEED_FLAGS, "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{dist}"]
    sim = Sim(flags, port, **knobs)
    sim.dist = dist  # type: ignore[attr-defined]
    sims.append(sim)
    return sim


def pair(
    sims: list[Sim], knobs0: dict[str, str] | None = None, knobs1: dict[str, str] | None = None
) -> tuple[Sim, Sim]:
    """Node 0 and node 1 of one server, rendezvousing at 127.0.0.1:DIST (the port is the Sims' `dist`)."""
    dist, port0, port1 = free_ports(3)
    return node(sims, 0, dist, port0, **(knobs0 or {})), node(sims, 1, dist, port1, **(knobs1 or {}))


def ready(first: Sim, second: Sim) -> None:
    """Node 0 fired up (so node 1 reached the same point) and node 1's placeholder is bound."""
    first.wait_line("The server is fired up and ready to roll!", WAIT)
    second.wait_line("Dummy health check server started", WAIT)


def text(sim: Sim) -> str:
    return "\n".join(sim.lines)


def test_two_nodes_start_node_0_serves_and_node_1_answers_health_only(sims: list[Sim]) -> None:
    first, second = pair(sims)
    ready(first, second)
    assert "max_total_num_tokens=218484" in first.wait_line("TP0] max_total_num_tokens=")
    assert "#tokens: 218484," in second.wait_line("TP4] KV Cache is allocated")
    assert "#tokens: 218484," in first.wait_line("TP0] KV Cache is allocated")
    for needle in ("max_total_num_tokens=", "fired up", "Uvicorn running", "TP0]", "Loading safetensors"):
        assert needle not in text(second)
    assert [second.get(p)[0] for p in ("/health", "/health_generate", "/ping", "/v1/models")] == [
        200,
        200,
        200,
        404,
    ]
    assert "GET /health" not in text(second)  # uvicorn at log_level=warning: no access log

    code, reply = first.chat("What is the capital of France?")
    assert (code, reply["choices"][0]["message"]["content"]) == (200, "Paris.")

    first.proc.send_signal(signal.SIGTERM)  # a graceful stop broadcasts ShutdownReq: node 1 ends too
    assert first.wait_exit(WAIT) == 0
    assert second.wait_exit(WAIT) == 0
    assert "Connection closed by peer" not in text(second)


def test_node_1_dies_with_gloos_error_when_node_0_is_killed(sims: list[Sim]) -> None:
    first, second = pair(sims)
    ready(first, second)
    first.proc.kill()
    assert second.wait_exit(WAIT) != 0
    line = second.wait_line("Connection closed by peer")
    assert line.startswith(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed"
    )
    assert line.endswith(f"Connection closed by peer [127.0.0.1]:{second.dist}")  # type: ignore[attr-defined]


def test_sigterm_on_node_1_waits_until_node_0_stops(sims: list[Sim]) -> None:
    first, second = pair(sims)
    ready(first, second)
    second.proc.send_signal(signal.SIGTERM)
    second.wait_line("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast", WAIT)
    with pytest.raises(subprocess.TimeoutExpired):
        second.proc.wait(2)
    assert second.get("/health")[0] == 200
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait_exit(WAIT) == 0
    assert second.wait_exit(WAIT) == 0
    assert "Connection closed by peer" not in text(second)


def test_node_1_in_its_sigterm_wait_ends_quietly_when_node_0_dies(sims: list[Sim]) -> None:
    first, second = pair(sims)
    ready(first, second)
    second.proc.send_signal(signal.SIGTERM)
    second.wait_line("SIGTERM received on node_rank 1", WAIT)
    first.proc.kill()
    assert second.wait_exit(WAIT) == 0
    assert "Connection closed by peer" not in text(second)


def test_node_0_alone_times_out_the_rendezvous(sims: list[Sim]) -> None:
    dist, port = free_ports(2)
    began = time.monotonic()
    first = node(sims, 0, dist, port, rendezvous_timeout_s="2")
    assert first.wait_exit(WAIT) == -signal.SIGKILL
    assert time.monotonic() - began >= 2
    error = first.wait_line("torch.distributed.DistStoreError")
    # torch counts the store's clients, one per rank: node 0's four of tp 8
    assert error.endswith(
        "DistStoreError: Timed out after 2 seconds waiting for clients. 4/8 clients joined."
    )
    assert "Scheduler hit an exception" in text(first)
    assert "Load weight begin" not in text(first)


def test_node_1_alone_times_out_connecting(sims: list[Sim]) -> None:
    dist, port = free_ports(2)
    second = node(sims, 1, dist, port, rendezvous_timeout_s="1")
    assert second.wait_exit(WAIT) == -signal.SIGKILL
    error = second.wait_line("torch.distributed.DistNetworkError")
    assert f"timed out after 1000ms while trying to connect to (127.0.0.1, {dist})" in error


def test_a_node_1_started_again_finds_no_rendezvous_once_the_group_formed(sims: list[Sim]) -> None:
    first, second = pair(sims)
    ready(first, second)
    late = node(sims, 1, second.dist, free_ports(1)[0], rendezvous_timeout_s="1")  # type: ignore[attr-defined]
    assert late.wait_exit(WAIT) == -signal.SIGKILL
    assert "torch.distributed.DistNetworkError: The client socket has timed out" in text(late)
    assert first.get("/health")[0] == 200 and second.proc.poll() is None


def test_node_1_dying_later_leaves_node_0_healthy_but_unable_to_serve(sims: list[Sim]) -> None:
    first, second = pair(sims, {"peer_timeout_s": "1"}, {"die_after_s": "0.5"})
    ready(first, second)
    assert second.wait_exit(WAIT) == -signal.SIGKILL
    assert "CUDA error: an illegal memory access was encountered" in text(second)
    assert "Received sigquit from a child process" in text(second)  # no tokenizer manager on node 1
    assert first.get("/health")[0] == 200  # no heartbeat between nodes (SGLang #3099, #4780)
    began = time.monotonic()
    code, reply = first.chat("What is the capital of France?")
    assert code == 500 and "Watchdog caught collective operation timeout" in reply["message"]
    assert time.monotonic() - began >= 1
    assert "ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught" in first.wait_line("Watchdog caught")
    assert first.proc.poll() is None


def test_a_start_failure_on_node_1_only_takes_node_0_down_with_gloos_error(sims: list[Sim]) -> None:
    first, second = pair(sims, knobs1={"fault": "crash_loading"})
    assert second.wait_exit(WAIT) == -signal.SIGKILL
    assert "SafetensorError" in text(second)
    assert first.wait_exit(WAIT) == -signal.SIGKILL
    assert "Connection closed by peer [127.0.0.1]:" in first.wait_line("RuntimeError: [../third_party/gloo")
    assert "KV Cache is allocated" not in text(first)
