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
    DecodeServer,
    HiCacheFlags,
    HostMemory,
    HostPool,
    Mode,
    RankPool,
    Refusal,
    decode_backup_ratio,
    mha_bytes_per_token,
    mla_bytes_per_token,
    plan_host_pool,
    ranks_per_host,
)

FIXTURE = Path(__file__).resolve().parents[1] / "data/oracle/hostpool-cases.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float32": 4}


def plan(case: dict[str, Any]) -> tuple[RankPool, HostPool | None]:
    """The planner's answer for a case; None where a decode server builds no host pool."""
    geo = case["pool"]
    mla = bool(geo.get("kv_cache_dim"))
    if mla:
        bpt = mla_bytes_per_token(geo["kv_cache_dim"], geo["layers"], DTYPE_BYTES[geo["dtype"]])
    else:
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
    if case.get("decode") and not DecodeServer(mha=not mla).builds_backup_pool:
        return pool, None
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
    planned = [(c, plan(c)[1]) for c in CASES]
    outcomes = {(p.mode, c["answer"]["ok"], bool(c["pool"].get("kv_cache_dim"))) for c, p in planned if p}
    assert outcomes >= {(m, ok, mla) for m in Mode for ok in (True, False) for mla in (True, False)} - {
        (Mode.RATIO, False, True)
    }
    assert {bool(c["pool"].get("kv_cache_dim")) for c, p in planned if c.get("decode") and p} == {False}
    assert any(c.get("decode") and p is None for c, p in planned)  # an MLA decode backs up without a pool
    assert any("No host memory" in c["answer"].get("message", "") for c in CASES)
    assert len({c["world_size"] // c["nnodes"] for c in CASES}) > 1
    assert any(lv.get("max") or lv.get("high") for c in CASES for lv in c["cgroup"])


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_host_pool_equals_sglangs_own(case: dict[str, Any]) -> None:
    pool, got = plan(case)
    answer = case["answer"]
    assert pool.bytes_per_token == answer["bytes_per_token"]
    if got is None:  # a decode server that backs up retracted requests without a host pool
        assert answer["decode_backend"] == "cpu_tensor" and answer["ok"]
        return
    assert "decode_backend" not in answer
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
    kinds = {p.refusal for c in CASES if not c["answer"]["ok"] and (p := plan(c)[1])}
    assert kinds == {Refusal.NOT_ENOUGH, Refusal.NONE_LEFT}
