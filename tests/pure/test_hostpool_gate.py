"""HiCache's host pool after the start: SGLang's own line in the start's figures, the gate against the
plan's pool, the report's fix for host_memory_short, the metrics, and the request that carries the plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.host.change.decide import Failure, Gate, Observation, decide
from agent.host.metrics import Run, prom_text, run_from
from agent.protocol.common import ProtocolError
from agent.protocol.events import Outcome
from agent.protocol.requests import Request, Timeouts
from agent.report import ApplyReport, render_report
from agent.sglang.logs.summary import SummaryBuilder

LINES = [
    f"[2026-12-06 04:00:00 TP{rank}] Allocating kv hierarchical KV host pool: {tokens} tokens, "
    "107.88 GB host memory."
    for rank, tokens in ((1, 823061), (0, 823060))
]
T = Timeouts(weights_s=100, pool_s=50, ready_s=30, no_progress_s=20)
OBS = Observation(10.0, 0.0, 9.0, 5.0, None, None, None, None, False, "active", "running", 0)


def test_the_start_summary_carries_the_smallest_ranks_host_pool() -> None:
    b = SummaryBuilder()
    for line in LINES:
        b.feed(line)
    s = b.summary().to_dict()
    assert (s.get("host_pool_tokens"), s.get("host_pool_gb")) == (823060, 107.88)
    assert "host_pool_tokens" not in SummaryBuilder().summary().to_dict()  # no HiCache: no key


@pytest.mark.parametrize(
    ("logged", "fails"), [(823060, False), (823059, True), (823061, True), (None, False)]
)
def test_the_gate_holds_the_host_pool_to_the_planned_token(logged: int | None, fails: bool) -> None:
    gate = Gate(32_000, 411_540, 0.02, T, planned_host_pool=823_060)
    verdict = decide(replace(OBS, host_pool_tokens=logged), gate, pool_passed=False)
    assert (verdict.kind is Failure.HOST_POOL_MISMATCH) is fails
    if fails:
        assert f"{logged:,}" in verdict.reason and "823,060 planned" in verdict.reason
    # no planned host pool (no HiCache, an old laptop): the line is not judged
    assert decide(replace(OBS, host_pool_tokens=1), Gate(32_000, None, 0.02, T), False).kind is None


def test_the_request_carries_the_planned_host_pool() -> None:
    req = Request("apply", unit_text="ExecStart=/bin/true\n", target_context=1000, planned_host_pool=823060)
    assert Request.from_json(req.to_json()).planned_host_pool == 823060
    for bad in (0, -1, "823060", 1.5):
        with pytest.raises(ProtocolError):
            Request.from_json(replace(req, planned_host_pool=bad).to_json())  # type: ignore[arg-type]


def test_metrics_carry_the_host_pool() -> None:
    req = Request("apply", unit_text="ExecStart=/bin/true\n", target_context=1000, planned_host_pool=823060)
    data = {"summary": {"kv_tokens": 411540, "host_pool_tokens": 823060, "host_pool_gb": 107.88},
            "planned_host_pool": 823060}  # fmt: skip
    run = run_from(req, Outcome.APPLIED, 100.0, data, [])
    text = prom_text(run, 0, 100.0)
    assert 'deployctl_host_pool_tokens{host="' in text and "} 823060\n" in text
    assert "deployctl_host_pool_gigabytes{" in text and "} 107.88\n" in text
    assert "deployctl_planned_host_pool_tokens{" in text
    assert "deployctl_host_pool" not in prom_text(Run("h", "u", Outcome.APPLIED, 1.0), 0, None)


def test_a_host_memory_short_rollback_says_what_to_set() -> None:
    line = (
        "ValueError: Not enough host memory available. Requesting 107.88 GB but only have 41.20 GB free. "
        "Please reduce the size of the hierarchical cache."
    )
    failure = {"kind": "host_memory_short", "line": line}
    data = {"outcome": "rolled_back", "reason": "SGLang failed", "summary": {"failure": failure}}
    report = ApplyReport("ct200", "u", 32000, None, {}, {}, "rolled_back", "rolled back", data)  # type: ignore[arg-type]
    text = render_report(report)
    assert "what to do:" in text and "--hicache-size to at most 40 (GB per rank)" in text
