"""The simulated server's HiCache host pool (tests/sim/sglang/hicache.py) against SGLang 0.5.23's own code:
tests/data/oracle/hostpool-cases.json holds what SGLang answered (tokens, bytes, its refusal, its log lines)
for each case, run in the oracle venv (tests/oracle/_hostpool_worker.py); the sim must say the same, line by
line. Then what the oracle's one process cannot show: ranks that check one by one, the simulated meminfo."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.sim.sglang import hicache as hc

FIXTURE = Path(__file__).resolve().parents[1] / "data/oracle/hostpool-cases.json"
CASES = [c for c in json.loads(FIXTURE.read_text())["cases"] if not c.get("decode")]
DTYPE = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float32": 4}


def flags(given: dict[str, Any], mode: str = "cache") -> hc.Flags:
    args = argparse.ArgumentParser()
    hc.add_flags(args)
    argv = ["--enable-hierarchical-cache", "--hicache-host-memory-mode", mode]
    if given.get("ratio") is not None:
        argv += ["--hicache-ratio", str(given["ratio"])]
    if given.get("size_gb"):
        argv += ["--hicache-size", "1"]  # the flag is an int; the oracle's cases give the pool any number
    argv += ["--hicache-host-memory-fraction", str(given.get("fraction", 0.8))]
    resolved = hc.resolve(args.parse_args(argv))
    return replace(resolved, size_gb=float(given["size_gb"])) if given.get("size_gb") else resolved


def headroom(levels: list[dict[str, Any]]) -> int | None:
    """host_memory.py:98-125 over the case's cgroup tree."""
    room = [
        max(0, lv[k] - max(0, lv["usage"] - lv["page_cache"]))
        for lv in levels
        for k in ("max", "high")
        if lv.get(k) is not None
    ]
    return min(room) if room else None


def bytes_per_token(geo: dict[str, Any]) -> int:
    if geo.get("kv_cache_dim"):
        return hc.mla_bytes_per_token(geo["kv_cache_dim"], DTYPE[geo["dtype"]], geo["layers"])
    return hc.mha_bytes_per_token(
        geo["head_dim"], geo["head_dim"], geo["heads"], geo["layers"], DTYPE[geo["dtype"]]
    )


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_the_sims_first_rank_is_sglangs_own_answer(case: dict[str, Any]) -> None:
    geo, answer = case["pool"], case["answer"]
    bpt = bytes_per_token(geo)
    assert bpt == answer["bytes_per_token"]
    host = hc.Host(case["available"], headroom(case["cgroup"]))
    ranks = max(case["world_size"] // case["nnodes"], 1)
    pool = hc.size_pool(geo["device_tokens"], bpt, geo["page_size"], flags(case["flags"]), host, ranks, 1)
    assert [line for _, line in pool.lines] == answer["logs"]
    if answer["ok"]:
        assert pool.error is None and (pool.tokens, pool.bytes) == (answer["tokens"], answer["bytes"])
    else:
        assert pool.error == f"{answer['error_type']}: {answer['message']}"


def test_the_last_rank_sees_the_others_pools_as_used() -> None:
    """An explicit size is checked by each rank against the host read afresh (base.py:248-257): 4 ranks of
    20 GB fit a host of 10 GiB + 80 GB checked at once, but the fourth sees three pools pinned."""
    size = hc.Flags(2.0, 20, None)
    first_alone = hc.size_pool(100, 1000, 1, size, hc.Host(hc.RESERVE + 4 * 20_000_001_000), 4, 1)
    assert first_alone.error is None
    four = hc.size_pool(100, 1000, 1, size, hc.Host(hc.RESERVE + 4 * 20_000_001_000), 4)
    assert four.error is not None and four.error.startswith("ValueError: Not enough host memory available.")
    room = hc.RESERVE + 7 * 20_000_001_000  # pools + ranks - 1: what deployctl's MemoryMax= holds
    ok = hc.size_pool(100, 1000, 1, size, hc.Host(10**15, room), 4)
    assert ok.error is None and ok.tokens == 20_000_001
    lines = [line for _, line in ok.lines]
    assert lines.count("Allocating kv hierarchical KV host pool: 20000001 tokens, 20.00 GB host memory.") == 4


def test_a_fraction_outside_its_range_is_sglangs_error() -> None:
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        flags({"fraction": 1.5})


def test_pinned_pools_leave_the_simulated_meminfo_and_come_back(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       536870912 kB\nMemAvailable:   209715200 kB\n")
    env = {hc.MEMINFO_KNOB: str(meminfo), "SGLANG_SIM_MEMORY_MAX": str(100 * hc.GIB)}
    assert hc.host_now(env, 4 * hc.GIB) == hc.Host(200 * hc.GIB, 96 * hc.GIB)
    hc.charge(env, 50 * hc.GIB)
    assert hc.host_now(env, 0).available == 150 * hc.GIB
    assert meminfo.read_text().startswith("MemTotal:       536870912 kB\n")
    hc.charge(env, -50 * hc.GIB)
    assert hc.mem_available(meminfo.read_text()) == 200 * hc.GIB
    hc.charge({}, 10)  # a real host's meminfo: nothing written


def test_the_unit_and_its_memory_max_as_systemd_says() -> None:
    cgroup = "9:name=systemd:/system.slice/sglang-a.service\n4:memory:/\n0::/system.slice/sglang-a.service\n"
    assert hc.unit_of(cgroup) == "sglang-a.service"
    assert hc.unit_of("0::/user.slice/user-0.slice/session-3.scope\n") is None
    assert hc.parse_memory_max("124554051584\n") == 124554051584
    assert hc.parse_memory_max("infinity\n") is None
