"""The size a host-memory refusal offers is the largest the planner itself then accepts (plan/hostoffer.py):
for generated hosts, cgroup limits, TP and data parallelism, models and neighbours, planning with the offered
--hicache-size is feasible and one GB more is refused; a MemoryMax= is offered only where it holds."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.plan.hostbudget import RamShare
from agent.plan.hostoffer import largest_fitting_size
from agent.plan.hostplan import POOL_PAD, neighbour, plan_host
from agent.plan.hostpool import GIB, RankPool
from agent.protocol.answers import CgroupLevelData, HostMemoryData

ON = {"enable-hierarchical-cache": True}
UNIT = "system.slice/sglang.service"


def level(path: str, limit: int | None, current: int = 0) -> CgroupLevelData:
    return {"path": path, "max": limit, "high": None, "current": current, "file": 0}


@st.composite
def cases(draw: Any) -> tuple[RankPool, dict[str, Any], HostMemoryData, int | None, tuple[Any, ...]]:
    page = draw(st.sampled_from([1, 16, 64, 256]))
    per_token = draw(st.sampled_from([40_960, 65_536, 70_272, 163_840, 327_680]))
    per_token = min(per_token, POOL_PAD // page)  # a padding page within the rendered bound
    pool = RankPool(draw(st.integers(50_000, 2_000_000)), per_token, page)
    total = draw(st.integers(32, 2048)) * GIB
    available = total - draw(st.integers(0, 16)) * GIB
    flags: dict[str, Any] = {**ON, "tp-size": draw(st.sampled_from([1, 2, 4, 8]))}
    if draw(st.booleans()):
        flags["dp-size"] = draw(st.sampled_from([1, 2]))
    asked = draw(st.one_of(st.integers(1, 4000).map(lambda g: ("hicache-size", g)),
                           st.sampled_from([0.5, 2.0, 8.0]).map(lambda r: ("hicache-ratio", r))))  # fmt: skip
    flags[asked[0]] = asked[1]
    levels = [level(UNIT, None)]
    if draw(st.booleans()):
        levels.append(level("system.slice", draw(st.integers(16, 2048)) * GIB, 4 * GIB))
    data: HostMemoryData = {"total": total, "available": available, "hugepages_total": 0,
                            "hugepages_free": 0, "numa_nodes": 1, "cgroup": levels,
                            "siblings": {}}  # fmt: skip
    limit = draw(st.one_of(st.none(), st.integers(16, 1024).map(lambda g: g * GIB)))
    near = ()
    if draw(st.booleans()):
        near = (neighbour("code", {**ON, "hicache-size": draw(st.integers(1, 100))}, unit="code.service"),)
    return pool, flags, data, limit, near


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_offered_size_is_the_largest_the_plan_accepts(case: Any) -> None:
    pool, flags, data, limit, near = case
    plan = plan_host("a", pool, flags, data, near, unit_limit=limit)
    if plan.fits or plan.budget.over != "a":
        return
    size = plan.budget.fitting_size_gb
    assert ("per rank would fit" in plan.budget.reason) == (size is not None), plan.budget.reason

    def fits(gb: int) -> bool:
        sized = {**flags, "hicache-ratio": False, "hicache-size": gb}
        return plan_host("a", pool, sized, data, near, unit_limit=limit).fits

    if size is not None:
        assert fits(int(size)) and not fits(int(size) + 1)
    else:
        assert not fits(1)
    offered = re.search(r"MemoryMax= of at least ([\d.]+) GiB", plan.budget.reason)
    if offered:  # only the unit's own limit can be raised, never past the host, and then it holds
        assert limit is not None and float(offered[1]) * GIB <= data["total"] + 0.1 * GIB
        raised = int(float(offered[1]) * GIB)
        assert plan_host("a", pool, flags, data, near, unit_limit=raised).fits


def test_a_unit_limit_that_binds_is_offered_raised() -> None:
    """--hicache-size 40 at TP 2 under the unit's own MemoryMax=64G on a 512 GiB host: the limit binds, and
    a MemoryMax= large enough holds the pools as asked."""
    data: HostMemoryData = {"total": 512 * GIB, "available": 500 * GIB, "hugepages_total": 0,
                            "hugepages_free": 0, "numa_nodes": 1, "cgroup": [], "siblings": {}}  # fmt: skip
    pool = RankPool(400_000, 40_960, 1)
    plan = plan_host("a", pool, {**ON, "hicache-size": 40, "tp-size": 2}, data, unit_limit=64 * GIB)
    assert not plan.fits and "MemoryMax= of at least" in plan.budget.reason, plan.budget.reason
    assert plan_host("a", pool, {**ON, "hicache-size": 40, "tp-size": 2}, data, unit_limit=RamShare(50)).fits


def test_the_search_finds_the_edge() -> None:
    assert largest_fitting_size(lambda s: s <= 37) == 37
    assert largest_fitting_size(lambda s: s <= 1) == 1
    assert largest_fitting_size(lambda s: False) is None


def test_a_unit_limit_under_which_no_pool_fits_is_named() -> None:
    """--hicache-size 100 under the unit's own MemoryMax=6G on a 22 GiB host (the real tier's case): no size
    fits under 6 GiB (SGLang keeps 10 GiB free) and no MemoryMax= on this host holds 100 GB: the refusal
    names the unit's limit as the thing to raise, not only "turn HiCache off"."""
    data: HostMemoryData = {"total": 22 * GIB, "available": 20 * GIB, "hugepages_total": 0,
                            "hugepages_free": 0, "numa_nodes": 1, "cgroup": [level(UNIT, 6 * GIB)],
                            "siblings": {}}  # fmt: skip
    pool = RankPool(16_384, 2_048, 1)
    plan = plan_host("a", pool, {**ON, "hicache-size": 100}, data, (), unit_limit=6 * GIB)
    assert not plan.fits
    assert "MemoryMax= (6.0 GiB)" in plan.budget.reason and "HiCache off" in plan.budget.reason, (
        plan.budget.reason
    )


def test_a_unit_limit_survives_a_copy_with_its_directive() -> None:
    """A plan's input is copied (deepcopy, pickle): the limit keeps its bytes and the directive that set it
    (a plan of a unit with its own MemoryMax= ended in an internal error)."""
    import copy
    import pickle

    from agent.plan.unitlimit import unit_memory_limit

    limit = unit_memory_limit(["MemoryMax=6G", "MemoryHigh=4G"])
    for again in (copy.copy(limit), copy.deepcopy(limit), pickle.loads(pickle.dumps(limit))):
        assert again == 4 * GIB and getattr(again, "key", None) == "MemoryHigh"
