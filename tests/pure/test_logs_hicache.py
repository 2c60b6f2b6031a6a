"""SGLang's HiCache host-pool lines and refusals, as the log parser reads them.

The lines are SGLang's own: those real SGLang 0.5.23 printed on the CPU
(shared/sglang/PD-AND-HICACHE-ON-CPU.md) and those its sizing code logged for every recorded oracle case
(tests/data/oracle/hostpool-cases.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.plan.hostpool import HiCacheFlags, HostMemory, RankPool, plan_host_pool
from agent.sglang.logs import events as ev
from agent.sglang.logs import hicache
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.summary import summarize

CASES = json.loads((Path(__file__).resolve().parents[1] / "data/oracle/hostpool-cases.json").read_text())[
    "cases"
]
STAMP = "[2026-12-06 02:10:48] "
REAL_START = [
    "[2026-12-06 02:10:48] HiCache memory headroom: host 18.5 GiB, cgroup 8589934587.0 GiB",
    "[2026-12-06 02:10:48] HiCache auto-sizing: ratio 2.000 -> 2.000; 6.8 GiB host memory per rank "
    "(fraction 0.80, 1 ranks on this host), host pools 0.0 GiB.",
    "[2026-12-06 02:10:48] Allocating kv hierarchical KV host pool: 32769 tokens, 0.02 GB host memory.",
]


def only(events: list[ev.LogEvent]) -> ev.LogEvent:
    assert len(events) == 1, events
    return events[0]


def test_a_real_start_gives_its_headroom_decision_and_pool() -> None:
    headroom, auto, pool = (only(parse_line(line)) for line in REAL_START)
    assert headroom == ev.HostMemoryHeadroom(None, 18.5, 8589934587.0)
    assert auto == ev.HostPoolAutoSize(None, 2.0, 2.0, 6.8, 0.8, 1, 0.0)
    assert pool == ev.HostPool(None, "kv", 32769, 0.02)


def test_a_rank_tagged_packed_mtp_pool_keeps_its_rank_and_draft_layers() -> None:
    line = (
        "[2026-12-06 02:10:48 TP3] Allocating kv hierarchical KV host pool: 1953126 tokens, 64.00 GB host "
        "memory, packed MTP KV layers: target_layers=61, draft_layers=1, total_layers=62."
    )
    assert only(parse_line(line)) == ev.HostPool("TP3", "kv", 1953126, 64.0, 1)


@pytest.mark.parametrize("case", CASES[:80], ids=[c["case"] for c in CASES[:80]])
def test_every_line_sglangs_sizing_logged_parses_to_its_answer(case: dict) -> None:  # type: ignore[type-arg]
    answer = case["answer"]
    pools = [e for line in answer["logs"] for e in parse_line(STAMP + line) if isinstance(e, ev.HostPool)]
    if answer["ok"]:
        assert [(p.tokens, p.gb) for p in pools] == [(answer["tokens"], round(answer["bytes"] / 1e9, 2))]
        return
    assert pools == []
    failure = only(parse_line(STAMP + "ValueError: " + answer["message"]))
    assert isinstance(failure, ev.Failure) and failure.failure_kind == ev.HOST_MEMORY_SHORT


@pytest.mark.parametrize(
    "message",
    [
        "ValueError: Not enough host memory available. Requesting 100000.00 GB but only have 7.81 GB free. "
        "Please reduce the size of the hierarchical cache.",
        "ValueError: No host memory is left for HiCache after the 10 GiB reserve; set --hicache-ratio or "
        "--hicache-size explicitly.",
        "RuntimeError: Cannot automatically size HiCache host memory; set --hicache-size explicitly (GB per "
        "rank), leaving room for other memory use within the container limit.",
    ],
)
def test_a_refusal_is_the_root_cause_of_the_failed_start(message: str) -> None:
    lines = [
        REAL_START[0],
        "[2026-12-06 02:10:48] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/x/sglang/srt/mem_cache/pool_host/base.py", line 252, in _allocate_host_buffer',
        message,
        "[2026-12-06 02:10:49] Received sigquit from a child process. It usually means the child failed.",
    ]
    failure = summarize(lines).failure
    assert failure is not None and failure.failure_kind == ev.HOST_MEMORY_SHORT
    assert failure.line == message


def test_the_fix_names_the_size_sglang_allows() -> None:
    line = "ValueError: Not enough host memory available. Requesting 1.00 GB but only have 0.82 GB free. ..."
    assert "no whole-GB size fits" in hicache.fix(line) and "MemoryMax=" in hicache.fix(line)
    line = "ValueError: Not enough host memory available. Requesting 200.00 GB but only have 117.35 GB free."
    assert "--hicache-size to at most 117 (GB per rank)" in hicache.fix(line)  # the flag is an int
    assert "10 GiB" in hicache.fix("No host memory is left for HiCache after the 10 GiB reserve; set ...")
    assert "--hicache-size" in hicache.fix("Cannot automatically size HiCache host memory; set ...")


POOLS = st.builds(
    RankPool, st.integers(1, 5_000_000), st.integers(1, 2_000_000), st.sampled_from([1, 16, 64])
)


@given(
    pool=POOLS,
    size_gb=st.sampled_from([0.0, 1.0, 40.0, 64.5]),
    gib=st.integers(0, 4096),
    ranks=st.integers(1, 16),
)
def test_the_gate_reads_back_what_the_plan_says_sglang_logs(
    pool: RankPool, size_gb: float, gib: int, ranks: int
) -> None:
    planned = plan_host_pool(pool, HiCacheFlags(size_gb=size_gb), HostMemory(gib * 2**30), ranks)
    events = parse_line(STAMP + ("ValueError: " if not planned.fits else "") + planned.message())
    if planned.fits:
        assert only(events) == ev.HostPool(None, "kv", planned.tokens, round(planned.bytes / 1e9, 2))
    else:
        failure = only(events)
        assert isinstance(failure, ev.Failure) and failure.failure_kind == ev.HOST_MEMORY_SHORT
        said = re.search(r"--hicache-size to at most (\d+) \(GB per rank\)", hicache.fix(failure.line))
        if said:  # the whole-GB size named passes SGLang's check on the same host
            again = plan_host_pool(pool, HiCacheFlags(size_gb=int(said[1])), HostMemory(gib * 2**30), ranks)
            assert again.fits
        else:
            assert planned.allowance < 1.3e9  # no whole GB with its padding page fits


def _all_ranks_pin(pool: RankPool, size: int, first: HostMemory, ranks: int, pools: int) -> bool:
    """SGLang's check at every rank of the host, each reading free memory after the earlier ranks pinned
    (pool_host/base.py:98-108, 247-257): the last sees pools - 1 pools used."""
    asked = plan_host_pool(pool, HiCacheFlags(size_gb=size), first, ranks)
    used = (pools - 1) * asked.bytes
    return plan_host_pool(pool, HiCacheFlags(size_gb=size), HostMemory(first.available - used), ranks).fits


@given(
    pool=POOLS.filter(lambda p: p.page_size * p.bytes_per_token <= 2**28),
    gib=st.integers(11, 4096),
    ranks=st.sampled_from([1, 2, 4, 8]),
    dp=st.sampled_from([1, 2]),
    known=st.booleans(),
)
def test_the_fix_names_a_size_every_rank_of_the_host_accepts(
    pool: RankPool, gib: int, ranks: int, dp: int, known: bool
) -> None:
    """The first rank's refusal says Y GB free, Y = (free - 10 GiB) // ranks: floor(Y) fits that rank but
    not the later ones, which see the earlier pools as used. With the ranks known (the server_args line) the
    size named fits them all; without, the size named for several ranks does (no data parallelism)."""
    first = HostMemory(gib * 2**30)
    planned = plan_host_pool(pool, HiCacheFlags(size_gb=100_000), first, ranks)
    assert not planned.fits
    pools = ranks * dp
    line = "ValueError: " + planned.message()
    said = hicache.fix(line, ranks, pools) if known else hicache.fix(line)
    sizes = [int(n) for n in re.findall(r"at most (\d+)", said)]
    if not sizes:
        return
    if known:
        assert _all_ranks_pin(pool, sizes[0], first, ranks, pools), said
    else:
        assert _all_ranks_pin(pool, sizes[0], first, 1, 1), said
        if dp == 1 and len(sizes) > 1:
            assert _all_ranks_pin(pool, sizes[1], first, ranks, ranks), said


def test_a_tp4_refusal_advises_the_size_the_fourth_rank_accepts() -> None:
    """TP 4 on 240 GiB free: each rank may claim (240 - 10) GiB / 4 = 61.74 GB, so --hicache-size 80 is
    refused saying 61.74 GB free; 61 fits the first rank, but the fourth sees three pools of 61 GB pinned.
    (4 x 61.74) / 7 = 35.28 GB: 35 with its padding page fits all four."""
    line = (
        "ValueError: Not enough host memory available. Requesting 80.00 GB but only have 61.74 GB free. "
        "Please reduce the size of the hierarchical cache."
    )
    args = "server_args=ServerArgs(model_path='/m', tp_size=4, pp_size=1, dp_size=1, nnodes=1, x=1)"
    summary = summarize([args, line])
    assert summary.host_ranks == (4, 4) and summary.to_dict()["host_ranks"] == [4, 4]
    assert summary.failure is not None
    from agent.sglang.logs.fixes import fix_for

    said = fix_for(summary.failure.failure_kind, summary.failure.line, summary.host_ranks)
    assert said is not None and "--hicache-size to at most 35 (GB per rank" in said, said
    assert "at most 61 (GB per rank) if the service has one rank on the host, else at most 30" in hicache.fix(
        line
    )
