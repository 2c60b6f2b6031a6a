"""Where a host's facts name an SGLang release whose sizing differs from 0.5.23's, the plan follows that
release's rule and says so: the rocm/sgl-dev 0.5.9 images open quick all-reduce (agent/plan/overhead.py
release_quick_reduce), which cost a GLM-5 (DSA) start on MI355X 2.2 % of its pool against 0.5.8.post1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.plan.facts import parse_facts
from agent.plan.predict import pool_model

DATA = Path(__file__).resolve().parents[1] / "data"
STARTS = {s["id"]: s for s in json.loads((DATA / "public-starts.json").read_text())["starts"]}
GIB = 1 << 30


def cold(start: dict[str, Any], version: str, env: dict[str, str] | None = None) -> Any:
    """The cold plan of a public start, as a host reporting `version` would have it (no last start)."""
    gpu, tp = start["gpu"], int(start["flags"]["tp-size"])
    config = json.loads((DATA / "models" / start["model"] / "config.json").read_text())
    doc = {
        "format": "deployctl-facts/1", "sglang": {"version": version}, "flags": start["flags"],
        "gpus": [{"name": gpu["name"], "memory_total_mib": gpu["memory_total_mib"]}] * gpu["count"],
        "model": {"config": config, "weights_bytes": round(start["weights_gib_per_gpu"] * GIB * tp)},
        "env": env or {}, "last_start": None,
    }  # fmt: skip
    return pool_model(parse_facts(doc), 32768)


@pytest.mark.parametrize(
    ("start", "version"),
    [("mi355x-glm5-fp8-tp8-sgl-dev-0.5.8", "0.5.8.post1"), ("mi355x-glm5-fp8-tp8-sgl-dev-0.5.9", "0.5.9")],
)
def test_each_release_is_planned_by_its_own_rule(start: str, version: str) -> None:
    logged = STARTS[start]["logged"]["tokens"]
    model = cold(STARTS[start], version)
    assert abs(model.pool.pool(model.fraction) / logged - 1) < 0.005  # within the oracle's tolerance
    said = any("quick all-reduce" in n and "0.5.9" in n for n in model.notes)
    assert said == (version == "0.5.9")


def test_a_unit_that_sets_quick_reduce_itself_is_planned_as_it_says() -> None:
    start = STARTS["mi355x-glm5-fp8-tp8-sgl-dev-0.5.9"]
    off = cold(start, "0.5.9", {"ROCM_QUICK_REDUCE_QUANTIZATION": "NONE"})
    rule = cold(start, "0.5.9")
    assert off.pool.pool(off.fraction) > rule.pool.pool(rule.fraction)
    assert not any("0.5.9's ROCm images" in n for n in off.notes)
    assert cold(start, "0.5.9", {"ROCM_QUICK_REDUCE_QUANTIZATION": "INT4"}).pool.pool(0.9) == rule.pool.pool(
        0.9
    )


def test_an_nvidia_host_under_0_5_9_is_not_changed() -> None:
    start = {**STARTS["mi355x-glm5-fp8-tp8-sgl-dev-0.5.9"]}
    start["gpu"] = {"name": "NVIDIA B200", "memory_total_mib": 183359, "count": 8}
    start["weights_gib_per_gpu"] = 80.0
    assert cold(start, "0.5.9").pool.pool(0.85) == cold(start, "0.5.8.post1").pool.pool(0.85)
