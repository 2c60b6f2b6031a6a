"""The verdict names --max-total-tokens as what binds only when the pool is at the cap."""

from __future__ import annotations

from agent.plan.verdict import Reading, capped, decide


def test_a_pool_at_the_cap_names_the_cap() -> None:
    cap = capped(150_000, 64, 149_952)  # the cap floored to the page: the pool is at it
    verdict = decide(Reading(0.956, 149_952, 149_952, 4.03, 204_000, 4.0, highest_safe=True, cap=cap))
    assert not verdict.feasible and verdict.binding is not None
    assert verdict.binding.startswith("--max-total-tokens 150,000 caps the pool"), verdict.binding


def test_a_pool_below_the_cap_names_the_memory_floor() -> None:
    cap = capped(150_000, 1, 120_000)  # the memory gives less than the cap: the cap does not bind
    verdict = decide(Reading(0.956, 120_000, 120_000, 4.03, 204_000, 4.0, highest_safe=True, cap=cap))
    assert cap is None and verdict.binding is not None and verdict.binding.startswith("the memory floor")
