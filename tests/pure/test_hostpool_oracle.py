"""The host-pool plan against SGLang 0.5.23's own HiCache sizing code, to the token.

tests/data/oracle/hostpool-cases.json holds, per case, the inputs (pool geometry, TP layout, available
memory, a cgroup tree, the HiCache flags, a decode's retraction backup) and what SGLang's own code answered
when run on them in the oracle venv (tests/oracle/_hostpool_worker.py; regenerate with
`python -m tests.oracle.hostpool_cases`): the pool's tokens and bytes, or its refusal, and its log lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.plan.hostpool import (
    CgroupLevel,
    HiCacheFlags,
    HostMemory,
    HostPool,
    Mode,
    RankPool,
    Refusal,
    decode_backup_ratio,
    mha_bytes_per_token,
    plan_host_pool,
    ranks_per_host,
)

FIXTURE = Path(__file__).resolve().parents[1] / "data/oracle/hostpool-cases.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float32": 4}


def plan(case: dict[str, Any]) -> tuple[RankPool, HostPool]:
    geo = case["pool"]
    bpt = mha_bytes_per_token(
        geo["heads"], geo["head_dim"], geo["head_dim"], geo["layers"], DTYPE_BYTES[geo["dtype"]]
    )
    pool = RankPool(geo["device_tokens"], bpt, geo["page_size"])
    given = case["flags"]
    flags = HiCacheFlags(
        ratio=given.get("ratio"),
        size_gb=float(given.get("size_gb") or 0),
        fraction=given.get("fraction", 0.8),
    )
    levels = tuple(
        CgroupLevel(
            tuple(lv[k] for k in ("max", "high") if lv.get(k) is not None), lv["usage"], lv["page_cache"]
        )
        for lv in case["cgroup"]
    )
    backup = None
    if case.get("decode") and given.get("ratio") is None:
        d = case["decode"]
        backup = decode_backup_ratio(
            pool, d["context_len"], size_gb=flags.size_gb, receive_threshold=d["receive_threshold"]
        )
    ranks = ranks_per_host(case["world_size"], case["nnodes"])
    return pool, plan_host_pool(
        pool, flags, HostMemory(case["available"], levels), ranks, decode_backup=backup
    )


def test_the_cases_cover_every_mode_and_outcome() -> None:
    outcomes = {(plan(c)[1].mode, c["answer"]["ok"]) for c in CASES}
    assert outcomes >= {(m, ok) for m in Mode for ok in (True, False) if (m, ok) != (Mode.RATIO, False)}
    assert any(c.get("decode") for c in CASES) and any(
        "No host memory" in c["answer"].get("message", "") for c in CASES
    )
    assert {len({c["world_size"] // c["nnodes"] for c in CASES})} != {1}


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_host_pool_equals_sglangs_own(case: dict[str, Any]) -> None:
    pool, got = plan(case)
    answer = case["answer"]
    assert pool.bytes_per_token == answer["bytes_per_token"]
    if got.auto is not None and got.refusal is not Refusal.NONE_LEFT:  # SGLang logs it once the ratio holds
        assert got.auto.line() in answer["logs"]
    if not answer["ok"]:
        assert got.refusal is not None, (got, answer)
        assert got.message() == answer["message"]
        return
    assert got.refusal is None, (got.message(), answer)
    assert (got.tokens, got.bytes) == (answer["tokens"], answer["bytes"])
    assert got.message() in answer["logs"]


def test_a_refusal_is_the_kind_sglang_names() -> None:
    kinds = {plan(c)[1].refusal for c in CASES if not c["answer"]["ok"]}
    assert kinds == {Refusal.NOT_ENOUGH, Refusal.NONE_LEFT}
