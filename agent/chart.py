"""The plan as a picture: the predicted KV pool against --mem-fraction-static, in a few lines of text.

Pure: the figures in, text out. Unicode marks on a terminal, plain ASCII anywhere else (a pipe, cron's mail,
NO_COLOR). It draws the predicted pool curve, the target and the target with its margin, the highest fraction
that keeps the memory floor, the chosen point and the running setting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from agent.plan.choose import Plan
from agent.sglang import kvpool

WIDTH = 56  # plot columns
HEIGHT = 12  # plot rows
LABEL = 7  # the y axis' label column


@dataclass(frozen=True)
class PoolChart:
    """What the chart shows; pool_at gives the predicted pool (tokens) at a fraction."""

    pool_at: Callable[[float], int]
    target: int
    goal: int  # the target plus the planning margin
    chosen: float
    chosen_pool: int
    floor_fraction: float | None  # the highest fraction that leaves the memory floor free per GPU
    floor_gib: float
    current: float | None = None  # the running --mem-fraction-static


@dataclass(frozen=True)
class Marks:
    curve: str
    target: str
    goal: str
    floor: str
    chosen: str
    current: str
    axis_x: str
    axis_y: str
    corner: str


ASCII = Marks("*", "-", "=", ":", "O", "C", "-", "|", "+")
UNICODE = Marks("•", "─", "═", "┊", "◆", "○", "─", "│", "└")


def from_plan(plan: Plan, current: float | None) -> PoolChart:
    """The chart of a plan: SGLang's formula on the plan's pre/post/cell where it gives the plan's own pool;
    else (a hybrid or capped pool, whose bytes per token are not the plain cell's) the line through the
    chosen point with the plan's own tokens per 0.01, so the curve always passes through the chosen point."""
    need = plan.pre_gib * (1 - plan.mem_fraction_static) - plan.reserve_gib_per_gpu  # graphs, activations
    # rounded down to 0.001, as the plan's note says it (PoolModel.max_fraction): one ceiling, not two
    top = (
        kvpool.floor_fraction(1 - (need + plan.reserve_floor_gib) / plan.pre_gib)
        if plan.pre_gib > 0
        else None
    )
    # A pinned pool (the CPU backend's --max-total-tokens) is the curve's ceiling, and the fraction then
    # bounds no memory: no floor to draw.
    paging = kvpool.Paging(1, plan.max_total_tokens)
    if plan.max_total_tokens is not None:
        top = None
    return PoolChart(
        pool_at=_curve(plan, paging),
        target=plan.context_length,
        goal=plan.target_pool_tokens,
        chosen=plan.mem_fraction_static,
        chosen_pool=plan.predicted_pool_tokens,
        floor_fraction=top if top is not None and 0 < top < 1 else None,
        floor_gib=plan.reserve_floor_gib,
        current=current,
    )


def _curve(plan: Plan, paging: kvpool.Paging) -> Callable[[float], int]:
    f0, pool0, step = plan.mem_fraction_static, plan.predicted_pool_tokens, plan.tokens_per_0_01
    cap = plan.max_total_tokens

    def formula(f: float) -> int:
        return kvpool.pool_tokens(plan.pre_gib, plan.post_gib, f, plan.cell_bytes, paging)

    if abs(formula(f0) - pool0) <= max(64, pool0 // 100):
        return formula
    return lambda f: min(max(0, round(pool0 + (f - f0) * 100 * step)), cap if cap is not None else 2**62)


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


@dataclass(frozen=True)
class _Frame:
    """Fractions lo..hi across the columns, 0..top tokens up the rows."""

    lo: float
    hi: float
    top: float

    @classmethod
    def of(cls, chart: PoolChart) -> _Frame:
        points = [chart.chosen] + [f for f in (chart.current, chart.floor_fraction) if f is not None]
        lo = max(0.01, math.floor((min(points) - 0.04) * 100) / 100)
        hi = min(0.99, math.ceil((max(points) + 0.02) * 100) / 100)
        lo = min(lo, hi - 0.01)  # a fraction near 1 (0.995): the frame still spans a column per step
        return cls(lo, hi, max(chart.pool_at(hi), chart.goal, chart.chosen_pool, 1) * 1.1)

    def fraction(self, col: int) -> float:
        return self.lo + (self.hi - self.lo) * col / (WIDTH - 1)

    def column(self, f: float) -> int:
        """The column of a fraction, clamped to the frame: a point beyond it is drawn at its edge."""
        return min(max(round((f - self.lo) / (self.hi - self.lo) * (WIDTH - 1)), 0), WIDTH - 1)

    def row(self, tokens: float) -> int:
        return min(max(round(max(tokens, 0) / self.top * (HEIGHT - 1)), 0), HEIGHT - 1)

    def shows(self, f: float | None) -> bool:
        return f is not None and self.lo <= f <= self.hi


def _plot(chart: PoolChart, frame: _Frame, m: Marks) -> list[list[str]]:
    grid = [[" "] * WIDTH for _ in range(HEIGHT)]
    for tokens, mark in ((chart.goal, m.goal), (chart.target, m.target)):  # the target wins a shared row
        grid[frame.row(tokens)] = [mark] * WIDTH
    if chart.floor_fraction is not None and frame.shows(chart.floor_fraction):
        for r in range(HEIGHT):
            grid[r][frame.column(chart.floor_fraction)] = m.floor
    for col in range(WIDTH):
        tokens = chart.pool_at(frame.fraction(col))
        if tokens < frame.top:
            grid[frame.row(tokens)][col] = m.curve
    if chart.current is not None and frame.shows(chart.current):
        grid[frame.row(chart.pool_at(chart.current))][frame.column(chart.current)] = m.current
    grid[frame.row(chart.chosen_pool)][frame.column(chart.chosen)] = m.chosen
    return grid


def _ticks(frame: _Frame) -> str:
    """Every 0.05 that fits under the plot without touching its neighbour."""
    ticks = [" "] * (WIDTH + 6)
    f = math.ceil(frame.lo * 20) / 20
    while f <= frame.hi + 1e-9:
        text, at = f"{f:.2f}", frame.column(f)
        if all(c == " " for c in ticks[max(at - 1, 0) : at + len(text) + 1]):
            ticks[at : at + len(text)] = list(text)
        f = round(f + 0.05, 2)
    return " " * (LABEL + 1) + "".join(ticks).rstrip()


def _legend(chart: PoolChart, frame: _Frame, m: Marks) -> list[str]:
    shared = " (the target's row)" if frame.row(chart.goal) == frame.row(chart.target) else ""
    lines = [
        f"  {m.curve} predicted pool  {m.target} target {chart.target:,}  "
        f"{m.goal} with margin {chart.goal:,}{shared}"
    ]
    chosen = f"  {m.chosen} chosen {chart.chosen:.3f}: {chart.chosen_pool:,} tokens"
    if chart.current is not None:
        chosen += f"  {m.current} running {chart.current:.3f}: {chart.pool_at(chart.current):,} tokens"
    lines.append(chosen)
    if chart.floor_fraction is not None:
        lines.append(
            f"  {m.floor} memory floor: above {chart.floor_fraction:.3f} less than {chart.floor_gib:.1f} GiB "
            "stays free per GPU"
        )
    return lines


def draw(chart: PoolChart, unicode: bool = False) -> str:
    """The chart as text: a title, the plot with its axes, the legend."""
    m = UNICODE if unicode else ASCII
    frame = _Frame.of(chart)
    grid = _plot(chart, frame, m)
    labels = {HEIGHT - 1: _tokens(frame.top), frame.row(chart.goal): _tokens(chart.goal)}
    labels[frame.row(chart.target)] = _tokens(chart.target)
    labels.setdefault(frame.row(chart.chosen_pool), _tokens(chart.chosen_pool))  # the chosen point's row
    lines = [f"KV pool (tokens) against --mem-fraction-static, target {chart.target:,} tokens"]
    for r in range(HEIGHT - 1, -1, -1):
        lines.append(f"{labels.get(r, ''):>{LABEL - 1}} {m.axis_y}{''.join(grid[r])}".rstrip())
    lines.append(f"{'0':>{LABEL - 1}} {m.corner}{m.axis_x * WIDTH}")
    lines.append(_ticks(frame))
    return "\n".join(lines + _legend(chart, frame, m))
