"""Never recommend what already failed: a start that ran out of memory bounds the fraction.

A start that built its pool at fraction f and then ran out of memory (capturing CUDA graphs, or later)
proves that at f the runtime needed more than the slack pre × (1 − f) left it. The model's runtime need is
raised to at least that slack, so every fraction at or above f leaves nothing free, and the memory floor
keeps the plan below it. A start that failed before its pool (weights) says nothing about the fraction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.plan.model import PoolModel, StartFigures

_OUT_OF_MEMORY = ("cuda_oom", "cuda_graph_failed")  # agent/sglang/logs/events.py failure kinds


@dataclass(frozen=True)
class FailedStart:
    fraction: float
    graphs: bool  # it died capturing CUDA graphs
    requests: int
    context: int


def failed_starts(starts: Sequence[StartFigures], requests: int, context: int) -> list[FailedStart]:
    """The starts that ran out of memory after their pool was built, at a known fraction."""
    found = []
    # a log's other failed starts come with the start that calibrates, each with its own fraction
    for s in [f for start in starts for f in (start, *(start.get("other_failures") or ()))]:
        failure: Mapping[str, object] = s.get("failure") or {}
        kind, line = str(failure.get("kind") or ""), str(failure.get("line") or "")
        graphs = kind == "cuda_graph_failed" or "graph" in line.lower()
        if kind not in _OUT_OF_MEMORY or (kind == "cuda_graph_failed" and "memory" not in line.lower()):
            continue
        fraction = s.get("mem_fraction_static")
        if not fraction or not (s.get("kv_tokens") or graphs):
            continue  # no fraction, or it died loading the weights: the fraction was not the cause
        found.append(FailedStart(
            float(fraction), graphs,
            int(s.get("max_running_requests") or requests), int(s.get("context_len") or context),
        ))  # fmt: skip
    return found


def bounded(model: PoolModel, failed: Sequence[FailedStart]) -> tuple[PoolModel, list[str]]:
    """The model with its runtime need raised so no failed fraction leaves memory free; the notes say why."""
    notes = []
    for f in failed:
        short = model.reserve_gib(f.fraction, f.requests, f.context)
        if short > 0:
            model = replace(model, runtime_gib=model.runtime_gib + short, runtime_measured=True)
        what = "capturing CUDA graphs" if f.graphs else "after its pool was built"
        graphs = (
            f"; the graphs and activations need at least {model.runtime_gib:.2f} GiB per GPU"
            if f.graphs
            else ""
        )
        notes.append(
            f"an earlier start at --mem-fraction-static {f.fraction:.3f} ran out of GPU memory {what}: "
            f"the plan stays below it with the memory floor free{graphs}"
        )
    return model, notes
