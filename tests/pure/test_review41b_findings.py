"""Second review of the host-memory plan (the refusal's offer, the neighbours still to start, the host's
memory lock): each finding is a strict xfail that asserts the correct behaviour and fails on today's code.
SGLang 0.5.23's lines are cited where arithmetic is concerned (sglang/ of its package)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import UsageError
from agent.host.change import pinning
from agent.host.lock import UnitLock
from agent.inventory import FlagValue
from agent.plan.hostplan import neighbour, plan_host, process_bytes
from agent.plan.hostpool import GIB, RankPool
from agent.protocol.answers import HostMemoryData
from agent.protocol.requests import Group
from tests.pure.txnfakes import Host, Script, unit_text

ON = {"enable-hierarchical-cache": True}
POOL = RankPool(400_000, 40_960, 1)


def memory(total: int, available: int, siblings: dict[str, int]) -> HostMemoryData:
    return {"total": total, "available": available, "hugepages_total": 0, "hugepages_free": 0,
            "numa_nodes": 1, "cgroup": [], "siblings": siblings}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- high


def test_a_service_the_plan_accepts_leaves_its_neighbour_able_to_restart() -> None:
    """Host of 512 GiB, 500 available, nothing running. B (TP 8, --hicache-size 30) is a neighbour still
    to start (or restarted later: Restart=, a reboot, its own next apply); S (TP 1, --hicache-size 100) is
    planned beside it: FITS (364 GiB of 500). S starts first under the host lock and pins 100 GB. B's last
    rank then sees (366.9 - 7 x 30 GB - 10 GiB) // 8 = 21.65 GB < 30 GB: SGLang refuses B
    (pool_host/base.py:104-108, 248-257), for good. B's own plan, run afterwards with S running, refuses
    too. The plan that accepts S must leave every neighbour's pools passing SGLang's own check."""
    total, avail = 512 * GIB, 500 * GIB
    b_flags = {**ON, "tp-size": 8, "hicache-size": 30}
    b = neighbour("b", b_flags, unit="b.service")
    s = plan_host("s", POOL, {**ON, "hicache-size": 100}, memory(total, avail, {}), (b,))
    if not s.fits:
        return  # refused: B keeps its room
    held_s = s.pool.bytes + process_bytes(1)
    s_running = neighbour("s", {**ON, "hicache-size": 100}, unit="s.service")
    after_s = memory(total, avail - held_s, {"s.service": held_s})
    b_after = plan_host("b", POOL, b_flags, after_s, (s_running,))
    assert b_after.fits, b_after.budget.reason


def test_an_explicit_size_passes_sglangs_check_with_a_neighbour_still_to_start() -> None:
    """Host of 512 GiB, 500 available. B (TP 1, --hicache-size 100) is stopped, still to start; S (TP 8,
    --hicache-size 30) is planned: FITS. B starts (its own apply, Restart=, a boot: systemd does not order
    them) and pins 100 GB; at S's next restart its last rank sees 21.65 GB < 30 GB and SGLang refuses it
    (pool_host/base.py:104-108, 248-257), as the same plan run with B running says. The plan of a size must
    hold in either start order (plan/hostplan.py says so of the rendered size: 'in any start order')."""
    total, avail = 512 * GIB, 500 * GIB
    b = neighbour("b", {**ON, "hicache-size": 100}, unit="b.service")
    flags = {**ON, "tp-size": 8, "hicache-size": 30}
    stopped = plan_host("s", POOL, flags, memory(total, avail, {}), (b,))
    held_b = 100 * 10**9 + process_bytes(1)
    running = plan_host("s", POOL, flags, memory(total, avail - held_b, {"b.service": held_b}), (b,))
    assert stopped.fits == running.fits, (stopped.budget.reason, running.budget.reason)


# -------------------------------------------------------------------------------------------------- medium


def test_a_decodes_kv_offload_host_pool_is_planned() -> None:
    """Llama 3.1 8B decode on an H100, TP 1, KV offload on, HiCache off: SGLang sets the ratio to 2.0
    (kv_cache_builder.py:259-260, the backup cpu_tensor, 236) and builds a host pool of 2 x 440,314 tokens
    x 128 KiB = 115 GB (decode_kvcache_offload_manager.py:116, build_kv_host_pool: hicache_ratio,
    hybrid_pool_assembler.py:224-228), checked as HiCache's (pool_host/base.py:247-257): on a host with 48
    GiB available it is refused at every start. hostwire.with_host_plan returns the plan untouched (only
    HiCache or the default retraction backup is planned): FEASIBLE, nothing said. pinning.py knows it pins."""
    import json
    from dataclasses import replace

    from agent.plan.choose import Target
    from agent.plan.facts import parse_facts
    from agent.plan.from_facts import plan_from_facts

    root = Path(__file__).resolve().parents[2]
    config = json.loads((root / "tests/data/models/llama-3.1-8b/config.json").read_text())
    h100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
    flags = {
        "tp-size": 1,
        "disaggregation-mode": "decode",
        "disaggregation-decode-enable-offload-kvcache": True,
    }
    doc = {"format": "deployctl-facts/1", "gpus": [h100], "sglang": {"version": "0.5.23"},
           "model": {"config": config, "weights_bytes": int(16e9)}, "flags": flags}  # fmt: skip
    inp = replace(parse_facts(doc, name="d"), host_memory=memory(64 * GIB, 48 * GIB, {}))
    plan = plan_from_facts(inp, Target(32768))
    assert plan.host is not None or not plan.feasible


def test_a_group_node_stops_waiting_when_its_own_member_takes_the_lock(tmp_path: Path) -> None:
    """Two roles of one [pd] (or [nodes]) group on one host start in the same wave while another service's
    HiCache change holds the host's memory lock: both wait. That one releases, member A of the group takes
    the lock and starts, then waits at the group's barrier for B. B checked own_group_holds once, before
    waiting (pinning.py one_start_at_a_time): it keeps waiting for A's lock until bound_s and stops LOCKED,
    and the whole group rolls back. B must stop waiting once its own group holds the lock."""
    on = unit_text(200_000).replace("--context-length", "--enable-hierarchical-cache --context-length")
    old = on.replace("200000", "100000")
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    host.install(host.etc, old)
    run = host.root / "run/deployctl"
    other = UnitLock(run, pinning.LOCK_NAME)
    other.acquire({"pid": 4242, "unit": "code.service", "verb": "apply", "txn": "t-other"})
    t = host.transaction(host.request(200_000, unit_text=on, group=Group(1, 2, 60.0, key="g-1")))
    member = UnitLock(run, pinning.LOCK_NAME)
    clock = [0.0]

    def wait(_: float) -> None:  # the other service commits; the group's rank 0 takes the lock
        clock[0] += 1.0
        if other.is_held():
            other.release()
            member.acquire({"pid": 4343, "unit": "prefill.service", "verb": "apply", "group": "g-1"})

    t.ports.wait, t.ports.monotonic = wait, lambda: clock[0]
    try:
        with pinning.one_start_at_a_time(t.ports, old, on) as locked:
            assert locked is None, str(locked)
    finally:
        member.release()


def test_ignore_host_memory_does_not_pass_the_device_plans_refusal() -> None:
    """apply.prepare: `host_refused` picks which override counts, so a plan refused by the device
    (--max-total-tokens 1000 caps the pool below the 262,144-token context) and by the host (--hicache-size
    500) goes on with --ignore-host-memory alone; with --hicache-size 1 the same device refusal stops it.
    Each refusal needs its own override."""
    import io
    import json
    from dataclasses import replace

    from agent.apply import prepare
    from agent.inventory import load_service
    from agent.orchestrate.asked import Change
    from agent.output import Output

    root = Path(__file__).resolve().parents[2]
    host = load_service("ct200", root / "units")
    model = json.loads((root / "examples/ct200.json").read_text())
    data = memory(256 * GIB, 240 * GIB, {})
    facts = {"flags": dict(host.sglang.flags), "host_memory": data, "model_facts": model}
    no_draft = (("speculative-algorithm", False), ("speculative-draft-model-path", False))
    flags = (*ON.items(), ("max-total-tokens", 1000), ("hicache-size", 500), *no_draft)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    change = Change(context=262144, flags=flags, dry_run=True, ignore_host_memory=True)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="cannot reach"):
        prepare(out, host, change, facts)  # type: ignore[arg-type]
    both = Change(context=262144, flags=flags, dry_run=True, ignore_host_memory=True, force=True)  # type: ignore[arg-type]
    assert prepare(out, host, both, facts) is None  # type: ignore[arg-type]  # each override passed: a dry run
    host_only = (*ON.items(), ("hicache-size", 500), *no_draft)
    alone = Change(context=65536, flags=host_only, dry_run=True, ignore_host_memory=True)  # type: ignore[arg-type]
    assert prepare(out, host, alone, facts) is None  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="host's memory cannot hold"):
        prepare(out, host, replace(alone, ignore_host_memory=False), facts)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", ["1.5", "nan"])
def test_a_hicache_size_sglang_cannot_parse_is_refused_by_the_plan(size: str) -> None:
    """srt/arg_groups/fields/memory.py:113-116: `hicache_size: A[int, ...]`. `--hicache-size 1.5` plans
    a 1.5 GB pool and a MemoryMax= (FITS), `nan` is taken as no size and the auto size rendered in its
    place, without a word; the unit's ExecStart= keeps the value and SGLang exits at argument parsing
    (`invalid int value`) on every restart. The plan must refuse it in one line, as it does 'abc'."""
    flags: dict[str, FlagValue] = {**ON, "hicache-size": size}
    try:
        planned = plan_host("x", POOL, flags, memory(512 * GIB, 500 * GIB, {}))
    except UsageError:
        return
    assert not planned.fits


@pytest.mark.parametrize("size", ["inf", "1e400"])
def test_an_infinite_hicache_size_is_refused_in_one_line(size: str) -> None:
    """hostpool._tokens: `inf * 1e9 // bytes per token` is NaN and int() raises ValueError, which
    neither hicache_flags nor offers_fix (OverflowError only) turns into a UsageError: a traceback."""
    with pytest.raises(UsageError):
        plan_host("x", POOL, {**ON, "hicache-size": size}, memory(512 * GIB, 500 * GIB, {}))
