"""Each [pd] role planned as the service it is: its weights per GPU at its own TP, a unit another host
reaches that binds loopback refused, and a role's plan that is not feasible said so (exit 8)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.pd.units import pd_units
from agent.plan.effective import effective
from tests.pure.test_pd import example, host_of


def tp4_prefill_tp8_decode(base_tp: int) -> dict[str, Any]:
    """A prefill at TP 4 on GPUs 0-3 and a decode at TP 8 on GPUs 8-15 of one host; the file's own
    [sglang.flags] layout TP `base_tp`, its weights per GPU stated for it."""
    data = example()
    data["gpus"]["indices"] = list(range(16))
    data["sglang"]["flags"]["tp-size"] = base_tp
    data["model"]["weights_gib_per_gpu"] = 16.0
    data["pd"]["prefill"][0].update(gpus=[0, 1, 2, 3], flags={"tp-size": 4, "chunked-prefill-size": 8192})
    data["pd"]["decode"][0].update(gpus=list(range(8, 16)), flags={"tp-size": 8, "max-running-requests": 8})
    return data


@pytest.mark.parametrize("base_tp", [1, 2, 4, 8])
def test_each_role_gets_its_weights_per_gpu_at_its_own_tp(base_tp: int) -> None:
    """16 GiB per GPU at the file's TP: the whole checkpoint is 16 x base_tp GiB, split over each role's own
    TP, exactly as `plan --set tp-size=N` restates a plain service (agent/plan/effective.py)."""
    host = host_of(tp4_prefill_tp8_decode(base_tp))
    prefill, decode = pd_units(host)
    assert prefill.host.model.weights_gib_per_gpu == pytest.approx(16.0 * base_tp / 4)
    assert decode.host.model.weights_gib_per_gpu == pytest.approx(16.0 * base_tp / 8)
    for unit, tp in ((prefill, 4), (decode, 8)):
        plain = effective(host, (("tp-size", tp),)).host.model.weights_gib_per_gpu
        assert unit.host.model.weights_gib_per_gpu == pytest.approx(plain)


@pytest.mark.parametrize(
    ("unit", "why"),
    [
        (
            {"url": "http://10.0.0.1:30010"},
            "the router reaches it at http://10.0.0.1:30010",
        ),  # the router reaches it at another address
        ({"target": "gpu2", "url": "http://gpu2:30010"}, "reaches it at"),
        (
            {"target": "gpu2", "url": "http://127.0.0.1:30010"},
            "the router runs on",
        ),  # refused for its url too
    ],
)
@pytest.mark.parametrize("bind", ["127.0.0.1", "localhost", "::1"])
def test_a_unit_reached_from_another_host_that_listens_on_loopback_is_refused(
    unit: dict[str, str], why: str, bind: str
) -> None:
    """[sglang] host (127.0.0.1 unless set) is every role's --host, and SGLang binds its bootstrap server
    there too (srt/managers/disagg_service.py): the router and a decode elsewhere cannot reach it. Refused in
    one line naming [sglang] host, before any host is asked; 0.0.0.0 or the host's address is not."""
    from agent.errors import InventoryError
    from agent.group.pdapply import refused_first
    from agent.pd.refusals import check

    data = example()
    data["sglang"]["host"] = bind
    data["pd"]["prefill"][0].update(unit)
    said = [r for r in check(host_of(data)).refusals if "[sglang] host" in r]
    assert said and said[0].startswith("pd.prefill.0: ") and why in said[0] and "\n" not in said[0], said
    with pytest.raises(InventoryError):
        refused_first(host_of(data), 32768)
    for reachable in ("0.0.0.0", "10.0.0.1"):
        data["sglang"]["host"] = reachable
        assert not [r for r in check(host_of(data)).refusals if "[sglang] host" in r]


def test_units_of_one_host_on_loopback_with_the_router_there_are_not_refused() -> None:
    data = example()
    data["sglang"]["host"] = "127.0.0.1"
    assert check_refusals(data) == []


def check_refusals(data: dict[str, Any]) -> list[str]:
    from agent.pd.refusals import check

    return list(check(host_of(data)).refusals)
