"""The rule, said once: whether a plan is feasible, and if not, the one constraint that binds.

A plan carries the predicted pool with the interval its evidence allows: cold, the low end is the pool with
pre and post lower by the per-vendor margin of the memory model (plan/overhead.py); calibrated, the start's
own figures, so the low end is the prediction. It is feasible exactly when the low end holds the target with
its margin, the memory left per GPU is at least the floor at the chosen fraction, and SGLang would start with
those flags (plan/refusals.py). Otherwise the verdict names the one binding constraint with the very numbers
this function compared. Plans and their alternatives are decided here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """A plan's numbers at its fraction: what the decision compares."""

    fraction: float
    pool_low: int  # the interval's low end: the number the decision uses
    pool: int  # the prediction (the middle of the interval; equal to pool_low when calibrated)
    reserve_gib: float  # memory left per GPU once the server is up
    goal: int  # the target plus the planning margin
    floor_gib: float
    highest_safe: bool = (
        False  # the fraction is the highest that keeps the floor (the target is out of reach)
    )
    cap: int | None = None  # --max-total-tokens where it holds the pool to itself (capped(): it binds)


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    binding: str | None = None


def decide(r: Reading, refused: Sequence[str] = ()) -> Verdict:
    """Feasible when SGLang starts, the low end holds the goal and the floor is kept; else what binds."""
    if refused:
        return Verdict(False, refused[0])
    if r.reserve_gib < r.floor_gib:
        return Verdict(
            False,
            f"the memory floor: at --mem-fraction-static {r.fraction:.3f}, {r.reserve_gib:.2f} GiB stays "
            f"free per GPU, under the {r.floor_gib:.1f} GiB floor",
        )
    if r.pool_low < r.goal and r.cap is not None:
        return Verdict(
            False, f"--max-total-tokens {r.cap:,} caps the pool: it holds {_held(r)} of the {r.goal:,} needed"
        )
    if r.pool_low < r.goal:
        where = (
            f"the memory floor: {r.fraction:.3f}, the highest fraction that leaves {r.floor_gib:.1f} GiB "
            "free per GPU,"
            if r.highest_safe
            else f"the pool: --mem-fraction-static {r.fraction:.3f}"
        )
        return Verdict(False, f"{where} holds {_held(r)} of the {r.goal:,} needed")
    return Verdict(True)


def capped(cap: int | None, page_size: int, pool_low: int) -> int | None:
    """The --max-total-tokens cap when the pool is at it, else None: SGLang takes min(profiled, cap) and
    floors it to the page (mem_cache/kv_cache_configurator.py:3096-3105): more memory gives no more tokens."""
    return cap if cap is not None and pool_low >= cap // page_size * page_size else None


def _held(r: Reading) -> str:
    if r.pool_low == r.pool:
        return f"{r.pool:,} tokens"
    return f"at least {r.pool_low:,} tokens (predicted {r.pool:,}, the low end of the estimate)"


def no_fraction(floor_gib: float, requests: int) -> Verdict:
    """Not even the smallest fraction leaves the floor free: the floor binds before any pool."""
    return Verdict(
        False,
        f"the memory floor: no fraction leaves {floor_gib:.1f} GiB free per GPU with {requests} requests "
        "at this context",
    )
