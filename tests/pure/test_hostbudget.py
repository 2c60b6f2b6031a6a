"""The host-memory budget across services: it never says "fits" when the memory does not hold them, it names
the service that does not fit, and the --hicache-size it proposes does fit."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from agent.plan.hostbudget import HostRam, ServiceNeed, Verdict, fitting_size_gb, plan_budget
from agent.plan.hostpool import GIB, HiCacheFlags, HostMemory, RankPool, plan_host_pool

GB = 10**9
POOLS = st.builds(
    RankPool, st.integers(10_000, 3_000_000), st.integers(1_000, 400_000), st.sampled_from([1, 16, 64])
)
FLAGS = st.one_of(
    st.builds(HiCacheFlags, size_gb=st.floats(0.5, 200).map(lambda g: round(g, 2))),
    st.builds(HiCacheFlags, ratio=st.sampled_from([0.5, 1.0, 2.0, 3.0])),
    st.builds(HiCacheFlags, fraction=st.sampled_from([0.2, 0.8, 1.0])),
)


Case = tuple[HostRam, tuple[ServiceNeed, ...], int, int, HostMemory]


@st.composite
def budgets(draw: st.DrawFn) -> Case:
    """Services planned against what SGLang sees, on a host whose memory is drawn near their sum."""
    seen = HostMemory(draw(st.integers(11, 4096)) * GIB)
    out = []
    for i in range(draw(st.integers(1, 4))):
        pool, ranks = draw(POOLS), draw(st.sampled_from([1, 2, 4, 8]))
        planned = plan_host_pool(pool, draw(FLAGS), seen, ranks) if draw(st.booleans()) else None
        out.append(ServiceNeed(
            f"svc{i}", ranks, pool, planned, draw(st.integers(0, 64)) * GIB, draw(st.integers(0, 800)) * GB,
            draw(st.one_of(st.none(), st.integers(8, 2048).map(lambda g: g * GIB))),
        ))  # fmt: skip
    daemon, headroom = draw(st.integers(0, 200)) * GIB, draw(st.integers(0, 16)) * GIB
    need = daemon + headroom + sum(s.pinned for s in out)
    near = st.integers(max(need // 2, GIB), need * 2 + GIB)
    total = draw(near)
    host = HostRam(total, draw(st.integers(total // 2, total)), draw(st.one_of(st.none(), near)))
    return host, tuple(out), daemon, headroom, seen


@given(budgets())
def test_never_fits_when_the_pinned_sum_exceeds_the_memory(case: Case) -> None:
    host, svcs, daemon, headroom, _ = case
    budget = plan_budget(host, svcs, daemon, headroom)
    need = (
        daemon
        + headroom
        + sum(s.host_pool.bytes * s.ranks + s.process_bytes if s.host_pool else s.process_bytes for s in svcs)
    )
    if need > min(host.total, host.available, host.cgroup_limit or host.total):
        assert budget.verdict is Verdict.REFUSED
    if budget.fits:
        assert budget.pinned + budget.page_cache <= budget.capacity
        assert all(s.host_pool is None or s.host_pool.fits for s in svcs)
        assert all(s.memory_max is None or s.memory_max >= s.memory_max_needed for s in svcs)
        skipped = [s for s in svcs if s.name in budget.prewarm_skipped]
        assert all(budget.pinned + budget.page_cache + s.checkpoint_bytes > budget.capacity for s in skipped)
    else:
        assert budget.over in {s.name for s in svcs} and budget.reason.startswith(f"{budget.over}: ")


@given(budgets())
def test_the_size_it_proposes_fits(case: Case) -> None:
    host, svcs, daemon, headroom, seen = case
    budget = plan_budget(host, svcs, daemon, headroom)
    if budget.fitting_size_gb is None:
        return
    i = next(i for i, s in enumerate(svcs) if s.name == budget.over)
    old = svcs[i]
    assert old.pool is not None and old.host_pool is not None
    fixed = plan_host_pool(old.pool, HiCacheFlags(size_gb=budget.fitting_size_gb), seen, old.ranks)
    again = plan_budget(host, (*svcs[:i], replace(old, host_pool=fixed), *svcs[i + 1 :]), daemon, headroom)
    assert fixed.fits
    assert again.fits or svcs.index(next(s for s in svcs if s.name == again.over)) > i


@given(POOLS, st.integers(1, 500), st.integers(-1, 1))
def test_the_fitting_size_is_the_largest_that_fits(pool: RankPool, gb: int, nudge: int) -> None:
    """Around the bytes a size really takes (padding page included), the size proposed is a whole GB (the
    flag SGLang takes is an int) and fits, within 1 GB and one page of the best."""

    def bytes_at(size: float) -> int:
        return plan_host_pool(pool, HiCacheFlags(size_gb=size), HostMemory(10**15), 1).bytes

    room = bytes_at(gb) + nudge
    size = fitting_size_gb(pool, room)
    if size is None:
        assert room < GB + 2 * pool.page_size * pool.bytes_per_token
        return
    assert size == int(size)
    assert bytes_at(size) <= room
    assert bytes_at(size) > room - GB - 2 * pool.page_size * pool.bytes_per_token


def test_two_services_whose_default_ratios_overcommit_the_host_are_refused_by_name() -> None:
    # 256 GB host, two TP 4 services of a 70B-class model, each device pool ~ 400k tokens per rank
    host = HostRam(total=256 * GB, available=240 * GB)
    pool = RankPool(400_000, 2 * 128 * 2 * 80, 1)  # 1 KV head per rank, 80 layers, bf16
    ratio2 = plan_host_pool(pool, HiCacheFlags(ratio=2.0), HostMemory(host.available), 4)
    assert ratio2.fits  # each service alone passes SGLang's own check (it counts its own 4 ranks)...
    a, b = (ServiceNeed(name, 4, pool, ratio2, process_bytes=12 * GB) for name in ("chat", "code"))
    budget = plan_budget(host, (a, b), daemon_bytes=40 * GB)
    assert (
        budget.verdict is Verdict.REFUSED and budget.over == "code"
    )  # ...but both do not fit beside the daemon
    assert budget.fitting_size_gb is not None and budget.fitting_size_gb < ratio2.gb
    fixed = plan_host_pool(pool, HiCacheFlags(size_gb=budget.fitting_size_gb), HostMemory(host.available), 4)
    assert plan_budget(host, (a, replace(b, host_pool=fixed)), daemon_bytes=40 * GB).fits


def test_a_prewarm_that_cannot_stay_cached_is_skipped_not_refused() -> None:
    host = HostRam(total=512 * GB, available=500 * GB)
    pool = RankPool(400_000, 40_960, 1)
    planned = plan_host_pool(pool, HiCacheFlags(size_gb=40), HostMemory(host.available), 8)
    big = ServiceNeed("big", 8, pool, planned, process_bytes=20 * GB, checkpoint_bytes=700 * GB)
    budget = plan_budget(host, (big,))
    assert budget.verdict is Verdict.PREWARM_SKIPPED and budget.prewarm_skipped == ("big",)
    assert plan_budget(host, (replace(big, checkpoint_bytes=100 * GB),)).verdict is Verdict.FITS


def test_a_memory_max_below_sglangs_reserve_is_refused() -> None:
    host = HostRam(total=512 * GB, available=500 * GB)
    pool = RankPool(400_000, 40_960, 1)
    planned = plan_host_pool(pool, HiCacheFlags(size_gb=10), HostMemory(host.available), 2)
    svc = ServiceNeed("svc", 2, pool, planned, process_bytes=4 * GIB, memory_max=planned.bytes * 2 + 4 * GIB)
    budget = plan_budget(host, (svc,))
    assert budget.over == "svc" and "10 GiB reserve" in budget.reason
    assert plan_budget(host, (replace(svc, memory_max=svc.memory_max_needed),)).fits
