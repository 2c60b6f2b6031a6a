"""The host-pool plan's own laws, over inputs the recorded oracle cases do not reach."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.plan.hostpool import (
    GIB,
    CgroupLevel,
    HiCacheFlags,
    HostMemory,
    Mode,
    RankPool,
    Refusal,
    allowance,
    cgroup_headroom,
    plan_host_pool,
)

POOLS = st.builds(
    RankPool, st.integers(1, 5_000_000), st.integers(1, 2_000_000), st.sampled_from([1, 16, 64])
)
FLAGS = st.one_of(
    st.builds(HiCacheFlags, size_gb=st.floats(0.01, 500)),
    st.builds(HiCacheFlags, ratio=st.floats(0.01, 8)),
    st.builds(HiCacheFlags, fraction=st.floats(0.001, 1)),
)
LEVELS = st.lists(
    st.builds(
        CgroupLevel,
        st.lists(st.integers(0, 2**42), max_size=2).map(tuple),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
    ),
    max_size=3,
).map(tuple)


@given(POOLS, FLAGS, st.integers(0, 2**43), LEVELS, st.integers(1, 16))
def test_a_pool_that_fits_stays_within_the_allowance(
    pool: RankPool, flags: HiCacheFlags, available: int, levels: tuple[CgroupLevel, ...], ranks: int
) -> None:
    memory = HostMemory(available, levels)
    got = plan_host_pool(pool, flags, memory, ranks)
    assert got.mode is flags.mode
    if got.refusal is Refusal.NONE_LEFT:
        assert got.mode is Mode.AUTO and got.tokens == 0 and got.allowance <= 0
        return
    assert got.allowance <= allowance(memory, ranks)  # the fraction only ever lowers it
    assert got.tokens % pool.page_size == 0 and got.bytes == got.tokens * pool.bytes_per_token
    assert got.fits == (got.bytes <= got.allowance)
    if got.auto is not None:
        assert got.auto.ratio <= got.auto.requested_ratio


@given(LEVELS, st.integers(0, 2**43))
def test_the_cgroup_bounds_what_is_available(levels: tuple[CgroupLevel, ...], available: int) -> None:
    room = cgroup_headroom(levels)
    usable = HostMemory(available, levels).usable
    assert usable <= available
    assert room is None or usable <= room
    assert (room is None) == all(not lv.limits for lv in levels)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"fraction": 0.0}, "in (0, 1]"), ({"fraction": 1.5}, "in (0, 1]"), ({"ratio": -1.0}, "positive")],
)
def test_bad_flags_get_one_line(kwargs: dict[str, float], error: str) -> None:
    with pytest.raises(ValueError, match=r"^[^\n]*$") as exc:
        HiCacheFlags(**kwargs)  # type: ignore[arg-type]
    assert error in str(exc.value)


def test_an_explicit_ratio_or_size_turns_auto_off() -> None:
    assert HiCacheFlags().mode is Mode.AUTO
    assert HiCacheFlags(ratio=2.0).mode is Mode.RATIO and HiCacheFlags(ratio=2.0).effective_fraction is None
    assert HiCacheFlags(size_gb=4, ratio=2.0).mode is Mode.SIZE
    assert (
        plan_host_pool(RankPool(1000, 1, 1), HiCacheFlags(size_gb=1), HostMemory(64 * GIB), 1).tokens
        == 10**9 + 1
    )
