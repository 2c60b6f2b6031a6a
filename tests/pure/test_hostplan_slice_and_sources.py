"""The host plan's inputs and outputs at its edges: the slice's limit over every service of the host, the
PD decode's default retraction-backup pool, the HiCache lines of a start's log, what the plan text says it
used without facts, and the draft / hybrid models whose host pools are not sized."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.hostplan import neighbour, plan_host, process_bytes
from agent.plan.hostpool import GIB, RankPool
from agent.protocol.answers import CgroupLevelData, HostMemoryData

GB = 10**9
ON = {"enable-hierarchical-cache": True}
POOL = RankPool(400_000, 131_072, 1)  # 52 GB of device KV per rank


def host(levels: list[CgroupLevelData], siblings: dict[str, int]) -> HostMemoryData:
    return {"total": 1024 * GIB, "available": 1000 * GIB, "hugepages_total": 0, "hugepages_free": 0,
            "numa_nodes": 1, "cgroup": levels, "siblings": siblings}  # fmt: skip


def level(path: str, limit: int | None, current: int = 0) -> CgroupLevelData:
    return {"path": path, "max": limit, "high": None, "current": current, "file": 0}


def test_the_slices_limit_bounds_the_budget_of_every_service_in_it() -> None:
    """system.slice's memory.max holds every service of the host: each 80 GB pool passes SGLang's own check
    in the slice alone, but the two together (with their processes) do not fit its 150 GiB."""
    levels = [level("system.slice/chat.service", None), level("system.slice", 150 * GIB)]
    later = neighbour("code", {**ON, "hicache-size": 80}, unit="code.service")
    plan = plan_host("chat", POOL, {**ON, "hicache-size": 80}, host(levels, {}), (later,))
    assert plan.pool.fits  # SGLang's check of this service alone
    assert not plan.fits and plan.budget.capacity <= 150 * GIB, plan.budget.reason
    assert "the slice's 150.0 GiB" in plan.budget.reason


def test_a_running_neighbour_in_the_slice_is_given_back_to_the_slice_once() -> None:
    """The slice's usage holds a running neighbour's pool: the budget counts it as the neighbour's need, so
    it is given back to the slice's room rather than counted twice."""
    held = 40 * GB + process_bytes(1)
    levels = [level("system.slice/chat.service", None), level("system.slice", 150 * GIB, held)]
    running = neighbour("code", {**ON, "hicache-size": 40}, unit="code.service")
    plan = plan_host(
        "chat", POOL, {**ON, "hicache-size": 40}, host(levels, {"code.service": held}), (running,)
    )
    assert plan.fits, plan.budget.reason
    assert plan.budget.capacity == 150 * GIB


def test_without_facts_the_text_says_the_units_own_limit_was_used() -> None:
    """No facts, but the unit's own MemoryMax=64G is SGLang's bound and the plan checked the pool under it:
    the text says so, not 'not read (no facts)'."""
    plan = plan_host("chat", POOL, {**ON, "hicache-size": 20}, None, unit_limit=64 * GIB)
    text = "\n".join(plan.lines(POOL.device_tokens, 32_000))
    assert "not read (no facts)" not in text
    assert "the unit's own MemoryMax=64.0G" in text, text
    assert plan.to_dict()["host_pool"]["unit_memory_max"] == 64 * GIB  # type: ignore[index]


def decode_facts(**flags: object) -> dict[str, object]:
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "examples/llama-3.1-8b-h100.json").read_text())
    data["flags"] = {**data.get("flags", {}), "disaggregation-mode": "decode", **flags}
    data["host_memory"] = {"total": 512 * GIB, "available": 500 * GIB, "hugepages_total": 0,
                           "hugepages_free": 0, "numa_nodes": 1, "cgroup": [], "siblings": {}}  # fmt: skip
    return data


def test_a_decodes_default_retraction_backup_pool_is_in_plan_json_and_text() -> None:
    """A PD decode without HiCache builds a host pool by default as its retraction backup
    (kv_cache_builder.py:199-258: host_pool for an MHA pool; ratio max(0.2, one request's tokens / device
    tokens), auto-sized): `plan --json` carries it in host_pool / host_budget, as the text says it."""
    plan = plan_from_facts(parse_facts(decode_facts()), Target(32_000))
    data = plan.to_dict()
    pool = data["host_pool"]
    assert isinstance(pool, dict) and pool["tokens"] > 0 and pool["backup"] == "decode-retraction"
    assert pool["hicache_size_gb"] is None  # SGLang's own auto size stays: nothing rendered, nothing gated
    device = plan.predicted_pool_tokens
    assert pool["tokens"] == int(device * max(0.2, (32_000 + 3) / device)) + 1
    budget = data["host_budget"]
    assert isinstance(budget, dict) and budget["verdict"] == "fits" and budget["pinned"] > pool["bytes"]
    assert any("retraction backup" in n for n in plan.notes), plan.notes
    assert not plan.host or not plan.host.flags()  # the unit keeps SGLang's default


def test_a_decode_that_backs_up_to_a_cpu_tensor_plans_no_host_pool() -> None:
    """The decode radix cache resolves the default backup to cpu_tensor (kv_cache_builder.py:233): no pool."""
    plan = plan_from_facts(parse_facts(decode_facts(**{"disaggregation-decode-enable-radix-cache": True})),
                           Target(32_000))  # fmt: skip
    assert "host_pool" not in plan.to_dict()


RATIO_2 = "[2026-12-06 02:09:32] Allocating kv hierarchical KV host pool: 32769 tokens, 0.02 GB host memory."
SIZE_1 = "[2026-12-06 02:10:48] Allocating kv hierarchical KV host pool: 1953126 tokens, 1.00 GB host memory."
AUTO = (
    "[2026-12-06 02:09:31] HiCache auto-sizing: ratio 2.000 -> 1.500; 3.0 GiB host memory per rank "
    "(fraction 0.80, 1 ranks on this host), host pools 0.0 GiB."
)


def logged_plan(*lines: str):  # type: ignore[no-untyped-def]
    from agent.sglang.logs.summary import SummaryBuilder
    from tests.pure.test_cpu_plan import cpu_facts

    b = SummaryBuilder()
    for line in lines:
        b.feed(line)
    inp = parse_facts(cpu_facts(), name="tiny")
    inp = replace(inp, flags={**inp.flags, **ON, "hicache-ratio": 2.0}, starts=(b.summary().to_dict(),))
    return plan_from_facts(inp, Target(4096))


def test_the_logged_host_pool_is_the_plans_evidence() -> None:
    """`plan --from-log`: the start's `Allocating ... host pool` line is what that start pinned; the plan
    carries it (JSON host_pool.logged) and says whether its own pool is the same, and the auto-size line's
    ratio where logged."""
    plan = logged_plan(AUTO, RATIO_2)
    pool = plan.to_dict()["host_pool"]
    assert isinstance(pool, dict)
    assert pool["logged"] == {"tokens": 32769, "gb": 0.02, "auto_ratio": 1.5, "requested_ratio": 2.0}
    assert any("the logged start pinned 32,769 host-pool tokens" in n and "the same" in n for n in plan.notes)


def test_a_logged_host_pool_that_differs_is_said() -> None:
    plan = logged_plan(SIZE_1)
    assert any("the logged start pinned 1,953,126" in n and "this plan's 32,769" in n for n in plan.warnings)


def example(name: str, **flags: object) -> dict[str, object]:
    data = json.loads((Path(__file__).resolve().parents[2] / "examples" / name).read_text())
    data["flags"] = {**data.get("flags", {}), **ON, **flags}
    return data


def test_hicache_with_a_draft_model_is_refused_in_one_line() -> None:
    """A speculative draft's host KV is fused, packed into the target's pages or a sidecar pool
    (speculative/base_spec_worker.py:269-341), counted in SGLang's auto size (hicache_auto_size.py:62-79):
    deployctl does not size it, so HiCache with a draft model is refused, not left unplanned."""
    plan = plan_from_facts(parse_facts(example("ct200.json")), Target(32_000))
    assert not plan.feasible
    assert plan.binding.startswith("HiCache with a speculative draft model"), plan.binding
    assert "base_spec_worker.py" in plan.binding and "\n" not in plan.binding


def test_hicache_with_a_linear_attention_model_is_refused_in_one_line() -> None:
    from tests.pure.facts_fixtures import QWEN3_NEXT

    data = example("llama-3.1-8b-h100.json")
    data["model"] = {**data["model"], "config": QWEN3_NEXT}  # type: ignore[dict-item]
    plan = plan_from_facts(parse_facts(data), Target(32_000))
    assert not plan.feasible
    assert plan.binding.startswith("HiCache with a hybrid model"), plan.binding
    assert "pool_host/mamba.py" in plan.binding
