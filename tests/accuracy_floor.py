"""The memory floor's section of docs/accuracy.md: its cold CUDA-graph estimate and its activation part
against the public capture lines in tests/data/graph-captures.json (agent/plan/floor.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.plan.floor import GRAPH_FIT, Shapes, activation_gib, graph_gib, shapes
from agent.sglang.config_json import ModelConfig

DATA = Path(__file__).resolve().parents[1] / "tests/data"


def _source(point: dict[str, Any]) -> str:
    source = str(point["source"])
    return f"[{point['id']}]({source})" if source.startswith("https://") else f"{point['id']} ({source})"


def _verdict(estimate: float, logged: float, miss: str | None) -> str:
    if estimate >= logged:
        return "covered" + (" (marked a miss: drop the mark)" if miss else "")
    return f"miss: {miss}" if miss else "miss: under the logged graphs"


def graph_rows(captures: dict[str, Any]) -> list[str]:
    rows = ["| start | model | TP | batch sizes up to | logged GiB | cold estimate GiB | verdict |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in captures["points"]:
        estimate = graph_gib(Shapes(1, p["layers"], 0, 0, p["moe"], 2), p["bs"])
        kind, verdict = "MoE" if p["moe"] else "dense", _verdict(estimate, p["mem_usage_gb"], p.get("miss"))
        rows.append(
            f"| {_source(p)} | {p['model']} ({kind}, {p['layers']} layers) | {p['tp']} | {p['bs']} | "
            f"{p['mem_usage_gb']:.2f} | {estimate:.2f} | {verdict} |"
        )
    return rows


def prefill_rows(captures: dict[str, Any]) -> list[str]:
    rows = [
        "| start | model | TP | chunk | logged GiB | activation part GiB | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in captures["prefill"]:
        config = ModelConfig(json.loads((DATA / "models" / p["model"] / "config.json").read_text()))
        shape = shapes(config, p["tp"], 2)
        estimate = activation_gib(shape, p["chunk"]) if shape is not None else 0.0
        rows.append(
            f"| {_source(p)} | {p['model']} | {p['tp']} | {p['chunk']:,} | {p['mem_usage_gb']:.2f} | "
            f"{estimate:.2f} | {_verdict(estimate, p['mem_usage_gb'], p.get('miss'))} |"
        )
    return rows


def section() -> list[str]:
    captures = json.loads((DATA / "graph-captures.json").read_text(encoding="utf-8"))
    fit = GRAPH_FIT
    return [
        "## The memory floor against public captures",
        "",
        "A plan keeps the memory floor free per GPU after the pool (docs/planning.md). Cold, its CUDA-graph "
        f"part is {fit.fixed_gib:.3f} GiB + {fit.dense_kib:.0f} KiB (dense) or {fit.moe_kib:.0f} KiB (MoE) "
        "per captured batch size per layer: the upper envelope of these decode captures ('Capture cuda graph "
        "end ... mem usage'). Under-estimating them is the error that costs a restart; the misses are named.",
        "",
        *graph_rows(captures),
        "",
        "SGLang 0.5.23 also captures prefill graphs up to the chunked-prefill size by default on CUDA; the "
        "floor's activation part (one prefill chunk from the model's shapes, x 2 for the allocator) covers "
        "them:",
        "",
        *prefill_rows(captures),
    ]
