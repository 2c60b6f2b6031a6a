"""Two HiCache services on one host whose SGLang defaults would overcommit it: planned in start order, each
rendered with an explicit --hicache-size and MemoryMax=, each start passing SGLang's own check on the host
as the first left it, and the two together within the host. The second's plan counts the first once (what
the facts say its unit holds is given back), and the starts are one after another
(tests/pure/test_host_memory_order.py: no two pin at once)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.plan.hostplan import memory_at_start, neighbour, plan_host, process_bytes, shared
from agent.plan.hostpool import GIB, HiCacheFlags, RankPool, plan_host_pool
from agent.protocol.answers import HostMemoryData

GB = 10**9
ON = {"enable-hierarchical-cache": True}


def memory(total: int, available: int, siblings: dict[str, int] | None = None) -> HostMemoryData:
    data: HostMemoryData = {"total": total, "available": available, "hugepages_total": 0, "hugepages_free": 0,
                            "numa_nodes": 1, "cgroup": []}  # fmt: skip
    if siblings is not None:
        data["siblings"] = siblings
    return data


@settings(max_examples=80, deadline=None)
@given(
    st.integers(64, 2048),  # the host, GiB
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(100_000, 1_500_000),  # each service's device pool per rank, tokens
    st.sampled_from([40_960, 131_072]),
)
def test_in_order_both_fit_where_sglangs_defaults_overcommit(
    gib: int, tp_a: int, tp_b: int, tokens: int, cell: int
) -> None:
    """The inventory gives both SGLang 0.5.23's default (no ratio, no size: the auto fraction); each plan
    counts the other as the inventory and the facts say it (plan/hostwire.py neighbours)."""
    total = gib * GIB
    avail = total - 8 * GIB  # the kernel and the rest
    pool = RankPool(tokens, cell, 1)
    fa, fb = {**ON, "tp-size": tp_a}, {**ON, "tp-size": tp_b}
    # Started at once, each sees the whole host and auto-sizes 0.8 of it: together more than the host holds
    ga = plan_host_pool(pool, HiCacheFlags(), memory_at_start(memory(total, avail), tp_a), tp_a)
    gb = plan_host_pool(pool, HiCacheFlags(), memory_at_start(memory(total, avail), tp_b), tp_b)
    assume(ga.fits and gb.fits)
    assume(ga.bytes * tp_a + process_bytes(tp_a) + gb.bytes * tp_b + process_bytes(tp_b) > avail)
    a_inv = neighbour("chat", fa, unit="sglang-chat.service")
    b_inv = neighbour("code", fb, unit="sglang-code.service")
    assert a_inv is not None and b_inv is not None
    # a shared pool under 1 GB has no whole-GB size to render: not planned here (docs/planning.md, Not yet)
    assume(shared(pool, fa, ga, memory_at_start(memory(total, avail), tp_a), tp_a, (b_inv,)).bytes >= GB)
    first = plan_host("chat", pool, fa, memory(total, avail, {}), (b_inv,))  # the other not started yet
    assert first.fits and first.size_gb is not None, first.budget.reason
    # the first starts under its rendered size and MemoryMax=, and SGLang's own check passes
    seen = memory_at_start(memory(total, avail), tp_a, first.memory_max)
    assert plan_host_pool(pool, HiCacheFlags(size_gb=first.size_gb), seen, tp_a).fits
    held = first.pool.bytes * tp_a + process_bytes(tp_a)  # what its unit holds once it has pinned
    after = memory(total, avail - held, {"sglang-chat.service": held})
    second = plan_host("code", pool, fb, after, (a_inv,))
    assert second.fits, second.budget.reason  # nothing refused
    if second.size_gb is None:  # under 1 GB: the flags as given, SGLang's auto size on what is left
        assert second.pool.fits
        return
    seen = memory_at_start(after, tp_b, second.memory_max)
    assert plan_host_pool(pool, HiCacheFlags(size_gb=second.size_gb), seen, tp_b).fits  # SGLang agrees
    assert held + second.pool.bytes * tp_b + process_bytes(tp_b) <= avail  # and the host holds both


def test_a_running_neighbour_is_counted_once() -> None:
    """Before the facts carried what a neighbour holds, its pool counted in the budget and again as missing
    from MemAvailable: the second service was refused on a host that held it."""
    pool, flags = RankPool(400_000, 40_960, 1), {**ON, "tp-size": 4}
    first = plan_host("chat", pool, flags, memory(256 * GB, 240 * GB))
    assert first.fits and first.size_gb
    held = first.pool.bytes * 4 + process_bytes(4)
    near = neighbour("chat", {**flags, "hicache-size": int(first.size_gb)}, unit="sglang-chat.service")
    assert near is not None
    running = memory(256 * GB, 240 * GB - held, {"sglang-chat.service": held})
    assert plan_host("code", pool, flags, running, (near,)).fits
    auto = neighbour("chat", flags, unit="sglang-chat.service")  # as the inventory says it: no size
    assert auto is not None and plan_host("code", pool, flags, running, (auto,)).budget.pinned >= held
    unknown = memory(256 * GB, 240 * GB - held)  # facts of an agent that does not say: counted twice
    assert not plan_host("code", pool, flags, unknown, (near,)).fits
