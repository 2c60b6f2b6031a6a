"""plan --json states the bootstrap port each role's unit binds: a prefill's, and a decode's that can switch
roles (srt/managers/disagg_service.py:26 starts a bootstrap server for it), else null."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.pd.plan import role_plans
from tests.pure.test_pd import example, host_of


@settings(max_examples=30, deadline=None)
@given(
    switch=st.sampled_from([None, True, False]),
    decode_port=st.sampled_from([None, 8999, 9100]),
    prefill_port=st.sampled_from([None, 8998, 9200]),
)
def test_each_roles_json_bootstrap_port_is_the_one_its_unit_binds(
    switch: bool | None, decode_port: int | None, prefill_port: int | None
) -> None:
    data = example()
    decode, prefill = data["pd"]["decode"][0], data["pd"]["prefill"][0]
    if switch is not None:
        decode["flags"]["enable-pd-role-switch"] = switch
    if decode_port is not None and switch:  # a decode's bootstrap_port is refused without the switch
        decode["bootstrap_port"] = decode_port
    if prefill_port is not None:
        prefill["bootstrap_port"] = prefill_port
    for plan in role_plans(host_of(data), 32768):
        bound = plan.unit.host.sglang.flags.get("disaggregation-bootstrap-port")
        assert plan.to_dict()["bootstrap_port"] == bound, (plan.unit.label, bound)
