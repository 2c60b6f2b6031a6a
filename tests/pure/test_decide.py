"""The gate's decisions, one observation at a time."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.change.decide import ANOMALY_SHARE, Gate, Observation, decide, exit_words
from agent.protocol.requests import Timeouts

T = Timeouts(weights_s=100, pool_s=50, ready_s=30, no_progress_s=20)
GATE = Gate(target_context=200_000, planned_pool=204_146, margin=0.02, timeouts=T)
HEALTHY_ONLY = Gate(None, None, 0.0, T)
START = Observation(
    now=10.0,
    restarted_at=0.0,
    last_line_at=9.0,
    weights_done_at=None,
    pool_at=None,
    kv_tokens=None,
    failure_kind=None,
    failure_line=None,
    ready=False,
    active_state="active",
    sub_state="running",
    restarts_since=0,
)


def test_nothing_yet_means_wait() -> None:
    assert decide(START, GATE, pool_passed=False).action == "wait"


@pytest.mark.parametrize(
    ("pool", "action"),
    [(204_141, "pool_ok"), (200_063, "pool_ok"), (199_999, "fail"), (101_134, "fail")],
)
def test_pool_against_target_and_planned_minus_margin(pool: int, action: str) -> None:
    v = decide(replace(START, kv_tokens=pool, pool_at=10.0), GATE, pool_passed=False)
    assert v.action == action
    if action == "fail":
        assert v.kind == "pool_short" and f"{pool:,}" in v.reason


def test_pool_far_below_the_plan_fails_even_above_the_target() -> None:
    gate = replace(GATE, planned_pool=300_000)
    v = decide(replace(START, kv_tokens=250_000, pool_at=10.0), gate, pool_passed=False)
    assert v.action == "fail" and "planned 300,000" in v.reason


def test_ready_after_the_pool_passed() -> None:
    obs = replace(START, kv_tokens=204_141, pool_at=5.0, ready=True)
    assert decide(obs, GATE, pool_passed=True).action == "ready"


def test_ready_without_any_pool_line_is_a_failure() -> None:
    v = decide(replace(START, ready=True), HEALTHY_ONLY, pool_passed=False)
    assert v.action == "fail" and "no KV pool" in v.reason


def test_old_unit_only_needs_a_pool_and_ready() -> None:
    obs = replace(START, kv_tokens=101_134, pool_at=5.0)
    assert decide(obs, HEALTHY_ONLY, pool_passed=False).action == "pool_ok"
    assert decide(replace(obs, ready=True), HEALTHY_ONLY, pool_passed=True).action == "ready"


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"failure_kind": "cuda_oom", "failure_line": "CUDA out of memory"}, "sglang_failure"),
        ({"active_state": "failed", "sub_state": "failed"}, "service_failed"),
        ({"active_state": "activating", "sub_state": "auto-restart"}, "service_failed"),
        ({"restarts_since": 1}, "service_failed"),
        ({"now": 31.0, "last_line_at": 10.0}, "no_progress"),
        ({"now": 101.0, "last_line_at": 100.0}, "timeout"),
        ({"now": 70.0, "last_line_at": 69.0, "weights_done_at": 15.0}, "timeout"),
        ({"now": 50.0, "last_line_at": 49.0, "kv_tokens": 204_141, "pool_at": 15.0}, "timeout"),
    ],
)
def test_failures_are_seen_at_once(change: dict[str, object], kind: str) -> None:
    v = decide(replace(START, **change), GATE, pool_passed="kv_tokens" in change)  # type: ignore[arg-type]
    assert (v.action, v.kind) == ("fail", kind), v


def test_a_failure_line_wins_over_a_good_pool() -> None:
    obs = replace(START, kv_tokens=204_141, pool_at=5.0, failure_kind="rank_died", failure_line="Rank 3 died")
    assert decide(obs, GATE, pool_passed=True).kind == "sglang_failure"


# PR#36583: SGLang logged 1,741 tokens where its own sizing gave 349,377 (loader temporaries still held).
FORGED = replace(GATE, target_context=65_536, planned_pool=349_377, calibrated=True)


def test_a_forged_pool_far_below_a_calibrated_plan_is_an_sglang_anomaly() -> None:
    v = decide(replace(START, kv_tokens=1_741, pool_at=10.0), FORGED, pool_passed=False)
    assert v.action == "fail" and v.kind == "pool_anomaly"
    assert "the pool SGLang logged is not what these flags give on this host: an SGLang anomaly" in v.reason
    assert "1,741" in v.reason and "349,377" in v.reason


def test_a_pool_far_above_a_calibrated_plan_is_an_anomaly_too() -> None:
    # PR#34053: the daemon's resident weights counted as free memory: a pool larger than the GPU allows.
    v = decide(replace(START, kv_tokens=520_000, pool_at=10.0), FORGED, pool_passed=False)
    assert v.kind == "pool_anomaly"


def test_without_a_calibration_a_short_pool_stays_a_fraction_problem() -> None:
    gate = replace(FORGED, calibrated=False)
    v = decide(replace(START, kv_tokens=1_741, pool_at=10.0), gate, pool_passed=False)
    assert v.kind == "pool_short"


@given(st.integers(min_value=1, max_value=2_000_000))
def test_anomaly_exactly_when_more_than_the_share_off_a_calibrated_plan(pool: int) -> None:
    v = decide(replace(START, kv_tokens=pool, pool_at=10.0), FORGED, pool_passed=False)
    far = abs(pool - 349_377) > ANOMALY_SHARE * 349_377
    assert (v.kind == "pool_anomaly") is far
    if not far:
        assert v.kind in (None, "pool_short")


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        (1, 1, "exit status 1"),
        (1, 219, "exit status 219/CGROUP: systemd failed to set the process up, SGLang never ran"),
        (1, 243, "exit status 243/CREDENTIALS: systemd failed to set the process up, SGLang never ran"),
        (1, 244, "exit status 244/SETUP: systemd failed to set the process up, SGLang never ran"),
        (2, 9, "killed by SIGKILL"),
        (3, 6, "killed by SIGABRT, core dumped"),
        (0, 0, ""),
    ],
)
def test_a_dead_service_says_how_its_process_ended(code: int, status: int, words: str) -> None:
    """A start that died before SGLang logged a line (systemd could not set it up) names the cause."""
    assert exit_words(code, status) == words
    dead = replace(START, active_state="activating", sub_state="auto-restart", exit=words)
    verdict = decide(dead, GATE, pool_passed=False)
    assert verdict.reason == "the service stopped: activating/auto-restart" + (f" ({words})" if words else "")
