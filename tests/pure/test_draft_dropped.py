"""A draft dropped since the calibrating start is planned as one added is: its weights come back to the memory
after the weights, and the gate is not told these flags gave the planned pool before."""

from __future__ import annotations

import json
from pathlib import Path

from agent.apply import calibrated_pool, make_plan
from agent.inventory import load_service
from agent.orchestrate.asked import Change
from agent.sglang.logs.starts import split
from tests.pure.test_review39 import run

ROOT = Path(__file__).resolve().parents[2]
LOG = str(ROOT / "examples" / "ct200-start.log")
DROP = ("--set", "speculative-algorithm=false", "--set", "speculative-draft-model-path=false")


def test_dropping_the_draft_gives_back_its_weights(tmp_path: Path) -> None:
    from tests.pure.test_plan_cmd import HOST_TOML

    argv = (
        "plan",
        "ct200",
        "--context",
        "32768",
        "--mem-fraction-static",
        "0.85",
        "--from-log",
        LOG,
        "--json",
    )
    _, kept, _ = run(tmp_path, HOST_TOML, *argv)
    _, dropped, _ = run(tmp_path, HOST_TOML, *argv, *DROP)
    was, now = json.loads(kept), json.loads(dropped)
    # the draft's 1.20 GiB per GPU come back: at least its weights' worth of tokens more
    per_token = now["cell_bytes"]
    assert now["post_gib"] - was["post_gib"] >= 1.19, (was["post_gib"], now["post_gib"])
    assert now["predicted_pool_tokens"] - was["predicted_pool_tokens"] >= 0.85 * 1.19 * 2**30 / per_token


def test_the_gate_does_not_call_a_dropped_drafts_pool_an_anomaly() -> None:
    host = load_service("ct200", ROOT / "units")
    last = split((ROOT / "examples" / "ct200-start.log").read_text(encoding="utf-8").splitlines())[-1]
    facts = {"flags": dict(host.sglang.flags), "last_start": last.figures()}
    same = make_plan(host, Change(context=32768), facts)  # type: ignore[arg-type]
    drop = Change(
        context=32768, flags=(("speculative-algorithm", False), ("speculative-draft-model-path", False))
    )
    dropped = make_plan(host, drop, facts)  # type: ignore[arg-type]
    assert calibrated_pool(same)
    assert not calibrated_pool(dropped), dropped.evidence
