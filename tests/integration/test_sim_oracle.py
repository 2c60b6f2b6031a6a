"""The simulated server's logged pool is SGLang 0.5.23's own answer (tests/oracle) for the same start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.test_sim_process import SEED_FLAGS, Sim
from tests.oracle import GpuFigures, OracleUnavailable, load_model, result_from_answer, size, size_many
from tests.oracle.cases import H100, NO_MM_RESERVATION, seed_request

pytestmark = pytest.mark.integration
MODELS = Path(__file__).resolve().parents[1] / "data/models"
SCHEDULER = re.compile(r"max_total_num_tokens=(\d+), .*max_running_requests=(\d+), context_len=(\d+)")


def logged(sim: Sim) -> tuple[int, int, int]:
    found = SCHEDULER.search(sim.wait_line("max_total_num_tokens=", timeout=120))
    assert found, sim.lines[-8:]
    pool, running, context = (int(g) for g in found.groups())
    return pool, running, context


def test_seed_start_logs_sglangs_pool(sims: list[Sim]) -> None:
    try:
        want = result_from_answer(size_many([seed_request((200_000, 0.94, 8), NO_MM_RESERVATION)])[0])
    except OracleUnavailable as exc:
        pytest.skip(f"SGLang oracle venv not built ({exc})")
    sim = Sim(SEED_FLAGS, oracle="require")
    sims.append(sim)
    assert (
        logged(sim)
        == (want.pool_tokens, want.max_running_requests, want.context_len)
        == (218_484, 8, 200_000)
    )


def test_h100_start_of_a_real_config_logs_sglangs_pool(sims: list[Sim]) -> None:
    flags = ["--model-path", str(MODELS / "qwen3-8b"), "--tp-size", "8", "--context-length", "32768"]
    flags += ["--mem-fraction-static", "0.85"]
    # the h100 profile: 76.9 GiB free before the weights, 17.5 GiB of them per GPU at TP 8
    gpu = GpuFigures(**{**H100.__dict__, "post_gib": round(76.9 - 17.5, 6)})
    try:
        want = size(load_model("qwen3-8b"), flags[2:], {}, gpu)
    except OracleUnavailable as exc:
        pytest.skip(f"SGLang oracle venv not built ({exc})")
    sim = Sim(flags, oracle="require", profile="h100")
    sims.append(sim)
    assert logged(sim) == (want.pool_tokens, want.max_running_requests, want.context_len)
