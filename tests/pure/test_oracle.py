"""SGLang 0.5.23's own sizing code (tests/oracle) against the seed and every stored real config."""

from __future__ import annotations

import json

import pytest

from tests.oracle import (
    OracleResult,
    OracleUnavailable,
    load_model,
    request,
    result_from_answer,
    size_many,
    stored_models,
)
from tests.oracle.cases import (
    FIXTURE,
    FLAG_SETS,
    H100,
    NO_MM_RESERVATION,
    SEED_STARTS,
    model_requests,
    seed_request,
)
from tests.oracle.client import key

FAMILIES_MIN = 6


def ask(requests: list[dict[str, object]]) -> list[dict[str, object]]:
    try:
        return size_many(requests)
    except OracleUnavailable as exc:
        pytest.skip(f"SGLang oracle venv not built ({exc}); `make oracle` builds it")


@pytest.fixture(scope="module")
def seed_answers() -> dict[str, list[OracleResult]]:
    plain = [seed_request(start, NO_MM_RESERVATION) for start, _ in SEED_STARTS]
    with_mm = [seed_request(start, {}) for start, _ in SEED_STARTS]
    answers = [result_from_answer(a) for a in ask(plain + with_mm)]
    return {"no_reservation": answers[:3], "default": answers[3:]}


@pytest.fixture(scope="module")
def model_answers() -> dict[tuple[str, str], dict[str, object]]:
    labelled = model_requests()
    answers = ask([req for _, _, req in labelled])
    return {(name, label): ans for (name, label, _), ans in zip(labelled, answers, strict=True)}


@pytest.mark.parametrize("i", range(3))
def test_seed_pools_within_10_tokens_without_the_multimodal_reservation(
    seed_answers: dict[str, list[OracleResult]], i: int
) -> None:
    got = seed_answers["no_reservation"][i]
    assert abs(got.pool_tokens - SEED_STARTS[i][1]) <= 10
    assert got.mm_reservation_gib == 0.0
    # MLA 576 x 61 x 2 plus the DFLASH draft's exact term (mem_cache/draft_kv_budget.py)
    assert (got.cell_bytes, got.draft_cell_bytes) == (76_416, 6_144)
    assert (got.attention_backend, got.page_size) == ("triton", 1)  # SM120 runs MLA on triton


@pytest.mark.parametrize("i", range(3))
def test_default_reserves_0_1_gb_for_kimi_as_a_vlm(
    seed_answers: dict[str, list[OracleResult]], i: int
) -> None:
    got, plain = seed_answers["default"][i], seed_answers["no_reservation"][i]
    assert got.mm_reservation_gib == pytest.approx(100 / 1024)
    # 0.1 GB at 76,416 B a token is 1,372 tokens
    assert plain.pool_tokens - got.pool_tokens == pytest.approx(100 * 2**20 / 76_416, abs=2)


def test_enough_real_configs_in_enough_families() -> None:
    names = stored_models()
    assert len(names) >= 20
    table = (FIXTURE.parents[1] / "models/SOURCES.md").read_text()
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    listed = {r[1].strip(): r[2].strip().split(" (")[0] for r in rows[1:]}
    assert set(listed) == set(names), "every stored config has a source row"
    assert len(set(listed.values())) >= FAMILIES_MIN


def test_every_config_answers_with_a_plausible_pool(
    model_answers: dict[tuple[str, str], dict[str, object]],
) -> None:
    for (name, label), answer in model_answers.items():
        assert answer.get("ok"), f"{name} {label}: {answer.get('error_type')}: {answer.get('message')}"
        got = result_from_answer(answer)
        flags = FLAG_SETS[label]
        assert got.context_len == flags["context-length"], name
        assert got.mem_fraction_static == flags["mem-fraction-static"], name
        assert got.pool_tokens > 0 and got.pool_tokens % got.page_size == 0, name
        assert 1 <= got.max_running_requests <= got.pool_tokens, name
        if got.cell_bytes:  # the pool is the budget over the cell, so it never exceeds the free memory
            assert got.pool_tokens * got.cell_bytes <= 59.4 * 2**30, name
        if flags.get("kv-cache-dtype", "").startswith("fp8"):
            assert got.kv_cache_dtype.startswith("float8"), name


def test_fp8_and_fewer_gpus_change_the_pool_as_sglang_says(
    model_answers: dict[tuple[str, str], dict[str, object]],
) -> None:
    dense = result_from_answer(model_answers[("llama-3.1-8b", "tp8-32k")])
    fp8 = result_from_answer(model_answers[("llama-3.1-8b", "tp4-8k-fp8")])
    # 8 KV heads over TP 8 -> 1 head a rank, over TP 4 -> 2: the cell doubles, fp8 halves it again
    assert dense.cell_bytes == 1 * 256 * 32 * 2
    assert fp8.cell_bytes == 2 * 256 * 32 * 1


def test_hybrid_families_report_their_split(model_answers: dict[tuple[str, str], dict[str, object]]) -> None:
    swa = result_from_answer(model_answers[("gpt-oss-20b", "tp8-32k")])
    assert swa.full_tokens and swa.swa_tokens, "sliding-window pools are split into full and window parts"
    mamba = result_from_answer(model_answers[("nemotron-3-nano-30b-a3b", "tp8-32k")])
    assert mamba.mamba_slots and mamba.mamba_slots > 0


def test_fixture_matches_the_oracle(model_answers: dict[tuple[str, str], dict[str, object]]) -> None:
    cases = json.loads(FIXTURE.read_text())["cases"]
    by_case = {(c["model"], c["case"]): c for c in cases}
    for (name, label), answer in model_answers.items():
        assert by_case[(name, label)]["answer"]["max_total_num_tokens"] == answer["max_total_num_tokens"]


def test_cache_key_covers_every_input() -> None:
    base = request(load_model("qwen3-8b"), {"tp-size": 2}, {}, H100)
    changed = [
        {**base, "flags": ["--tp-size", "4"]},
        {**base, "env": {"SGLANG_VLM_CACHE_SIZE_MB": "0"}},
        {**base, "gpu": {**base["gpu"], "post_gib": 50.0}},
        {**base, "config": {**base["config"], "num_hidden_layers": 35}},
    ]
    assert len({key(base), *(key(c) for c in changed)}) == 5
