"""The weight-cache daemon's host side in the host budget: SGLang 0.5.23's daemon keeps the weights in GPU
memory (CUDA IPC, srt/weight_cache/daemon.py:146-147), so the host pays for its processes only, a launcher
and one per local rank (daemon.py:681-695, 765-790). Counted in the budget, outside the engine's
MemoryMax=."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.plan.hostbudget import HostRam, ServiceNeed, Verdict, plan_budget
from agent.plan.hostplan import DAEMON_BASE, DAEMON_PER_RANK, daemon_bytes, neighbour, plan_host, runs_daemon
from agent.plan.hostpool import GIB, HiCacheFlags, HostMemory, RankPool, plan_host_pool
from agent.protocol.answers import HostMemoryData

GB = 10**9
ON = {"enable-hierarchical-cache": True}


@st.composite
def hosts(draw: st.DrawFn) -> tuple[HostRam, tuple[ServiceNeed, ...], tuple[int, ...]]:
    """Services, each with or without a daemon of its own ranks, on a host near their sum."""
    out, daemons = [], []
    for i in range(draw(st.integers(1, 4))):
        pool, ranks = (
            RankPool(draw(st.integers(10_000, 1_000_000)), 131_072, 1),
            draw(st.sampled_from([1, 2, 8])),
        )
        planned = plan_host_pool(
            pool, HiCacheFlags(size_gb=draw(st.integers(1, 60))), HostMemory(10**15), ranks
        )
        out.append(ServiceNeed(f"svc{i}", ranks, pool, planned, draw(st.integers(1, 40)) * GIB))
        daemons.append(daemon_bytes(ranks, draw(st.booleans())))
    need = sum(s.pinned for s in out) + sum(daemons)
    total = draw(st.integers(max(need // 2, GIB), need * 2))
    return HostRam(total, total), tuple(out), tuple(daemons)


@settings(max_examples=300)
@given(hosts(), st.integers(0, 16))
def test_each_daemon_is_pinned_memory_of_the_host_not_of_the_engines_cgroup(
    case: tuple[HostRam, tuple[ServiceNeed, ...], tuple[int, ...]], headroom_gib: int
) -> None:
    host, bare, daemons = case
    withd = tuple(replace(s, daemon_bytes=d) for s, d in zip(bare, daemons, strict=True))
    a, b = (
        plan_budget(host, bare, headroom=headroom_gib * GIB),
        plan_budget(host, withd, headroom=headroom_gib * GIB),
    )
    assert all(s.memory_max_needed == t.memory_max_needed for s, t in zip(bare, withd, strict=True))
    if b.fits:  # a daemon only ever takes memory: what fits with it fits without it, pinned exactly less
        assert a.fits and b.pinned == a.pinned + sum(daemons)
    if sum(s.pinned for s in withd) + headroom_gib * GIB > host.capacity:
        assert b.verdict is Verdict.REFUSED  # never "fits" when the daemons tip the host over
    if a.fits and not b.fits:  # the one the daemons tip over is named, with a size that fits beside them
        i = [s.name for s in withd].index(b.over)  # type: ignore[arg-type]
        assert b.pinned > host.capacity and "weight-cache daemon" in b.reason
        if b.fitting_size_gb is not None:
            old = withd[i]
            assert old.pool is not None
            fixed = plan_host_pool(
                old.pool, HiCacheFlags(size_gb=b.fitting_size_gb), HostMemory(10**15), old.ranks
            )
            again = plan_budget(host, (*withd[:i], replace(old, host_pool=fixed), *withd[i + 1 :]),
                                headroom=headroom_gib * GIB)  # fmt: skip
            assert again.fits or [s.name for s in withd].index(again.over) > i  # type: ignore[arg-type]


def memory(total_gib: int) -> HostMemoryData:
    return {"total": total_gib * GIB, "available": total_gib * GIB, "hugepages_total": 0, "hugepages_free": 0,
            "numa_nodes": 1, "cgroup": []}  # fmt: skip


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]))
def test_the_plan_counts_a_launcher_and_a_process_per_local_rank(tp: int, pp: int) -> None:
    """[weight_cache] enabled, or a unit already in client mode: the budget pins DAEMON_BASE + DAEMON_PER_RANK
    per TP x PP rank more, and `plan --json` says so; the unit's MemoryMax= (the engine's cgroup) does not."""
    flags = {**ON, "tp-size": tp, "pp-size": pp, "hicache-size": 4}
    pool = RankPool(100_000, 131_072, 1)
    bare = plan_host("svc", pool, flags, memory(4096))
    for host in (plan_host("svc", pool, flags, memory(4096), weight_cache=True),
                 plan_host("svc", pool, {**flags, "weight-cache-mode": "client"}, memory(4096))):  # fmt: skip
        assert host.budget.pinned - bare.budget.pinned == DAEMON_BASE + DAEMON_PER_RANK * tp * pp
        assert host.memory_max == bare.memory_max
        assert host.to_dict()["host_budget"]["weight_cache_daemon"] == DAEMON_BASE + DAEMON_PER_RANK * tp * pp  # type: ignore[index]
        assert "weight-cache daemon" in host.lines(100_000, 200_000)[1]
    assert not runs_daemon({"weight-cache-mode": "off"}) and bare.daemon_bytes == 0


def test_a_host_that_holds_the_service_but_not_its_daemon_is_refused_by_name() -> None:
    """Before this, the daemon counted 0: a plan that fit only by leaving it out said "fits"."""
    # small pools on two ranks: SGLang's own check (the last rank sees 3 pools' room and 10 GiB gone) stays
    # under the budget's 2 pools and 8 GiB headroom, so the daemon (5 GiB) is what the 4 GiB slack lacks
    flags = {**ON, "tp-size": 2, "hicache-size": 1}
    pool = RankPool(400_000, 131_072, 1)
    pinned = plan_host("chat", pool, flags, memory(4096)).budget.pinned  # pools, processes, headroom
    tight = memory(-(-pinned // GIB) + 4)
    assert plan_host("chat", pool, flags, tight).fits
    over = plan_host("chat", pool, flags, tight, weight_cache=True)
    assert not over.fits and over.budget.over == "chat" and "weight-cache daemon" in over.budget.reason


def test_a_neighbours_daemon_counts() -> None:
    flags = {**ON, "tp-size": 4, "hicache-size": 10}
    plain, cached = neighbour("n", flags), neighbour("n", flags, weight_cache=True)
    assert plain is not None and cached is not None
    assert cached.pinned - plain.pinned == DAEMON_BASE + 4 * DAEMON_PER_RANK
    assert cached.memory_max_needed == plain.memory_max_needed
