"""The HiCache host side of a plan: the pool per rank rendered as an explicit --hicache-size with its
MemoryMax=, the host's budget (refusal, neighbours, pre-warm) and what `plan --json` carries."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.inventory import load_host
from agent.plan.choose import Target
from agent.plan.facts import load_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.hostbudget import Verdict
from agent.plan.hostplan import memory_max_of, neighbour, plan_host, process_bytes
from agent.plan.hostpool import GIB, HiCacheFlags, HostMemory, RankPool, plan_host_pool
from agent.protocol.answers import HostMemoryData
from agent.render import render_unit, template_dir

ROOT = Path(__file__).resolve().parents[2]
ON = {"enable-hierarchical-cache": True}


def memory(total_gib: float, available_gib: float, cgroup: list | None = None) -> HostMemoryData:  # type: ignore[type-arg]
    return {
        "total": int(total_gib * GIB),
        "available": int(available_gib * GIB),
        "hugepages_total": 0,
        "hugepages_free": 0,
        "numa_nodes": 1,
        "cgroup": cgroup or [],
    }


POOLS = st.builds(
    RankPool,
    st.integers(1_000, 2_000_000),
    st.sampled_from([16_384, 70_272, 131_072, 163_840]),
    st.sampled_from([1, 16, 64]),
)


@settings(max_examples=60, deadline=None)
@given(POOLS, st.sampled_from([1, 2, 4, 8]), st.sampled_from([None, 1.0, 2.0, 3.5]))
def test_the_rendered_size_and_memory_max_are_the_plans(pool: RankPool, tp: int, ratio: float | None) -> None:
    """The unit gets the plan's --hicache-size and MemoryMax=, and that size builds the planned pool to the
    token in SGLang's own rule; under that MemoryMax= SGLang's check passes for every rank."""
    flags = {**ON, "tp-size": tp, **({"hicache-ratio": ratio} if ratio else {})}
    host = plan_host("svc", pool, flags, memory(2**20, 2**20))  # a host no pool here reaches
    if host.size_gb is None:  # a pool under 1 GB: no whole-GB size holds it
        assert host.given.bytes < 1e9
        return
    built = plan_host_pool(pool, HiCacheFlags(size_gb=host.size_gb), HostMemory(10**15), tp)
    assert built.tokens == host.pool.tokens and built.bytes == host.pool.bytes
    assert host.pool.bytes <= host.given.bytes  # floored to whole GB, never above what the flags asked
    text = render_unit(load_host("ct200", ROOT / "units"), {**flags, **host.flags()}, template_dir())
    assert re.search(rf"--hicache-size {int(host.size_gb)}\b", text)
    assert "--hicache-ratio" not in text and "--hicache-host-memory-fraction" not in text  # the size alone
    assert f"MemoryMax={host.memory_max // 2**20}M\n" in text and host.memory_max == memory_max_of(
        host.flags() | flags
    )
    # SGLang's per-rank check against the unit's own MemoryMax= (the last rank sees the others pinned)
    assert host.memory_max is not None
    room = (host.memory_max - 6 * GIB - 4 * GIB * (tp - 1) - 10 * GIB - (tp - 1) * host.pool.bytes) // tp
    assert host.pool.bytes <= room


def test_no_hicache_no_host_side() -> None:
    inp = load_facts(ROOT / "examples/llama-3.1-8b-h100.json")
    plan = plan_from_facts(inp, Target(32_000))
    assert plan.host is None and "hicache-size" not in plan.flags()
    assert "host_pool" not in plan.to_dict()
    text = render_unit(load_host("ct200", ROOT / "units"), plan.flags(), template_dir())
    assert "MemoryMax=" not in text


def _plan(mem: HostMemoryData | None, **flags: object):  # type: ignore[no-untyped-def]
    inp = load_facts(ROOT / "examples/llama-3.1-8b-h100.json")
    inp = replace(inp, flags={**inp.flags, **ON, **flags}, host_memory=mem)
    return plan_from_facts(inp, Target(32_000))


def test_plan_json_carries_the_host_pool_and_budget() -> None:
    plan = _plan(memory(512, 480))
    data = plan.to_dict()
    pool, budget = data["host_pool"], data["host_budget"]
    assert isinstance(pool, dict) and isinstance(budget, dict)
    assert plan.host is not None and pool["tokens"] == plan.host.pool.tokens and pool["checked"] is True
    assert plan.flags()["hicache-size"] == pool["hicache_size_gb"] and budget["verdict"] == "fits"
    assert any(n.startswith("HiCache: device pool") and "context" in n for n in plan.notes)


def test_a_host_too_small_refuses_naming_the_service_and_the_size_that_fits() -> None:
    """Ratio 2 of a ~54 GB device pool asks ~108 GB per rank; a 96 GiB host cannot: the plan is not
    feasible (apply refuses it before any restart) and the size it names does fit."""
    tight = memory(96, 90)
    plan = _plan(tight, **{"hicache-ratio": 2.0})
    assert not plan.feasible and plan.host is not None and not plan.host.fits
    assert (
        plan.binding is not None and "--hicache-size" in plan.binding and "per rank would fit" in plan.binding
    )
    assert plan.binding.startswith(plan.host.budget.over or "?")
    size = plan.host.budget.fitting_size_gb
    assert size is not None and size == int(size)
    again = _plan(tight, **{"hicache-size": int(size)})
    assert again.feasible and again.host is not None and again.host.fits and again.host.size_gb == size


def test_auto_shrinks_to_the_host_and_fits() -> None:
    plan = _plan(memory(96, 90))  # no ratio, no size: SGLang's auto fraction
    assert plan.feasible and plan.host is not None and plan.host.given.mode.value == "auto"
    assert plan.host.budget.pinned <= plan.host.budget.capacity


def test_a_neighbours_pools_count_on_the_same_host() -> None:
    mem = memory(256, 240)
    alone = _plan(mem, **{"hicache-size": 100})
    assert alone.feasible
    other = neighbour("gpu7-small", {**ON, "hicache-size": 70, "tp-size": 2})
    assert other is not None and other.pool_bytes == 140 * 10**9
    inp = load_facts(ROOT / "examples/llama-3.1-8b-h100.json")
    inp = replace(inp, flags={**inp.flags, **ON, "hicache-size": 100}, host_memory=mem, neighbours=(other,))
    shared = plan_from_facts(inp, Target(32_000))
    assert not shared.feasible and shared.host is not None and shared.host.budget.over == inp.name
    plain = neighbour("x", {"tp-size": 2})  # no HiCache: no host pool, its processes count
    assert plain.pool_bytes == 0 and plain.pinned == process_bytes(2) and not plain.pins_pool


def test_a_checkpoint_that_cannot_stay_cached_is_a_warning_not_a_refusal() -> None:
    inp = load_facts(ROOT / "examples/llama-3.1-8b-h100.json")
    assert inp.model.weights_bytes
    # room for the pool, not for the pool and the checkpoint beside it
    total = (100 * 10**9 + 6 * GIB + 8 * GIB + inp.model.weights_bytes // 2) / GIB + 1
    plan = _plan(memory(total, total), **{"hicache-size": 100})
    assert plan.feasible and plan.host is not None
    assert plan.host.budget.verdict is Verdict.PREWARM_SKIPPED
    assert any("pre-warm skipped" in w for w in plan.warnings)


def _service(folder: Path, name: str, target: str, index: int, flags: str) -> None:
    (folder / f"{name}.toml").write_text(
        f'[ssh]\ntarget = "{target}"\n[gpus]\nindices = [{index}]\nmemory_gib = 79.6\nname = "NVIDIA H100"\n'
        '[model]\npath = "/models/m"\nattention = "gqa"\nlayers = 32\nkv_heads = 8\nhead_dim = 128\n'
        f'dtype_bytes = 2\nweights_gib_per_gpu = 15\n[unit]\nname = "sglang-{name}.service"\n'
        f"[sglang]\nport = {30000 + index}\n[sglang.flags]\n{flags}\n"
    )


def test_the_neighbours_are_the_inventorys_services_of_the_same_host(tmp_path: Path) -> None:
    from agent.inventory import load_service
    from agent.plan.hostwire import neighbours

    _service(tmp_path, "a", "gpu7", 0, "enable-hierarchical-cache = true")
    _service(tmp_path, "b", "gpu7", 1, "enable-hierarchical-cache = true\nhicache-size = 30")
    _service(tmp_path, "c", "gpu7", 2, "")  # no HiCache: its processes only
    _service(tmp_path, "d", "gpu8", 0, "enable-hierarchical-cache = true\nhicache-size = 50")  # another host
    near = neighbours(load_service("a", tmp_path), tmp_path)
    assert [(n.name, n.pool_bytes) for n in near] == [("b", 30 * 10**9), ("c", 0)]
    assert near[1].pinned == process_bytes(1)
