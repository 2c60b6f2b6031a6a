"""The fleet bench's arithmetic: batches as Ansible runs them, and what counts as deployctl's own time."""

from __future__ import annotations

from tests.bench.fleet import batches, figures


def test_the_canary_batch_then_the_rest_in_batches() -> None:
    names = [f"h{i}" for i in range(1, 11)]
    assert batches(names, 4, 4) == [names[:4], names[4:8], names[8:]]
    assert batches(names[:3], 3, 4) == [names[:3]]


def test_own_time_is_the_wall_less_each_batchs_slowest_start_per_host() -> None:
    plan = [["a", "b"], ["c", "d"]]
    starts = {"a": 3.0, "b": 4.0, "c": 2.0, "d": 5.0}  # the batches wait 4 s and 5 s for their servers
    f = figures(21.0, [(4.0, 1.5), (6.0, 2.5)], starts, plan, 2)
    assert f == {
        "fleet_hosts": 4,
        "fleet_batch": 2,
        "fleet_wall_s": 21.0,
        "single_apply_s": 5.0,
        "single_own_s": 2.0,
        "fleet_vs_4_single": 2.1,  # 21 s against 2 batches x 5 s
        "fleet_own_overhead_per_host_s": 3.0,  # (21 - 4 - 5) / 4
    }
