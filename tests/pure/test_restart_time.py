"""The restart's cost before it happens (agent/plan/restart_time.py), and the cache preconditions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.plan.restart_time import (
    GIB,
    PAGE_CACHE_SPEEDUP,
    WEIGHT_CACHE_LOAD_S,
    LastStart,
    PageCache,
    WeightSource,
    cache_warnings,
    estimate,
    from_facts,
    last_start,
)
from agent.protocol import HostFacts

# The seed's phases scaled from the Qwen3-235B start (LMSYS blog): weights dominate.
PHASES = {"drain": 4.0, "stop": 2.0, "init": 17.3, "weights": 306.0, "pool": 0.5, "cuda_graphs": 34.9,
          "ready": 26.5, "smoke": 3.0}  # fmt: skip
FITS = PageCache(weights_bytes=235 * GIB, mem_available_bytes=1000 * GIB)
TOO_BIG = PageCache(weights_bytes=235 * GIB, mem_available_bytes=200 * GIB)
UNIT = """[Unit]
Description=SGLang
[Service]
User=sglang
Environment=SGLANG_CACHE_DIR=/var/cache/sglang
ExecStart=/opt/sglang/bin/python -m sglang.launch_server --model-path /models/q
"""


def test_the_estimate_is_the_last_starts_restart_phases_without_drain_or_smoke() -> None:
    e = estimate(LastStart(PHASES, WeightSource.PAGE_CACHE), FITS)
    assert set(e.parts) == {"stop", "init", "weights", "pool", "cuda_graphs", "ready"}
    assert e.seconds == sum(e.parts.values()) == 2.0 + 17.3 + 306.0 + 0.5 + 34.9 + 26.5
    assert e.to_dict()["restart_estimate_s"] == 387.2


def test_a_cold_last_start_is_corrected_for_the_warm_page_cache_pre_warm_will_leave() -> None:
    e = estimate(LastStart(PHASES, WeightSource.DISK), FITS)
    assert abs(e.parts["weights"] - 306.0 / PAGE_CACHE_SPEEDUP) < 1e-9
    assert any("from disk last time" in n for n in e.notes)


def test_a_warm_last_start_costs_more_when_the_checkpoint_no_longer_fits() -> None:
    e = estimate(LastStart(PHASES, WeightSource.PAGE_CACHE), TOO_BIG)
    assert abs(e.parts["weights"] - 306.0 * PAGE_CACHE_SPEEDUP) < 1e-9


def test_an_unknown_side_keeps_the_measured_weights() -> None:
    assert estimate(LastStart(PHASES), FITS).parts["weights"] == 306.0


def test_the_weight_cache_daemon_maps_the_weights_and_a_fingerprint_change_costs_both() -> None:
    kept = estimate(LastStart(PHASES, WeightSource.PAGE_CACHE), FITS, weight_cache_kept=True)
    assert kept.parts["weights"] == WEIGHT_CACHE_LOAD_S and "daemon" not in kept.parts
    both = estimate(LastStart(PHASES, WeightSource.PAGE_CACHE), FITS, daemon_restart=True)
    assert both.parts["daemon"] == 306.0 and both.parts["weights"] == WEIGHT_CACHE_LOAD_S
    assert both.seconds is not None and kept.seconds is not None and both.seconds > kept.seconds
    assert any("daemon restarts too" in n for n in both.notes)


@given(st.dictionaries(st.sampled_from(sorted(PHASES)), st.floats(0, 1e4), min_size=1))
def test_the_parts_always_add_up_and_the_weight_cache_never_costs_more(phases: dict[str, float]) -> None:
    last = LastStart(phases, WeightSource.PAGE_CACHE)
    off, kept = estimate(last, FITS), estimate(last, FITS, weight_cache_kept=True)
    assert off.seconds == sum(off.parts.values())
    assert off.seconds is not None and kept.seconds is not None
    if phases.get("weights", 0.0) >= WEIGHT_CACHE_LOAD_S:
        assert kept.seconds <= off.seconds


def test_the_last_start_is_the_newest_with_phases_and_its_pre_warm_says_warm_or_cold() -> None:
    warm = {"total_bytes": 10, "read_bytes": 10, "seconds": 1.0, "files": 1, "skip": None}
    cold = {**warm, "read_bytes": 0, "skip": "12.0 GiB of weights do not fit in 3.0 GiB of free memory"}
    history = [
        {"downtime": {"seconds": 9, "phases": {"weights": 9.0}}, "prewarm": warm},
        {"downtime": {"seconds": 5, "phases": {"weights": 5.0}}, "prewarm": cold},
        {"txn": "x"},
    ]
    found = last_start(history)
    assert found == LastStart({"weights": 5.0}, WeightSource.DISK)
    assert last_start(history[:1]) == LastStart({"weights": 9.0}, WeightSource.PAGE_CACHE)
    assert last_start([]) is None


def test_a_clean_unit_warns_of_nothing() -> None:
    assert cache_warnings(UNIT, UNIT, {}, FITS, LastStart(PHASES)) == []


def test_each_cache_precondition_is_one_warning_with_its_cost() -> None:
    cases = {
        "SGLANG_CACHE_DIR=/tmp/sglang is not persistent": UNIT.replace("/var/cache/sglang", "/tmp/sglang"),
        "under another user's home": UNIT.replace("/var/cache/sglang", "/home/alice/.cache/sglang"),
        "DynamicUser= gives": UNIT.replace(
            "Environment=SGLANG_CACHE_DIR=/var/cache/sglang", "DynamicUser=yes"
        ),
    }
    for needle, unit in cases.items():
        (said,) = cache_warnings(UNIT, unit, {}, FITS, LastStart(PHASES))
        assert needle in said and "DeepGEMM" in said and "min" in said, said


def test_another_venv_path_throws_the_deepgemm_cache_away() -> None:
    moved = UNIT.replace("/opt/sglang/bin/python", "/opt/sglang-0.5.24/bin/python")
    (said,) = cache_warnings(UNIT, moved, {}, FITS, None)
    assert "/opt/sglang-0.5.24" in said and "keyed to the install path" in said


def test_a_checkpoint_beyond_the_page_cache_and_the_drop_cache_flag_are_warned() -> None:
    (said,) = cache_warnings(UNIT, UNIT, {}, TOO_BIG, LastStart(PHASES))
    assert "does not fit in page cache" in said and "~306 s of weights" in said
    flags = {"weight-loader-drop-cache-after-load": True}
    (said,) = cache_warnings(UNIT, UNIT, flags, FITS, LastStart(PHASES))
    assert "evicts what pre-warm loaded" in said and "~306 s" in said


def test_from_facts_without_a_verified_start_gives_no_number() -> None:
    facts: HostFacts = {"unit_text": UNIT, "history": []}
    e = from_facts(facts, UNIT, {}, FITS)
    assert e.seconds is None and e.to_dict()["restart_estimate_s"] is None
    assert "no verified start" in e.lines()[0]


def test_from_facts_reads_the_checkpoint_and_the_hosts_memory() -> None:
    facts: HostFacts = {
        "unit_text": UNIT,
        "history": [{"downtime": {"seconds": 400.0, "phases": PHASES}}],  # type: ignore[typeddict-item]
        "mem_available_bytes": 100 * GIB,
        "model_facts": {"model": {"config": {}, "weights_bytes": 235 * GIB, "path": "/models/q"}},
    }
    e = from_facts(facts, UNIT, {}, FITS)
    assert e.seconds == 387.2 and any("does not fit in page cache" in w for w in e.warnings)


def test_an_adopted_host_is_estimated_from_sglangs_own_engine_timings() -> None:
    timings = {"load_weight": 41.2, "kv_cache_allocation": 1.3, "scheduler_e2e": 60.0, "cuda_graph": 10.0,
               "tokenizer_e2e": 75.0}  # fmt: skip
    facts: HostFacts = {"unit_text": UNIT, "history": [], "last_start": {"startup_timings": timings}}
    e = from_facts(facts, UNIT, {}, FITS)
    assert e.parts == {"init": 22.5, "weights": 41.2, "pool": 1.3, "cuda_graphs": 10.0}
    assert e.seconds == 75.0
