"""The rule (plan/verdict.py): a verdict never contradicts the numbers printed beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
A100_40 = {"name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960, "compute_capability": "8.0"}


def qwen3_32b_on_two_a100s(**flags: Any) -> dict[str, Any]:
    config = json.loads((MODELS / "qwen3-32b" / "config.json").read_text())
    return {
        "format": "deployctl-facts/1", "gpus": [A100_40] * 2, "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": int(65.5e9)}, "flags": {"tp-size": 2, **flags},
        "planning": {"reserve_floor_gib": 4.0},  # the floor these cases were found under, stated
    }  # fmt: skip


def test_not_feasible_names_a_pool_short_of_what_is_needed() -> None:
    # Was: "NOT FEASIBLE because ... holds 33,682 tokens of the 33,424 needed" (the decision used the low end
    # of the cold estimate, the message the prediction).
    p = plan_from_facts(parse_facts(qwen3_32b_on_two_a100s()), Target(32_768))
    assert not p.feasible and p.binding is not None
    held, needed = (
        int(n.replace(",", "")) for n in re.findall(r"([\d,]+) tokens?.*? of the ([\d,]+)", p.binding)[0]
    )
    assert held < needed and held == p.predicted_pool_low_tokens < p.target_pool_tokens


def test_a_smaller_context_offered_is_one_that_fits() -> None:
    # Was: "a smaller context: 33,000 ... (still short of 33,000)" beside a pool of 33,682.
    p = plan_from_facts(parse_facts(qwen3_32b_on_two_a100s()), Target(32_768))
    smaller = [a for a in p.alternatives if "context-length" in a.flags]
    assert smaller and all("still short" not in a.effect for a in smaller)
    for alt in smaller:
        again = plan_from_facts(
            parse_facts(qwen3_32b_on_two_a100s(**alt.flags)), Target(int(str(alt.flags["context-length"])))
        )
        assert again.feasible
