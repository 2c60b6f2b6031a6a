"""Review of the host-memory plan (HiCache's host pool, the weight-cache daemon, the page cache for pre-warm,
every service of a host): each finding is a strict xfail that asserts the correct behaviour and fails on
today's code. SGLang 0.5.23's lines are cited where arithmetic is concerned (sglang/ of its package)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.errors import UsageError
from agent.host import hostmem
from agent.host.change import pinning
from agent.host.lock import UnitLock
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.hostbudget import RamShare
from agent.plan.hostplan import (
    last_rank_sees,
    memory_at_start,
    memory_max_of,
    neighbour,
    plan_host,
    process_bytes,
    sets_memory_max,
    unit_memory_limit,
)
from agent.plan.hostpool import GIB, CgroupLevel, HiCacheFlags, HostMemory, RankPool, plan_host_pool
from agent.protocol.answers import HostMemoryData
from agent.protocol.requests import Group
from tests.pure.txnfakes import UNIT, Host, Script, unit_text

ROOT = Path(__file__).resolve().parents[2]
GB = 10**9
ON = {"enable-hierarchical-cache": True}
NO_DRAFT = (("speculative-algorithm", False), ("speculative-draft-model-path", False))


def memory(total: int, available: int, siblings: dict[str, int] | None = None) -> HostMemoryData:
    data: HostMemoryData = {"total": total, "available": available, "hugepages_total": 0, "hugepages_free": 0,
                            "numa_nodes": 1, "cgroup": []}  # fmt: skip
    if siblings is not None:
        data["siblings"] = siblings
    return data


def _ct200(host_memory: HostMemoryData, model_facts: bool = True) -> tuple[Any, dict[str, Any]]:
    """The seed host (Kimi K2.6, TP 8) without its draft, and its facts with `host_memory`."""
    from agent.inventory import load_service

    host = load_service("ct200", ROOT / "units")
    facts: dict[str, Any] = {"flags": dict(host.sglang.flags), "host_memory": host_memory}
    if model_facts:
        facts["model_facts"] = json.loads((ROOT / "examples/ct200.json").read_text())
    return host, facts


# ---------------------------------------------------------------------------------------------------- high


def test_dsa_host_pool_is_sglangs_mla_pool_plus_its_indexer_pool() -> None:
    """DeepSeek V3.2 (DSA), TP 8, --hicache-size 100. SGLang's KV host pool is MLA: size_per_token =
    kv_cache_dim x dtype x layers = 576 x 2 x 61 = 70,272 (srt/mem_cache/pool_host/mla.py:195-197; the
    index keys join it only in the page_first_kv_split layout, mla.py:199-205, the default being page_first,
    srt/arg_groups/fields/memory.py:135-147), so 100e9 // 70,272 = 1,423,042 tokens, + one page of 64 =
    1,423,104 (pool_host/base.py:221-229). The index keys get a host pool of their own, the same tokens at
    (128 + 4) x 61 = 8,052 bytes (memory_pool.py:5393-5402, pool_host/dsa.py:113-136,199-203), allocated
    and checked on its own (dsa.py:222-243): 11.46 GB per rank beyond the 100 GB. The plan says 1,276,800
    tokens of 100 GB (78,324 bytes per token), so the gate's token check fails on every start, and the
    MemoryMax= it renders for 100 GB pools has SGLang's last rank refuse the pool after the restart."""
    config = json.loads((ROOT / "tests/data/models/deepseek-v3.2/config.json").read_text())
    h200 = {"name": "NVIDIA H200", "memory_total_mib": 143771, "compute_capability": "9.0"}
    doc = {"format": "deployctl-facts/1", "gpus": [h200] * 8, "sglang": {"version": "0.5.23"},
           "model": {"config": config, "weights_bytes": int(690e9)},
           "flags": {"tp-size": 8, **ON, "hicache-size": 100}}  # fmt: skip
    inp = replace(parse_facts(doc, name="dsa"), host_memory=memory(2048 * GIB, 2000 * GIB, {}))
    plan = plan_from_facts(inp, Target(32768))
    if not plan.feasible:  # refusing HiCache for a DSA model (as for a hybrid one) is also correct
        assert "indexer host pool" in plan.binding, plan.binding
        return
    assert plan.host is not None and plan.host.page_size == 64
    kv_tokens = (100 * GB // 70_272 // 64 + 1) * 64
    assert plan.host.pool.tokens == kv_tokens == 1_423_104  # the `Allocating kv ... host pool` line's
    assert plan.host.pool.bytes >= kv_tokens * (70_272 + 8_052)  # the KV pool and the indexer pool


def test_cpu_offload_is_inside_memory_max_and_the_budget() -> None:
    """SGLang offloads up to cpu_offload_gb x 1024**3 bytes of weights per rank into host memory
    (srt/utils/offloader.py:69-71). A HiCache unit with --hicache-size 20, TP 2 and --cpu-offload-gb 40 gets
    MemoryMax=76.6G today, while its two ranks hold 80 GiB of offloaded weights before any pool: the
    kernel kills it at load. MemoryMax= must hold the offloaded weights, and the host budget count them."""
    flags = {**ON, "hicache-size": 20, "tp-size": 2}
    plain, offload = memory_max_of(flags), memory_max_of({**flags, "cpu-offload-gb": 40})
    assert plain is not None and offload is not None
    assert offload >= plain + 2 * 40 * GIB
    pool = RankPool(400_000, 40_960, 1)
    with_offload = plan_host("a", pool, {**flags, "cpu-offload-gb": 40}, memory(256 * GIB, 250 * GIB, {}))
    without = plan_host("a", pool, flags, memory(256 * GIB, 250 * GIB, {}))
    assert with_offload.budget.pinned >= without.budget.pinned + 2 * 40 * GIB
    # a neighbour's offloaded weights are pinned host memory too
    assert neighbour("n", {"cpu-offload-gb": 40, "tp-size": 2}).pinned >= 2 * 40 * GIB


def test_a_rendered_size_passes_sglangs_check_whichever_service_of_the_host_starts_first() -> None:
    """Host of 512 GiB (500 available). A (TP 8, SGLang's auto default) is planned while B (TP 8,
    --hicache-size 10) is stopped: A gets --hicache-size 32. systemd does not order the two (no After=, and
    the host's memory lock is deployctl's, not systemd's): at boot, or when Restart=on-failure restarts A
    while B runs, B has pinned first. A's last rank then sees (free - 7 x 32 GB - 10 GiB) // 8 = 18.6 GB
    < 32 GB and SGLang refuses (pool_host/base.py:104-108,248-257), every 30 s, for good. The size must
    pass SGLang's check in either order (both fit the host together)."""
    pool = RankPool(400_000, 40_960, 1)
    total, avail = 512 * GIB, 500 * GIB
    b = neighbour("b", {**ON, "tp-size": 8, "hicache-size": 10}, unit="b.service")
    a = plan_host("a", pool, {**ON, "tp-size": 8}, memory(total, avail, {}), (b,))
    assert a.fits and a.size_gb is not None
    held_b = process_bytes(8) + 10 * GB * 8  # B started first and pinned
    seen = memory_at_start(memory(total, avail - held_b, {"b.service": held_b}), 8, a.memory_max)
    last = last_rank_sees(seen, 8, a.pool.bytes)
    assert plan_host_pool(pool, HiCacheFlags(size_gb=a.size_gb), last, 8).fits


def test_force_does_not_bypass_the_host_memory_refusal() -> None:
    """--force is for the device fraction ('try the highest safe fraction anyway'); a plan refused by the
    host's memory (--hicache-size 500 x 8 ranks on a 256 GiB host: SGLang's own 'Not enough host memory'
    for each rank) must still be refused before any restart, forced or not."""
    from agent.apply import make_plan, prepare
    from agent.orchestrate.asked import Change
    from agent.output import Output

    host, facts = _ct200(memory(256 * GIB, 240 * GIB, {}))
    flags = (*ON.items(), ("hicache-size", 500), *NO_DRAFT)
    plan = make_plan(host, Change(context=32768, flags=flags), facts)  # type: ignore[arg-type]
    assert not plan.feasible and plan.host is not None and not plan.host.fits  # refused by host memory
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(UsageError) as refused:
        prepare(out, host, Change(context=32768, flags=flags, force=True, dry_run=True), facts)  # type: ignore[arg-type]
    assert "--ignore-host-memory" in (refused.value.hint or "")  # the distinct override, named with its risk
    ignored = Change(context=32768, flags=flags, dry_run=True, ignore_host_memory=True)
    assert prepare(out, host, ignored, facts) is None  # type: ignore[arg-type]  # a dry run, past the refusal


# -------------------------------------------------------------------------------------------------- medium


def test_a_stopped_units_plan_is_sized_under_its_slices_limit(tmp_path: Path) -> None:
    """system.slice has MemoryMax=64G; sglang-a.service is stopped (systemd removed its cgroup) or not
    installed yet. It will start in system.slice (the template sets no Slice=), and SGLang reads every
    level of its cgroup, the slice's memory.max too (srt/mem_cache/host_memory.py:83-125), so
    --hicache-size 100 is refused by SGLang at start. The plan must size (or refuse) under the slice."""
    (tmp_path / "system.slice").mkdir()
    files = {"memory.max": str(64 * GIB), "memory.high": "max", "memory.current": str(2 * GIB),
             "memory.stat": "anon 2147483648\nactive_file 0\ninactive_file 0\n"}  # fmt: skip
    for name, text in files.items():
        (tmp_path / "system.slice" / name).write_text(text)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       268435456 kB\nMemAvailable:   251658240 kB\n")  # 256 / 240 GiB
    data = hostmem.collect("sglang-a.service", str(tmp_path), str(meminfo), str(tmp_path))
    assert data is not None
    pool = RankPool(400_000, 40_960, 1)
    plan = plan_host("a", pool, {**ON, "hicache-size": 100}, data)
    # what SGLang sees at the start: the slice's 64 GiB, with the slice's usage and the service's processes
    seen = HostMemory(240 * GIB, (CgroupLevel((64 * GIB,), 2 * GIB + process_bytes(1), 0),))
    sglang = plan_host_pool(pool, HiCacheFlags(size_gb=100), seen, 1)
    assert not sglang.fits
    assert not plan.fits


def test_host_memory_is_checked_when_the_host_gave_no_config_json() -> None:
    """The host's facts carry host_memory (256 GiB) but no model_facts (config.json not readable there):
    --hicache-size 500 x 8 ranks is still far beyond the host and must be refused before the restart."""
    from agent.apply import make_plan
    from agent.orchestrate.asked import Change

    host, facts = _ct200(memory(256 * GIB, 240 * GIB, {}), model_facts=False)
    flags = (*ON.items(), ("hicache-size", 500), *NO_DRAFT)
    plan = make_plan(host, Change(context=32768, flags=flags), facts)  # type: ignore[arg-type]
    assert plan.host is not None
    assert plan.host.checked and not plan.feasible


def test_a_decode_neighbours_explicit_backup_size_is_counted() -> None:
    """A decode without HiCache builds its retraction backup host pool by default (MHA), sized by an explicit
    --hicache-size when given (kv_cache_builder.py:244-258: the ratio is set but the size wins,
    pool_host/base.py:221-224): 40 GB x 4 ranks. Stopped now, it pins 160 GB at its start; planning a
    HiCache neighbour of 20 GB x 4 on a 256 GiB host must count it (as an explicit HiCache size is)."""
    dec = neighbour("dec", {"disaggregation-mode": "decode", "hicache-size": 40, "tp-size": 4},
                    unit="sglang-dec.service")  # fmt: skip
    pool = RankPool(400_000, 40_960, 1)
    chat = plan_host("chat", pool, {**ON, "hicache-size": 20, "tp-size": 4}, memory(256 * GIB, 248 * GIB, {}),
                     (dec,))  # fmt: skip
    assert not chat.fits  # 80 + 160 GB of pools, 36 GiB of processes and 8 GiB headroom > 248 GiB


def test_a_group_node_that_pins_waits_for_the_hosts_memory_lock(tmp_path: Path) -> None:
    """The group's machine orders its own roles (prefills, then decodes), not the host's other services:
    a decode node (default retraction backup pool, kv_cache_builder.py:228-241) or a HiCache node started
    while another service's HiCache change holds the host's lock pins at once (sglang#38156)."""
    on = unit_text(200_000).replace("--context-length", "--enable-hierarchical-cache --context-length")
    old = on.replace("200000", "100000")
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, old)
    other = UnitLock(host.root / "run/deployctl", pinning.LOCK_NAME)
    other.acquire({"pid": 4242, "unit": "code.service", "verb": "apply", "txn": "t-other"})
    t = host.transaction(host.request(200_000, unit_text=on, group=Group(0, 2, 60.0)))
    t.ports.wait = lambda s: other.release()
    with pinning.one_start_at_a_time(t.ports, old, on) as locked:
        holder = other.holder().get("unit") if other.is_held() else None
    assert locked is not None or holder == UNIT  # waited its turn (then held it), or stopped LOCKED


@pytest.mark.parametrize("value, percent", [("12.25%", 12.25), ("125‰", 12.5)])
def test_systemd_percentages_with_hundredths_and_permille_are_read(value: str, percent: float) -> None:
    """systemd's config_parse_memory_limit tries parse_permyriad first (src/basic/percent-util.c: N%, N.N%,
    N.NN%, N‰, N.N‰, N‱), then parse_size. A limit systemd applies must be the one the plan sizes under,
    and the rendered MemoryMax= left out beside it."""
    assert unit_memory_limit([f"MemoryMax={value}"]) == RamShare(percent)
    assert sets_memory_max([f"MemoryMax={value}"])


def test_a_prewarm_the_plan_skips_is_not_requested() -> None:
    """Kimi K2.6 (605 GB checkpoint) with --hicache-size 60 x 8 on a 1 TiB host: the budget's verdict is
    'fits, pre-warm skipped', and the issue's rule is that pre-warm is then skipped (and the restart
    estimate says so); the request sent to the host must not ask for it."""
    from agent.apply import make_plan, prepare
    from agent.orchestrate.asked import Change
    from agent.output import Output
    from agent.plan.hostbudget import Verdict

    host, facts = _ct200(memory(1024 * GIB, 1000 * GIB, {}))
    flags = (*ON.items(), ("hicache-size", 60), *NO_DRAFT)
    plan = make_plan(host, Change(context=32768, flags=flags), facts)  # type: ignore[arg-type]
    assert plan.host is not None and plan.host.budget.verdict is Verdict.PREWARM_SKIPPED
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    prepared = prepare(out, host, Change(context=32768, flags=flags), facts)  # type: ignore[arg-type]
    assert prepared is not None
    assert not prepared.request.prewarm


def test_the_running_units_memory_high_stays_in_the_plan() -> None:
    """deployctl never renders MemoryHigh=, so a memory.high on the running unit's own cgroup comes from the
    unit's own lines or a drop-in (`systemctl set-property sglang.service MemoryHigh=50G` writes one under
    /etc/systemd/system.control, which outranks the unit file): it survives the new unit. SGLang bounds its
    headroom by memory.high as by memory.max (srt/mem_cache/host_memory.py:83-125), so --hicache-size 100
    is refused after the restart; memory_at_start replaces the level's limits by the rendered MemoryMax=."""
    unit = {"path": "system.slice/sglang.service", "max": None, "high": 50 * GIB, "current": 8 * GIB,
            "file": 1 * GIB}  # fmt: skip
    top = {"path": "system.slice", "max": None, "high": None, "current": 20 * GIB, "file": 5 * GIB}
    data: HostMemoryData = {"total": 512 * GIB, "available": 400 * GIB, "hugepages_total": 0,
                            "hugepages_free": 0, "numa_nodes": 1, "cgroup": [unit, top],  # type: ignore[list-item]
                            "siblings": {}}  # fmt: skip
    plan = plan_host("a", RankPool(400_000, 40_960, 1), {**ON, "hicache-size": 100}, data)
    assert not plan.fits


def test_a_pd_neighbour_counts_its_roles(tmp_path: Path) -> None:
    """pd-1p1d (a prefill and a decode, each TP 1, units llama-pd-prefill-0.service and
    llama-pd-decode-0.service) shares host gpu-pd with a HiCache service. neighbours() gives one
    ServiceNeed of 1 rank, no pool, unit llama-pd.service (a name no unit runs under): the decode's
    default retraction backup pool (kv_cache_builder.py:228-258) and the second engine are not counted."""
    from agent.inventory import load_service
    from agent.plan.hostwire import neighbours

    pd = (ROOT / "units/pd-1p1d.toml").read_text()
    pd = pd.replace("indices = [0, 1]", "indices = [8, 9]").replace("gpus = [0]", "gpus = [8]")
    (tmp_path / "pd-1p1d.toml").write_text(pd.replace("gpus = [1]", "gpus = [9]"))
    chat = (ROOT / "units/ct200.toml").read_text().replace('target = "ct200"', 'target = "gpu-pd"')
    (tmp_path / "chat.toml").write_text(chat.replace("port = 30000", "port = 31000"))
    near = neighbours(load_service("chat", tmp_path), tmp_path)
    assert sum(n.ranks for n in near) >= 2  # the prefill's rank and the decode's
    assert any(n.pins_pool for n in near)  # the decode's retraction backup pool
    assert {n.unit for n in near} >= {"llama-pd-decode-0.service"}


# ----------------------------------------------------------------------------------------------------- low


def test_a_huge_ratio_is_refused_in_one_line() -> None:
    """`deployctl plan --facts ... --set hicache-ratio=1e308` prints 'internal error: OverflowError'; the
    table accepts the number (finite), so the planner must refuse it (or call the pool unfit)."""
    pool = RankPool(400_000, 40_960, 1)
    try:
        plan = plan_host("a", pool, {**ON, "hicache-ratio": "1e308"}, memory(256 * GIB, 240 * GIB, {}))
    except UsageError:
        return
    assert not plan.fits


@pytest.mark.xfail(
    strict=True,
    reason="NOT FIXED: MemoryMax= bounds a pool's padding page at 256 MiB (POOL_PAD: the unit renderer knows "
    "no bytes per token); with a larger page the plan refuses its own MemoryMax= for most sizes (the size "
    "it offers is one it accepts)",
)
def test_a_large_page_does_not_make_the_plan_refuse_its_own_memory_max() -> None:
    """A pool is size * 1e9 // bytes per token tokens plus one page (pool_host/base.py:221-229): with
    --page-size 1024 and 327,680 bytes per token (Llama 3.1 70B at TP 1, bf16) the page is 335.5 MB, so
    --hicache-size 100 pins 100.33 GB. memory_max_of adds 256 MiB, the plan then checks SGLang's rule under
    that MemoryMax= and refuses on a 2 TiB host, offering 99, which it refuses the same way."""
    pool = RankPool(400_000, 327_680, 1024)
    plan = plan_host("a", pool, {**ON, "hicache-size": 100}, memory(2048 * GIB, 2000 * GIB, {}))
    assert plan.fits, plan.budget.reason


def test_a_unit_in_a_nested_slice_has_its_slice_limits_read(tmp_path: Path) -> None:
    """systemd nests a dashed slice under its prefixes: Slice=gpu-sglang-prod.slice lives at
    gpu.slice/gpu-sglang.slice/gpu-sglang-prod.slice (systemd.slice(5)); SGLang reads every level of the
    running process's cgroup (srt/mem_cache/host_memory.py:83-125)."""
    place = tmp_path / "gpu.slice/gpu-sglang.slice/gpu-sglang-prod.slice/sglang.service"
    place.mkdir(parents=True)
    for level, limit in ((tmp_path / "gpu.slice", str(64 * GIB)), (place, "max")):
        (level / "memory.max").write_text(limit)
        (level / "memory.current").write_text(str(GIB))
        (level / "memory.stat").write_text("anon 1073741824\n")
    for mid in (place.parent, place.parent.parent):
        (mid / "memory.max").write_text("max")
        (mid / "memory.current").write_text(str(GIB))
        (mid / "memory.stat").write_text("")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       268435456 kB\nMemAvailable:   251658240 kB\n")
    data = hostmem.collect("sglang.service", str(tmp_path), str(meminfo), str(tmp_path))
    assert data is not None
    assert any(lv["max"] == 64 * GIB for lv in data["cgroup"])


def test_the_metrics_carry_the_host_budget_used() -> None:
    """The issue's 'Report and metrics: host pool tokens and GB per service, the host budget used': the
    textfile has deployctl_host_pool_tokens/_gigabytes and the planned pool, no figure of the budget."""
    import re

    from agent.host.metrics import Run, prom_text
    from agent.protocol.events import Outcome

    # the budget's figures reach the Run as the plan's planned_host_pool does (Request -> runner data)
    run = Run("h", UNIT, Outcome.APPLIED, 0.0, host_pool_tokens=781_251, host_pool_gb=32.0,
              planned_host_pool=781_251, host_budget_pinned=300 * GIB,
              host_budget_capacity=500 * GIB)  # fmt: skip
    text = prom_text(run, 0, None)
    assert re.search(r"^deployctl_host_(memory|budget)\w*", text, re.M), text


def test_the_size_a_refusal_offers_is_accepted_when_given() -> None:
    """TP 2, --hicache-size 54 on a 128 GiB host (120 GiB available): refused, offering 53, the first
    rank's (free - 10 GiB) // 2 (pool_host/base.py:104-108). SGLang checks each rank against free memory
    read afresh (base.py:248-257), so with 53 the second rank sees 27.19 GB and the plan refuses 53 too,
    offering 27: the fix must already be divided by pools + ranks - 1, as the rendered size is."""
    pool = RankPool(400_000, 40_960, 1)
    flags = {**ON, "hicache-size": 54, "tp-size": 2}
    refused = plan_host("a", pool, flags, memory(128 * GIB, 120 * GIB, {}))
    assert not refused.fits and refused.budget.fitting_size_gb is not None
    fix = int(refused.budget.fitting_size_gb)
    again = plan_host("a", pool, {**flags, "hicache-size": fix}, memory(128 * GIB, 120 * GIB, {}))
    assert again.fits, again.budget.reason


def test_a_refusal_does_not_offer_a_memory_max_beyond_the_host() -> None:
    """TP 2, --hicache-size 54 on a 128 GiB host: the pool is refused by the host's free memory (SGLang's
    check, not the unit's limit), and the fix adds 'or a MemoryMax= of at least 170.9 GiB', which no limit
    on a 128 GiB host can be: raising MemoryMax= does not add RAM."""
    import re

    pool = RankPool(400_000, 40_960, 1)
    refused = plan_host("a", pool, {**ON, "hicache-size": 54, "tp-size": 2}, memory(128 * GIB, 120 * GIB, {}))
    assert not refused.fits
    offered = re.search(r"MemoryMax= of at least ([\d.]+) GiB", refused.budget.reason)
    assert offered is None or float(offered[1]) <= 128


def test_a_rocm_decode_builds_no_retraction_backup_pool() -> None:
    """SGLang resolves the decode's default backup to host_pool only `and not is_hip()`
    (srt/mem_cache/kv_cache_builder.py:228-241): on an MI300X it is cpu_tensor, no host pool, no
    auto-size line. hostwire.backup_server never sets DecodeServer.rocm, so the plan says a host pool of
    228,230 tokens per rank and the budget counts it."""
    config = json.loads((ROOT / "tests/data/models/llama-3.1-8b/config.json").read_text())
    mi300x = {"name": "AMD Instinct MI300X", "memory_total_mib": 196592}
    doc = {"format": "deployctl-facts/1", "gpus": [mi300x], "sglang": {"version": "0.5.23"},
           "model": {"config": config, "weights_bytes": int(16e9)},
           "flags": {"tp-size": 1, "disaggregation-mode": "decode"}}  # fmt: skip
    inp = replace(parse_facts(doc, name="rocm"), host_memory=memory(1024 * GIB, 1000 * GIB, {}))
    plan = plan_from_facts(inp, Target(32768))
    assert plan.host is None or plan.host.pool.tokens == 0


def test_hicache_prefills_of_one_pd_host_are_sized_not_left_to_auto(tmp_path: Path) -> None:
    """Two prefills (GPUs 0 and 2) and a decode of one host, HiCache on both prefills. The group starts
    every prefill at once (group/run.py waves: prefills 0), each SGLang auto-sizes 0.8 of the same free
    memory (hicache_auto_size.py:90-97, per process: its own ranks only) and pins it: 1.6x what the host
    has free, the double booking the issue cites (sglang#38156). Each prefill needs an explicit
    --hicache-size budgeted with the other (or the plan refuses)."""
    from agent.inventory import load_service
    from agent.pd.plan import role_plans

    pd = (ROOT / "units/pd-1p1d.toml").read_text().replace("indices = [0, 1]", "indices = [0, 1, 2]")
    one = "flags = { tp-size = 1, chunked-prefill-size = 8192 }"
    on = "flags = { tp-size = 1, chunked-prefill-size = 8192, enable-hierarchical-cache = true }"
    second = f"\n\n[[pd.prefill]]\ngpus = [2]\nport = 30011\nbootstrap_port = 8999\n{on}"
    (tmp_path / "pd-1p1d.toml").write_text(pd.replace(one, on + second))
    plans = role_plans(load_service("pd-1p1d", tmp_path), 32768)
    prefills = [r.plan for r in plans if "prefill" in r.unit.host.unit.name]
    assert len(prefills) == 2
    assert all(p.host is not None and (p.host.size_gb is not None or not p.feasible) for p in prefills)


def test_the_host_budget_reaches_the_metrics_from_the_plan() -> None:
    """The plan's budget rides the apply request (as planned_host_pool does) into the metrics' Run."""
    from agent.apply import make_plan, planned_pools
    from agent.host.metrics import run_from
    from agent.orchestrate.asked import Change
    from agent.protocol.events import Outcome
    from agent.remote.client import base_request

    host, facts = _ct200(memory(1024 * GIB, 1000 * GIB, {}))
    flags = (*ON.items(), ("hicache-size", 20), *NO_DRAFT)
    plan = make_plan(host, Change(context=32768, flags=flags), facts)  # type: ignore[arg-type]
    assert plan.host is not None and plan.host.checked
    sent = planned_pools(plan)
    assert sent["host_budget_pinned"] == plan.host.budget.pinned > 0
    req = base_request(host, "apply", unit_text=unit_text(200_000), target_context=32768, **sent)
    data = {"host_budget_pinned": req.host_budget_pinned, "host_budget_capacity": req.host_budget_capacity}
    run = run_from(req, Outcome.APPLIED, 0.0, data, [])
    assert (run.host_budget_pinned, run.host_budget_capacity) == (
        plan.host.budget.pinned,
        plan.host.budget.capacity,
    )
