"""Every fraction a plan states is the one the unit gets: three decimals everywhere (notes, --json, flags)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.plan.choose import Plan, Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0"}
LONG = re.compile(r"(?:fraction\D{0,12}|would use |\"mem-fraction-static\": )(\d\.\d{4,})")


def fractions_said(plan: Plan) -> list[str]:
    text = json.dumps(plan.to_dict()) + "\n".join(plan.notes)
    return LONG.findall(text)


@pytest.mark.parametrize(
    ("model", "context"),
    [
        ("llama-3.1-8b", 8192),
        ("qwen3-vl-8b-instruct", 8192),
        ("qwen3-vl-8b-instruct", 32768),
        ("llama-3.1-8b", 10**6),
    ],
)
def test_sglang_default_fraction_is_carried_with_three_decimals(model: str, context: int) -> None:
    config = json.loads((MODELS / model / "config.json").read_text())
    doc = {
        "format": "deployctl-facts/1", "gpus": [H100], "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": int(16e9)}, "flags": {},
    }  # fmt: skip
    plan = plan_from_facts(parse_facts(doc), Target(context))
    assert fractions_said(plan) == []
    assert plan.mem_fraction_static == round(plan.mem_fraction_static, 3)
    assert plan.flags()["mem-fraction-static"] == plan.mem_fraction_static
