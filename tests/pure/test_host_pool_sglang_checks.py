"""The host pool the plan renders passes SGLang 0.5.23's own checks on the host it will start on.

Host-pool numbers against SGLang's own rule (srt/mem_cache/pool_host/base.py, hicache_auto_size.py,
host_memory.py, kv_cache_builder.py) checked rank by rank, the page cache and the neighbours as the host's
facts read them, the unit's own memory limit, and the host's start lock. NOT_YET marks a case the product
does not meet yet (strict: it fails the tier once it passes, so the mark goes with the fix).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import UsageError
from agent.host import hostmem
from agent.host.change.pinning import LOCK_NAME, pins_host_memory
from agent.host.lock import UnitLock
from agent.inventory import FlagValue, load_host
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.from_inventory import plan_input_from_inventory
from agent.plan.hostplan import (
    daemon_bytes,
    memory_at_start,
    neighbour,
    plan_host,
    process_bytes,
    unit_memory_limit,
)
from agent.plan.hostpool import GIB, CgroupLevel, HiCacheFlags, HostMemory, RankPool, plan_host_pool
from agent.protocol.answers import CgroupLevelData, HostMemoryData
from agent.render import render_unit, template_dir
from agent.sglang import weight_cache as wc
from tests.pure.txnfakes import UNIT, Host, Script, unit_text

GB = 10**9
ON = {"enable-hierarchical-cache": True}
NOT_YET = pytest.mark.xfail(strict=True, reason="not met yet: see the test's docstring")
POOL = RankPool(400_000, 131_072, 1)  # 52 GB of device KV per rank
BIG = RankPool(1_500_000, 131_072, 1)  # 197 GB per rank: the default ratio 2.0 never binds on a 512 GiB host


def memory(
    total: int,
    available: int,
    cgroup: list[CgroupLevelData] | None = None,
    siblings: dict[str, int] | None = None,
) -> HostMemoryData:
    data: HostMemoryData = {"total": total, "available": available, "hugepages_total": 0, "hugepages_free": 0,
                            "numa_nodes": 1, "cgroup": cgroup or []}  # fmt: skip
    if siblings is not None:
        data["siblings"] = siblings
    return data


def sglang_checks_rank_by_rank(  # noqa: PLR0913 - the pool, size, host, divisor, pool bytes, pools
    pool: RankPool, size_gb: float, start: HostMemory, ranks: int, per: int, pools: int = 0
) -> list[int]:
    """SGLang's explicit-size check (base.py:248-257 via host_memory_budget_bytes, re-sampled per rank, no
    budget scope): a rank that checks after k others pinned sees MemAvailable and the cgroup k pools lower
    (sglang#38156, the model the branch itself renders MemoryMax= by). The ranks that are refused."""
    refused = []
    for k in range(pools or ranks):
        seen = HostMemory(
            start.available - k * per,
            tuple(CgroupLevel(lv.limits, lv.usage + k * per, lv.page_cache) for lv in start.cgroup),
        )
        if not plan_host_pool(pool, HiCacheFlags(size_gb=size_gb), seen, ranks).fits:
            refused.append(k)
    return refused


# -- host-pool numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_rendered_auto_size_passes_sglangs_check_for_the_last_rank_to_pin(tp: int) -> None:
    """HIGH. SGLang's default (auto) books every rank's pool against one snapshot (host_memory_budget_scope,
    hicache_auto_size.py:124-125), so its ranks never see each other's pools. The plan renders that pool as
    an explicit --hicache-size, which SGLang checks per rank against a fresh psutil reading; MemoryMax= is
    sized for 2 x ranks - 1 pools but MemAvailable is not, so a rank that checks after the others pinned
    is refused on a host the plan calls 'fits'."""
    total, avail = 512 * GIB, 500 * GIB
    flags = {**ON, "tp-size": tp}
    host = plan_host("chat", BIG, flags, memory(total, avail, siblings={}))
    assert host.fits and host.size_gb is not None
    start = memory_at_start(memory(total, avail), tp, host.memory_max)
    refused = sglang_checks_rank_by_rank(BIG, host.size_gb, start, tp, host.pool.bytes)
    assert refused == [], f"TP {tp}: --hicache-size {host.size_gb:g} refused at ranks {refused}"


def test_replanning_a_running_auto_service_does_not_shrink_its_host_pool() -> None:
    """HIGH. memory_at_start keeps the running unit's memory.max (the MemoryMax= the last apply rendered)
    as the new start's limit when the unit sets none of its own; the inventory still says auto, so every
    re-plan auto-sizes 0.8 x 0.95 of the previous pool's room: the host tier shrinks ~24% per apply."""
    total, avail, tp = 512 * GIB, 500 * GIB, 1
    flags = {**ON, "tp-size": tp}
    sizes = []
    running: HostMemoryData = memory(total, avail, siblings={})
    for _ in range(3):
        host = plan_host("chat", BIG, flags, running)
        assert host.fits and host.size_gb is not None and host.memory_max is not None
        sizes.append(host.size_gb)
        held = host.pool.bytes * tp + process_bytes(tp)
        unit: CgroupLevelData = {"path": f"system.slice/{UNIT}", "max": host.memory_max, "high": None,
                                 "current": held, "file": 0}  # fmt: skip
        running = memory(total, avail - held, [unit], {})
    assert sizes[0] == sizes[1] == sizes[2], f"the same host and flags re-planned: {sizes}"


def test_data_parallel_replicas_each_pin_a_pool_per_rank() -> None:
    """HIGH. --dp-size 2 without attention DP launches two TP groups (data_parallel_controller.py
    launch_dp_schedulers; compute_world_size = dp x tp x pp GPUs, which the plan accepts). Each of the four
    ranks pins a pool (each sized as SGLang's ranks_per_host = tp x pp says), but ranks_of counts tp x pp:
    the budget and MemoryMax= hold half the pools and processes."""
    flags = {**ON, "tp-size": 2, "dp-size": 2, "hicache-size": 50}
    host = plan_host("chat", POOL, flags, memory(256 * GIB, 240 * GIB, siblings={}))
    pools_on_host = 2 * 2
    assert host.budget.pinned >= pools_on_host * 50 * GB + process_bytes(pools_on_host)
    assert not host.fits  # four 50 GB pools and their processes do not fit in 240 GiB with 8 GiB headroom


@pytest.mark.parametrize(("dp", "tp"), [(2, 1), (2, 2), (4, 2)])
def test_data_parallel_pools_pass_sglangs_check_and_the_units_memory_max(dp: int, tp: int) -> None:
    """Every rank of every replica passes SGLang's per-rank check (divisor tp, the others' pools used), on
    the host and under the rendered MemoryMax=."""
    total, avail = 512 * GIB, 500 * GIB
    host = plan_host("chat", BIG, {**ON, "tp-size": tp, "dp-size": dp}, memory(total, avail, siblings={}))
    assert host.fits and host.size_gb is not None and host.ranks == dp * tp
    start = memory_at_start(memory(total, avail), dp * tp, host.memory_max)
    assert sglang_checks_rank_by_rank(BIG, host.size_gb, start, tp, host.pool.bytes, dp * tp) == []
    assert host.budget.pinned >= dp * tp * host.pool.bytes + process_bytes(dp * tp)


def test_page_cache_is_what_sglang_credits_not_memory_stats_file() -> None:
    """MEDIUM. SGLang takes active_file + inactive_file off memory.current (host_memory.py:108-113: 'shmem
    sits on the anon LRU'); hostmem reads memory.stat's `file`, which counts shmem/tmpfs too (NCCL's
    /dev/shm segments, for one): a slice's headroom is overstated by its shmem, and the plan passes a pool
    SGLang refuses."""
    stat = "anon 4000\nfile 9000\nactive_file 2000\ninactive_file 1000\nshmem 6000\n"
    assert hostmem.parse_file_cache(stat) == 3000


def test_the_services_own_running_weight_cache_daemon_is_counted_once(tmp_path: Path) -> None:
    """MEDIUM. host_ram gives back only the engine unit's usage; the service's own daemon keeps running
    across an engine-only restart (its memory already out of MemAvailable) and is counted again in its
    need's daemon_bytes: re-applying the unit that runs now is refused on the host that runs it."""
    tp, size = 1, 20
    flags = {**ON, "tp-size": tp, "hicache-size": size}
    daemon = daemon_bytes(tp, True)
    fresh_need = size * GB + 256 * 2**20 + process_bytes(tp) + daemon + 8 * GIB  # pool, processes, headroom
    avail = fresh_need + 2 * GIB
    first = plan_host("chat", POOL, flags, memory(512 * GIB, avail, siblings={}), weight_cache=True)
    assert first.fits, first.budget.reason
    engine = first.pool.bytes + process_bytes(tp)
    unit: CgroupLevelData = {"path": f"system.slice/{UNIT}", "max": first.memory_max, "high": None,
                             "current": engine, "file": 0}  # fmt: skip
    now = memory(512 * GIB, avail - engine - daemon, [unit], {wc.daemon_unit_name(UNIT): daemon})
    again = plan_host("chat", POOL, flags, now, weight_cache=True)
    assert again.fits, again.budget.reason


def test_a_template_instance_finds_its_cgroup_and_its_neighbours(tmp_path: Path) -> None:
    """MEDIUM. systemd puts sglang@chat.service under system.slice/system-sglang.slice/ (the usual way to run
    two services of one host); unit_cgroup looks only at <slice>/<unit> one level down: no levels (its own
    running pool is never given back) and siblings read from system.slice, where the neighbour instance
    is not: a running neighbour counts as stopped (its pool counted twice, and 'still to start')."""
    for name, current in (("sglang@chat.service", 60 * GIB), ("sglang@code.service", 70 * GIB)):
        d = tmp_path / "system.slice/system-sglang.slice" / name
        d.mkdir(parents=True)
        (d / "memory.current").write_text(str(current))
        (d / "memory.max").write_text("max")
        (d / "memory.high").write_text("max")
        (d / "memory.stat").write_text("file 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 536870912 kB\nMemAvailable: 268435456 kB\n")
    data = hostmem.collect("sglang@chat.service", str(tmp_path), str(tmp_path / "meminfo"), str(tmp_path))
    assert data is not None
    assert data["cgroup"] and data["cgroup"][0]["current"] == 60 * GIB
    assert data.get("siblings", {}).get("sglang@code.service") == 70 * GIB


def test_a_percent_memory_max_bounds_the_pool() -> None:
    """MEDIUM (documented as 'not read', but the plan then calls feasible what SGLang refuses). systemd
    applies MemoryMax=25% as a quarter of physical RAM; unit_memory_limit returns None, so the plan sizes
    under its own rendered MemoryMax= and passes a 100 GB pool in a 64 GiB cgroup. Read it against
    MemTotal (the facts have it), or refuse the plan in one line."""
    lines = ["MemoryMax=25%"]
    limit = unit_memory_limit(lines)
    host = plan_host("chat", POOL, {**ON, "hicache-size": 100}, memory(256 * GIB, 250 * GIB, siblings={}),
                     unit_limit=limit)  # fmt: skip
    assert not host.fits, "a 100 GB pool passed under MemoryMax=25% of 256 GiB"


def test_a_limit_systemd_rejects_is_not_read_as_one() -> None:
    """LOW. systemd's parse_size (base 1024) matches suffixes case-sensitively (K M G T P E, and B): it
    ignores MemoryMax=64g with a warning and the rendered MemoryMax= stays in force; the plan reads 64 GiB.
    It accepts MemoryMax=64B (bytes) and compound 1G512M, which the plan does not read."""
    assert unit_memory_limit(["MemoryMax=64g"]) is None
    assert unit_memory_limit(["MemoryMax=1G512M"]) == 1536 * 2**20


def test_a_decode_neighbours_backup_pool_is_in_the_budget() -> None:
    """MEDIUM. A PD decode's default retraction backup pins a host pool (the branch takes the host lock for
    it: pinning.py), but neighbour() returns None for any service without HiCache: a stopped decode (or any
    plain neighbour) on the same host counts for nothing, not even its processes."""
    decode = neighbour("dec", {"disaggregation-mode": "decode", "tp-size": 4}, unit="dec.service")
    assert decode is not None and decode.pinned >= process_bytes(4)


def test_a_neighbour_caught_mid_start_is_not_taken_for_one_that_has_pinned() -> None:
    """MEDIUM. The plan is made on the laptop before the host's lock is waited for. A neighbour (auto, as the
    inventory says) caught loading its weights holds its processes only: not 'still to start' (it holds
    something), counted as running; this service auto-sizes over memory the neighbour is about to pin,
    waits for its start, then starts a rendered size SGLang refuses."""
    total, avail, tp = 512 * GIB, 500 * GIB, 2
    flags = {**ON, "tp-size": tp}
    near = neighbour("code", flags, unit="code.service")
    assert near is not None
    loading = process_bytes(tp)  # its schedulers up, its pool not pinned yet
    mine = plan_host("chat", BIG, flags, memory(total, avail - loading, siblings={"code.service": loading}),
                     (near,))  # fmt: skip
    assert mine.fits and mine.size_gb is not None
    theirs = plan_host_pool(BIG, HiCacheFlags(), memory_at_start(memory(total, avail), tp), tp)  # it pins
    after = memory(total, avail - theirs.bytes * tp - process_bytes(tp))
    start = memory_at_start(after, tp, mine.memory_max)
    assert plan_host_pool(BIG, HiCacheFlags(size_gb=mine.size_gb), start, tp).fits


# -- the host's start lock -----------------------------------------------------------------------------


def hicache(context: int) -> str:
    return unit_text(context).replace("--context-length", "--enable-hierarchical-cache --context-length")


class Killed(BaseException):
    """The agent dies here."""


def test_a_recoverys_restart_of_a_pinning_unit_waits_for_the_hosts_lock(tmp_path: Path) -> None:
    """MEDIUM (listed under 'Not yet', but it is the crash path the lock exists for). An apply killed at its
    restart leaves a record; the next run's recovery restores the HiCache unit and restarts it in
    _recover_first, before one_start_at_a_time: while another service's start holds the host's lock."""
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, hicache(100_000))
    restart = host.systemd.restart

    def dies(unit: str, timeout: float):  # type: ignore[no-untyped-def]
        restart(unit, timeout)  # the new unit started; the agent dies before it is verified
        raise Killed

    host.systemd.restart = dies  # type: ignore[method-assign]
    with pytest.raises(Killed):
        host.transaction(host.request(200_000, unit_text=hicache(200_000))).apply()
    host.systemd.restart = restart  # type: ignore[method-assign]

    lock = UnitLock(host.root / "run/deployctl", LOCK_NAME)
    assert not lock.is_held()  # the dead run's hold is gone (flock dies with its fd): good
    other = UnitLock(host.root / "run/deployctl", LOCK_NAME)
    other.acquire({"pid": 4242, "unit": "code.service", "verb": "apply", "txn": "t-other"})
    seen: list[str] = []

    def watched(unit: str, timeout: float):  # type: ignore[no-untyped-def]
        seen.append(str(lock.holder().get("unit")) if lock.is_held() else "nobody")
        return restart(unit, timeout)

    host.systemd.restart = watched  # type: ignore[method-assign]
    t = host.transaction(host.request(200_000, unit_text=hicache(200_000)), txn="20261203T130000Z-bbbbbb")
    t.ports.wait = lambda s: other.release()
    t.apply()
    assert seen and "code.service" not in seen, f"starts made while code.service pinned: {seen}"


@pytest.mark.parametrize(
    ("extra", "pins"),
    [("--disaggregation-decode-enable-radix-cache", False), ("--enable-priority-scheduling", False),
     ("--enable-priority-scheduling --disable-priority-preemption", True),
     ("--disaggregation-decode-enable-offload-kvcache", True), ("", True)],
)  # fmt: skip
def test_a_decode_takes_the_lock_only_where_sglang_pins_a_host_pool(extra: str, pins: bool) -> None:
    """kv_cache_builder.py:226-241 resolves the default backup to cpu_tensor (no host pool) under the decode
    radix cache and priority preemption: such a decode does not wait for, nor can be LOCKED by, another
    service's start. The decode's KV offload builds a host pool of its own
    (decode_kvcache_offload_manager.py:116): it pins."""
    text = unit_text(1000).replace(
        "--context-length", f"--disaggregation-mode decode {extra} --context-length"
    )
    assert pins_host_memory(text) is pins


def test_the_wait_outlasts_a_first_change_that_stays_within_its_own_bounds() -> None:
    """LOW-MEDIUM. The holder keeps the host's lock through its pre-warm, its start, its smoke test and, when
    it fails, the rollback's start of the old unit: up to about two starts and a pre-warm. The second
    change waits one start (weights + pool + ready), then stops LOCKED: two services of one host applied
    together (a fleet batch, two operators) fail the second whenever the first rolls back, or pre-warms."""
    from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, Smoke, Timeouts, host_start_wait_s

    t = Timeouts()
    one_start = RESTART_JOB_TIMEOUT_S + t.weights_s + t.pool_s + t.ready_s
    holder_longest = t.weights_s + 2 * one_start + Smoke().timeout_s  # pre-warm, new start, rollback's start
    assert host_start_wait_s(t) >= holder_longest


def test_without_host_facts_the_auto_default_is_not_replaced_by_an_unchecked_size() -> None:
    """MEDIUM. With no host_memory (a --facts file, the inventory-only plan, an older agent) the host is
    UNLIMITED, so SGLang's auto size (which shrinks to the host at start) becomes the full ratio 2.0 and
    is rendered as an explicit --hicache-size that SGLang then checks unshrunk: a 393 GB pool per rank here.
    The JSON says verdict 'fits' while the text says 'not read ... unchecked'."""
    host = plan_host("chat", BIG, {**ON, "tp-size": 8}, None)
    assert host.size_gb is None, f"rendered --hicache-size {host.size_gb:g} per rank x 8 from no facts"
    assert host.to_dict()["host_budget"]["verdict"] != "fits"  # type: ignore[index]


def test_a_slice_limit_over_both_services_holds_both() -> None:
    """MEDIUM. docs/planning.md: the budget must fit in min(MemTotal, MemAvailable, the slice's limit), but
    HostRam.cgroup_limit is never set (hostplan.host_ram), and the shared auto size takes the later
    service's pool off MemAvailable only (hostplan.shared keeps seen.cgroup as it is). Under a slice
    MemoryMax=200G the first service auto-sizes over the whole slice; the second's explicit 80 GB pool,
    which the first plan counted, is then refused by SGLang against the slice."""
    slice_limit, total, avail = 200 * GIB, 1024 * GIB, 1000 * GIB
    unit: CgroupLevelData = {"path": "deploy.slice/chat.service", "max": None, "high": None, "current": 0,
                             "file": 0}  # fmt: skip
    top: CgroupLevelData = {"path": "deploy.slice", "max": slice_limit, "high": None, "current": 0, "file": 0}
    code = {**ON, "hicache-size": 80}
    later = neighbour("code", code, unit="code.service")
    assert later is not None
    first = plan_host("chat", BIG, dict(ON), memory(total, avail, [unit, top], {}), (later,))
    assert first.fits and first.size_gb is not None, first.budget.reason
    held = first.pool.bytes + process_bytes(1)
    # the second's own start, SGLang's check: its processes and the first's in the slice
    seen = HostMemory(
        avail - held - process_bytes(1), (CgroupLevel((slice_limit,), held + process_bytes(1), 0),)
    )
    assert plan_host_pool(BIG, HiCacheFlags(size_gb=80), seen, 1).fits


def test_a_decode_with_hicache_asks_sglangs_decode_ratio() -> None:
    """LOW. For a decode server hicache_hook leaves the ratio unset and kv_cache_builder.py:245-258 sets 2.0
    when HiCache is on, whatever --hicache-host-memory-mode; hicache_flags gives buffer_only 1.2."""
    flags: dict[str, FlagValue] = {
        **ON,
        "disaggregation-mode": "decode",
        "hicache-host-memory-mode": "buffer_only",
        "hicache-storage-backend": "file",
    }
    host = plan_host("dec", POOL, flags, None)
    assert host.given.tokens == int(POOL.device_tokens * 2.0) + 1


def test_a_refusal_for_the_hosts_ram_names_only_fixes_that_fix_it() -> None:
    """LOW-MEDIUM. hostbudget._refuse appends 'or a MemoryMax= of at least X GiB holds this one' whenever the
    service has a MemoryMax= (always, once a size is rendered), also when the host's RAM is what refused:
    a MemoryMax= (here already above X) cannot add RAM, yet the one line offers it as the fix."""
    near = neighbour("code", {**ON, "hicache-size": 245}, unit="code.service")
    assert near is not None
    data = memory(256 * GIB, 250 * GIB, siblings={})
    host = plan_host("chat", POOL, {**ON, "hicache-size": 5}, data, (near,))
    assert not host.fits and "cannot pin" in host.budget.reason
    assert "MemoryMax=" not in host.budget.reason, host.budget.reason


# -- the unit's own MemoryMax= -------------------------------------------------------------------------


def adopted(*service: str):  # type: ignore[no-untyped-def]
    """ct200 as an adopted unit whose [Service] keeps `service` lines of its own."""
    host = load_host("ct200", Path(__file__).resolve().parents[2] / "units")
    unit = host.unit.model_copy(
        update={"template": "sglang-adopted.service.j2", "verbatim": {"Service": list(service)}}
    )
    return host.model_copy(update={"unit": unit})


def memory_max_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("MemoryMax=")]


def test_a_units_own_memory_max_is_rendered_once_and_planned_under() -> None:
    """An adopted unit's hand-kept MemoryMax= is the limit: the unit gets it once (not the rendered one
    too), and the plan, with or without the host's facts, sizes the pool under it."""
    host = adopted("MemoryMax=64G")
    flags = {**ON, "tp-size": 1, "hicache-size": 200}
    assert memory_max_lines(render_unit(host, flags, template_dir())) == ["MemoryMax=64G"]
    inp = plan_input_from_inventory(host, {})
    assert inp.unit_memory_limit == 64 * GIB  # the offline plan's input too
    assert not plan_host("chat", POOL, flags, None, unit_limit=inp.unit_memory_limit).fits


def test_a_memory_max_systemd_rejects_leaves_the_rendered_one() -> None:
    """systemd ignores MemoryMax=64g (its suffixes are case-sensitive): the rendered limit stays first."""
    lines = memory_max_lines(
        render_unit(adopted("MemoryMax=64g"), {**ON, "hicache-size": 20}, template_dir())
    )
    assert len(lines) == 2 and lines[0] != "MemoryMax=64g" and lines[1] == "MemoryMax=64g"


# -- a facts file's host_memory ------------------------------------------------------------------------


def facts_with(host_memory: object) -> dict[str, object]:
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "examples/llama-3.1-8b-h100.json").read_text())
    data["flags"] = {**data.get("flags", {}), **ON, "hicache-size": 100}
    data["host_memory"] = host_memory
    return data  # type: ignore[no-any-return]


def test_a_facts_files_host_memory_is_read() -> None:
    """`deployctl plan --facts` with the host_memory the facts verb prints plans against that host: a
    100 GB pool on a 64 GiB host is refused in SGLang's words, not called feasible unchecked."""
    low = {"total": 64 * GIB, "available": 40 * GIB, "hugepages_total": 0, "hugepages_free": 0,
           "numa_nodes": 1, "cgroup": []}  # fmt: skip
    inp = parse_facts(facts_with(low))
    assert inp.host_memory is not None and inp.host_memory["available"] == 40 * GIB
    plan = plan_from_facts(inp, Target(32_000))
    assert not plan.feasible and plan.host is not None and plan.host.checked
    assert "Not enough host memory available" in plan.binding


@pytest.mark.parametrize(
    "bad",
    [{"total": "64G", "available": 1}, {"total": 1, "available": 1, "memroy": 5}, {"available": 1}, [1]],
)
def test_a_bad_host_memory_is_one_line_naming_the_key(bad: object) -> None:
    with pytest.raises(UsageError, match=r"^facts: host_memory"):
        parse_facts(facts_with(bad))
