"""The report, as an engineer reads it afterwards: golden texts, regenerated with --update-golden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import load_host
from agent.plan.choose import Target
from agent.plan.from_facts import plan_for_host
from agent.report import ApplyReport, backups_table, render_report

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "report"
START_085 = {
    "kv_tokens": 101_134,
    "avail_mem_before_weights_gb": 92.80,
    "avail_mem_before_pool_gb": 21.12,
    "available_gpu_mem_gb": 10.86,
    "graph_mem_gb": 3.08,
    "mem_fraction_static": 0.85,
    "max_running_requests": 64,
    "context_len": 32768,
}


def build(case: dict[str, Any]) -> ApplyReport:
    host = load_host("ct200", REPO / "units")
    target = case.get("target")
    plan = plan_for_host(host, Target(target), [START_085], host.sglang.flags) if target else None
    after = {**host.sglang.flags, **(plan.flags() if plan else {})}
    return ApplyReport(
        "ct200",
        "sglang.service",
        target,
        plan,
        host.sglang.flags,
        after,
        case["outcome"],
        case["message"],
        case["data"],
        next_plan=plan_for_host(host, Target(target), [case["data"]["summary"]], host.sglang.flags)
        if case["outcome"] == "rolled_back"
        else None,
    )


CASES = sorted(GOLDEN.glob("*.json"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_report(path: Path, request: pytest.FixtureRequest) -> None:
    text = render_report(build(json.loads(path.read_text())))
    expected = path.with_suffix(".txt")
    if request.config.getoption("--update-golden"):
        expected.write_text(text)
    assert text == expected.read_text(), f"{path.name}: rerun with --update-golden and review the diff"


def test_applied_report_says_what_the_seed_engineer_said() -> None:
    text = render_report(build(json.loads((GOLDEN / "applied_200k.json").read_text())))
    for needle in (
        "--mem-fraction-static",  # the before/after table
        "measured pool:         204,141 tokens (meets the target)",
        "full-context requests: 1 at once",
        "memory left per GPU:",
        "do not push the fraction higher",
        "60,010 prompt tokens",
        "deployctl rollback ct200 --to sglang.service.bak.20261202T120000Z",
        "fewer short prompts",
    ):
        assert needle in text, needle


def test_backups_table_lists_newest_first_with_their_flag_differences() -> None:
    rows = [
        {"name": "b2", "taken": "2026-12-02T12:00:00+00:00", "size": 1600, "same_as_installed": True},
        {
            "name": "b1",
            "taken": "2026-12-01T12:00:00+00:00",
            "size": 1500,
            "changes": [["context-length", "32768", "200000"]],
        },
    ]
    text = backups_table("ct200", rows)
    assert text.index("b2") < text.index("b1") and "(same as installed)" in text
    assert "--context-length: 32768 in the backup, 200000 installed" in text


def test_an_sglang_anomaly_quotes_the_evidence_and_suggests_no_fraction() -> None:
    case = json.loads((GOLDEN / "rolled_back_anomaly.json").read_text())
    text = render_report(build(case))  # build() passes a next plan: the report must not show it
    assert "the pool SGLang logged is not what these flags give on this host: an SGLang anomaly" in text
    assert "KV size (GB) 0.11" in text and "--mem-fraction-static 0.922" in text
    assert "next recommendation" not in text and "no new fraction" in text


def test_the_report_compares_the_restart_estimate_with_what_the_restart_took() -> None:
    from dataclasses import replace

    case = json.loads((GOLDEN / "applied_200k.json").read_text())
    case["data"]["downtime"] = {
        "seconds": 60.0,
        "phases": {"drain": 5.0, "stop": 2.0, "init": 10.0, "weights": 30.0, "ready": 8.0, "smoke": 5.0},
    }
    text = render_report(replace(build(case), restart_estimate_s=40.0))
    assert "restart estimate:      40.0 s before; took 50.0 s (stop to ready), 1.25x" in text
