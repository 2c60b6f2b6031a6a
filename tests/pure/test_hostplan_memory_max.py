"""A `MemoryMax=` too small for the host pool is refused by the plan, before any start: the unit's own
MemoryMax=/MemoryHigh= (which systemd applies over the rendered one) is the cgroup SGLang sizes against, so
the plan sizes the pool under it, by SGLang's own check (pool_host/base.py:247-257) and its 10 GiB reserve,
and never calls "feasible" a limit under which SGLang would refuse."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.inventory import load_host
from agent.plan.choose import Target
from agent.plan.facts import load_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.from_inventory import plan_input_from_host
from agent.plan.hostbudget import RamShare
from agent.plan.hostplan import process_bytes, unit_memory_limit
from agent.plan.hostpool import (
    GIB,
    RESERVE_BYTES,
    CgroupLevel,
    HiCacheFlags,
    HostMemory,
    RankPool,
    plan_host_pool,
)

ROOT = Path(__file__).resolve().parents[2]
ON = {"enable-hierarchical-cache": True}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@given(
    st.integers(1, 10**6), st.sampled_from(list(UNITS)), st.integers(1, 10**6), st.sampled_from(list(UNITS))
)
def test_the_units_own_limit_is_read_as_systemd_reads_it(a: int, ua: str, b: int, ub: str) -> None:
    lines = [f"MemoryMax={a}{ua}", "Nice=5", f"MemoryHigh={b}{ub}"]
    assert unit_memory_limit(lines) == min(a * UNITS[ua], b * UNITS[ub])
    assert unit_memory_limit([f"MemoryMax={a}{ua}", "MemoryMax=infinity"]) is None  # the last one counts
    assert unit_memory_limit(["MemoryMax=80%"]) == RamShare(80.0)  # of MemTotal, resolved by the plan
    assert unit_memory_limit(["LimitNOFILE=65536"]) is None


def _plan(limit: int | None, size: int, host_gib: int = 1024):  # type: ignore[no-untyped-def]
    inp = load_facts(ROOT / "examples/llama-3.1-8b-h100.json")
    mem = {"total": host_gib * GIB, "available": host_gib * GIB, "hugepages_total": 0, "hugepages_free": 0,
           "numa_nodes": 1, "cgroup": []}  # fmt: skip
    inp = replace(
        inp, flags={**inp.flags, **ON, "hicache-size": size}, host_memory=mem, unit_memory_limit=limit
    )
    return plan_from_facts(inp, Target(32_000))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.integers(1, 200))
def test_never_feasible_under_a_limit_sglang_would_refuse(size: int, limit_gib: int) -> None:
    plan = _plan(limit_gib * GIB, size)
    assert plan.host is not None
    ranks, per_token = plan.host.ranks, plan.host.bytes_per_token
    pool = RankPool(plan.host.device_tokens, per_token, plan.host.page_size)
    # SGLang's own check under the unit's cgroup, with the service's processes in it
    seen = HostMemory(10**15, (CgroupLevel((limit_gib * GIB,), process_bytes(ranks), 0),))
    sglang = plan_host_pool(pool, HiCacheFlags(size_gb=size), seen, ranks)
    if plan.feasible:
        assert sglang.fits and plan.host.memory_max == limit_gib * GIB
        assert limit_gib * GIB >= process_bytes(ranks) + RESERVE_BYTES + sglang.bytes * ranks
    else:
        assert plan.binding is not None and plan.binding.startswith(f"{plan.host.budget.over}: ")
        assert "per rank would fit" in plan.binding or "no host pool" in plan.binding
        fix = plan.host.budget.fitting_size_gb
        if fix is not None:  # the size it names fits under the same limit
            assert _plan(limit_gib * GIB, int(fix)).feasible


def test_a_memory_max_too_small_is_refused_before_the_start_in_sglangs_words() -> None:
    plan = _plan(20 * GIB, 40)
    assert not plan.feasible and plan.binding is not None  # apply stops here: exit 2, nothing restarted
    assert "Not enough host memory available" in plan.binding and "--hicache-size" in plan.binding
    assert _plan(80 * GIB, 40).feasible  # room for the pool, the processes and SGLang's 10 GiB reserve


def test_the_inventorys_verbatim_memory_max_reaches_the_plan() -> None:
    host = load_host("ct200", ROOT / "units")
    host = host.model_copy(
        update={
            "unit": host.unit.model_copy(
                update={"verbatim": {"Service": ["MemoryMax=20G"]}, "template": "sglang-adopted.service.j2"}
            )
        }
    )
    inp = plan_input_from_host(host, load_facts(ROOT / "examples/llama-3.1-8b-h100.json"))
    assert inp.unit_memory_limit == 20 * GIB


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(1, 60), st.integers(20, 800))
def test_the_last_rank_to_pin_still_finds_room_under_a_limit_the_plan_accepts(
    tp: int, size: int, gib: int
) -> None:
    """SGLang's ranks check the cgroup one by one as they pin (sglang#38156): under a unit limit the plan
    accepts, the last rank, seeing the others' pools as used, still passes SGLang's own check."""
    from agent.plan.hostplan import plan_host

    pool = RankPool(400_000, 131_072, 1)
    flags = {**ON, "tp-size": tp, "hicache-size": size}
    host = plan_host("svc", pool, flags, None, unit_limit=gib * GIB)
    if not host.fits:
        return
    others = host.pool.bytes * (tp - 1)
    last = HostMemory(10**15, (CgroupLevel((gib * GIB,), process_bytes(tp) + others, 0),))
    assert plan_host_pool(pool, HiCacheFlags(size_gb=size), last, tp).fits
