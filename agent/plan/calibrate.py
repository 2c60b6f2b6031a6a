"""A pool model fitted to the starts that logged their pool: the memory they show, and the cell.

Follows SGLang 0.5.23's sizing (the pool from the memory before and after the weights and the fraction
the start resolved, 2-decimal logs): a measured cell within CELL_AGREEMENT is the architecture's seen through
rounding; beyond CELL_EVIDENCE the start is not one of this model under these flags (plan/evidence.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.inventory import FlagValue
from agent.plan.evidence import CELL_EVIDENCE, NotEvidence
from agent.plan.model import CELL_AGREEMENT, PoolModel, Start, runtime_need, with_graphs
from agent.sglang import pools
from agent.sglang.kvpool import GIB


@dataclass(frozen=True)
class Fit:
    """How a calibration reads the starts: the flags, where the architecture came from, its gaps."""

    flags: Mapping[str, FlagValue]
    origin: str
    gaps: tuple[str, ...]


def calibrated(
    starts: list[Start], shaped: tuple[PoolModel, pools.PoolSizer], notes: list[str], fit: Fit
) -> PoolModel:
    """Fit post to the logged pools (2-decimal logs); a cell far from the architecture's is measured."""
    shape, sizer = shaped
    starts = [_fraction_of(s, sizer, notes) for s in starts]
    pre = sum(s.pre for s in starts) / len(starts)
    posts, measured = [], []
    for s in starts:
        # The logged fraction is the resolved one (the server_args line): SGLang's own scaling is in it.
        rest = s.post - s.pre * (1 - s.fraction)
        predicted = sizer.tokens(rest)
        measured.append(predicted / s.tokens if s.tokens else 1.0)
        # Move post by what the logged token count says the 2-decimal figure hid.
        posts.append(s.post + (s.tokens - predicted) * sizer.effective_cell() / GIB)
    off = _cell_off(measured, fit)
    if off <= CELL_AGREEMENT and not fit.gaps:
        post, cell, how = sum(posts) / len(posts), sizer.cell_bytes, "the architecture's cell"
    else:
        post = sum(s.post for s in starts) / len(starts)
        sizer = replace(sizer, cell_bytes=sizer.cell_bytes * sum(measured) / len(measured))
        why = (
            f"{fit.origin} lacks {', '.join(fit.gaps)}"
            if fit.gaps
            else f"the architecture's is {off:.1%} off: check {fit.origin}"
        )
        cell, how = sizer.cell_bytes, f"a measured cell ({why})"
    base = replace(shape, pre_gib=pre, post_gib=post, cell_bytes=cell, sizer=sizer)
    base = replace(base, basis="calibrated", runtime_measured=True)
    runtime, measured_runtime = runtime_need(starts, base)
    notes.append(
        f"calibrated from {len(starts)} earlier start(s): pre {pre:.2f} GiB, post {post:.4f} GiB, {how}"
    )
    # The CUDA-graph memory the start logged, credited per request count (model.py GRAPH_SCALING_SHARE).
    return with_graphs(
        replace(base, runtime_gib=runtime, runtime_measured=measured_runtime), starts, fit.flags
    )


def _fraction_of(s: Start, sizer: pools.PoolSizer, notes: list[str]) -> Start:
    """A start whose log lost its server_args line (`journalctl --since`, `-n`) does not say its fraction:
    its pool and memory lines do (SGLang sizes the pool from post - pre x (1 - f),
    mem_cache/kv_cache_configurator.py), so the plan's own is not assumed for it, where the pool is this
    cell's at the plan's fraction within CELL_EVIDENCE (beyond, the cell check sets the start aside)."""
    if s.fraction_logged or not s.pre or not s.tokens:
        return s
    if abs(sizer.tokens(s.post - s.pre * (1 - s.fraction)) / s.tokens - 1) > CELL_EVIDENCE:
        return s
    fraction = round(1 - (s.post - s.tokens * sizer.effective_cell() / GIB) / s.pre, 4)
    notes.append(
        "the earlier start's log does not say its --mem-fraction-static (no server_args line): "
        f"{fraction:.4f} from its pool and its memory before and after the weights"
    )
    return replace(s, fraction=fraction)


def _cell_off(measured: list[float], fit: Fit) -> float:
    """How far the measured cell is from the architecture's; beyond CELL_EVIDENCE the start is not one of
    this model under these flags (plan/evidence.py), unless the source lacks figures the cell needs."""
    off = max(abs(m - 1) for m in measured)
    if off > CELL_EVIDENCE and not fit.gaps:
        raise NotEvidence(
            f"its pool gives {sum(measured) / len(measured):.2f} x the architecture's bytes per token, "
            f"beyond the {CELL_EVIDENCE:.0%} a start of this model and flags can differ by"
        )
    return off
