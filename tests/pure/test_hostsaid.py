"""What the HiCache plan says about its sizing flags as given and a host pool no larger than the device pool
(agent/plan/hostsaid.py), against SGLang 0.5.23's own warning and rules."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.output import Output
from agent.plan.hostsaid import sglang_warns_small
from tests.pure.test_hostpool_oracle import CASES, plan
from tests.pure.test_newcomer41_findings import GIB, qwen

SMALL = "smaller than the device pool"


def plan_json(tmp_path: Path, data: dict[str, Any], *argv: str) -> dict[str, Any]:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["plan", "--facts", str(path), "--context", "32k", "--json", *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    assert code in (0, 8), out.stderr.getvalue()
    return json.loads(out.stdout.getvalue())  # type: ignore[no-any-return]


def said(plan: dict[str, Any]) -> str:
    return "\n".join(plan["warnings"] + plan["notes"])


def test_the_small_pool_test_is_sglangs_on_every_recorded_pool() -> None:
    """Every pool SGLang's own code built in the oracle cases: it logged its warning exactly where the plan's
    test says it would (base.py:237-245)."""
    checked = 0
    for case in CASES:
        pool, got = plan(case)
        if got is None or not case["answer"]["ok"]:
            continue
        logged = any(SMALL in line for line in case["answer"]["logs"])
        assert sglang_warns_small(got.tokens, pool.device_tokens) == logged, case["case"]
        checked += 1
    assert checked > 100


@pytest.mark.parametrize(("size", "warned"), [(51, True), (52, False)])
def test_the_size_the_small_pool_warning_offers_is_the_smallest_that_clears_it(
    tmp_path: Path, size: int, warned: bool
) -> None:
    """Qwen3-32B TP 4 (793,120 device tokens, 65,536 B each): the warning at 32 offers 52 per rank, which
    clears it where the host has the room (1 TiB here), and 51 does not."""
    assert "--hicache-size 52 per rank" in said(plan_json(tmp_path, qwen(**{"hicache-size": 32})))
    data = qwen(**{"hicache-size": size})
    data["host_memory"].update(total=1024 * GIB, available=1000 * GIB)
    got = plan_json(tmp_path, data)
    assert got["feasible"] is True
    assert (SMALL in said(got)) is warned


def decode(**flags: Any) -> dict[str, Any]:
    data = qwen()
    data["flags"] = {"tp-size": 4, "disaggregation-mode": "decode", "max-running-requests": 64, **flags}
    return data


def test_a_decodes_retraction_backup_is_no_small_pool_warning(tmp_path: Path) -> None:
    """A backup sized at 0.2 of the device pool by design (kv_cache_builder.py:244-258): no cache tier."""
    got = plan_json(tmp_path, decode())
    assert got["host_pool"]["backup"] == "decode-retraction"
    assert got["host_pool"]["tokens"] < got["predicted_pool_tokens"]
    assert SMALL not in said(got)


def test_a_decodes_explicit_size_is_named_as_given(tmp_path: Path) -> None:
    notes = plan_json(tmp_path, decode(**{"hicache-size": 5}))["notes"]
    line = next(x for x in notes if "retraction" in x)
    assert "--hicache-size 5 GB, as given" in line and "auto size" not in line, line


def test_a_fraction_an_explicit_ratio_turns_off_is_named(tmp_path: Path) -> None:
    """hicache_hook.py:122-123: an explicit ratio resolves the fraction to None; the unit leaves both out
    for the size it renders, and the text says so, and what the ratio became."""
    got = plan_json(tmp_path, qwen(**{"hicache-ratio": 1, "hicache-host-memory-fraction": 0.5}))
    assert got["flags"]["hicache-host-memory-fraction"] is False and got["flags"]["hicache-ratio"] is False
    text = said(got)
    assert "--hicache-host-memory-fraction 0.5 has no effect" in text and "the unit leaves it out" in text
    assert f"--hicache-size {got['flags']['hicache-size']} GB per rank in place of --hicache-ratio 1" in text


def test_the_auto_size_fixed_as_a_size_is_named_and_a_lone_fraction_is_not_dropped(tmp_path: Path) -> None:
    got = plan_json(tmp_path, qwen(**{"hicache-host-memory-fraction": 0.5}))
    text = said(got)
    assert "in place of SGLang's auto size (--hicache-host-memory-fraction 0.5)" in text
    assert "has no effect" not in text
