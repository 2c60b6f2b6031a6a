"""`deployctl apply` of a [pd] service whose one unit changes role (prefill[1] of 2P1D becomes decode[1]:
1P2D), against fake agents: the dry run and the apply say switch or restart, with one line why not a
switch; what each member is sent."""

from __future__ import annotations

from typing import Any

import pytest

from agent.group.pddry import Planned
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.protocol.common import unit_sha256
from agent.protocol.requests import Request
from tests.pure.test_pd import example, host_of
from tests.pure.test_pd_ops import FakeAgent, fake_clients, output, said

FLEX = {"gpus": [2], "port": 30011, "unit": "llama-pd-flex.service", "bootstrap_port": 8999,
        "flags": {"tp-size": 1, "max-running-requests": 8, "enable-pd-role-switch": True,
                  "mem-fraction-static": 0.8}}  # fmt: skip


def service(flex_role: str, **flags: Any) -> HostConfig:
    data = example()
    data["gpus"]["indices"] = [0, 1, 2]
    merged = {k: v for k, v in {**FLEX["flags"], **flags}.items() if v is not None}  # type: ignore[dict-item]
    unit = {**FLEX, "flags": merged}
    if flex_role == "decode" and not merged.get("enable-pd-role-switch"):
        del unit["bootstrap_port"]  # a decode binds none without the switch
    data["pd"][flex_role].append(unit)
    return host_of(data)


class RunningAgent(FakeAgent):
    """A unit's agent whose facts say that deployctl started its installed unit, and it runs."""

    def __init__(self, installed: str, ours: bool = True) -> None:
        super().__init__(installed)
        self.ours = ours

    def call(self, req: Request) -> dict[str, Any]:
        answer = super().call(req)
        if req.verb != "facts":
            return answer
        state = {"active_state": "active", "sub_state": "running", "invocation_id": "inv",
                 "need_daemon_reload": False}  # fmt: skip
        history = [{"sha256": unit_sha256(self.installed), "invocation": "inv" if self.ours else "old"}]
        return {**answer, "unit_sha256": unit_sha256(self.installed), "state": state, "history": history}


def units_of(host: HostConfig) -> list[Planned]:
    import agent.group.pdapply as pdapply

    return pdapply.planned_units(host, 32768)


def agents_for(now: HostConfig, was: HostConfig, ours: bool = True) -> list[RunningAgent]:
    """Each unit of `now` with its agent, which has the unit of the same name that `was` rendered."""
    old = {u.host.unit.name: u.text for u in units_of(was)}
    return [RunningAgent(old.get(u.host.unit.name, ""), ours) for u in units_of(now)]


def dry_run(monkeypatch: pytest.MonkeyPatch, now: HostConfig, agents: list[RunningAgent]) -> str:
    import agent.group.pdapply as pdapply
    from agent.deploy import apply

    monkeypatch.setattr(pdapply, "clients", fake_clients(agents))
    out = output()
    assert apply(Connection("pd"), Change(32768, dry_run=True), out, now) == 0, said(out)
    return said(out)


def test_a_dry_run_shows_the_switch_and_the_router_written_without_a_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = service("decode")
    text = dry_run(monkeypatch, now, agents_for(now, service("prefill")))
    assert "decode[1]" in text and "its role switches (prefill -> decode) without a restart" in text, text
    assert "router" in text and "written, no restart" in text
    assert "would restart" not in text  # prefill[0] and decode[0] do not change


def test_a_dry_run_says_why_not_a_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    off = {"enable-pd-role-switch": None}
    now = service("decode", **off)
    text = dry_run(monkeypatch, now, agents_for(now, service("prefill", **off)))
    assert "restart: --enable-pd-role-switch not set on the running unit" in text, text
    now = service("decode")
    text = dry_run(monkeypatch, now, agents_for(now, service("prefill"), ours=False))
    assert "restart: the running server is not its installed unit" in text, text
    unpinned = {"mem-fraction-static": None}
    now = service("decode", **unpinned)
    text = dry_run(monkeypatch, now, agents_for(now, service("prefill", **unpinned)))
    assert "restart: --mem-fraction-static changes too" in text, text


def test_the_apply_sends_the_switch_and_the_routers_write(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdapply as pdapply
    from agent.deploy import apply

    now = service("decode")
    agents = agents_for(now, service("prefill"))
    monkeypatch.setattr(pdapply, "clients", fake_clients(agents))
    sent: list[Any] = []
    monkeypatch.setattr(
        pdapply, "run_group", lambda out, host, nodes, order: sent.append((nodes, order)) or 0
    )
    out = output()
    assert apply(Connection("pd"), Change(32768, yes=True), out, now) == 0, said(out)
    nodes, order = sent[0]
    flex, router = (n.request for n in nodes)
    assert (flex.unit, flex.pd_switch_role, flex.prewarm) == ("llama-pd-flex.service", "decode", False)
    assert flex.pd_switch_graph_url == "http://127.0.0.1:30020"  # decode[0], which keeps running
    assert flex.router_url is not None and flex.router_worker_url == "http://127.0.0.1:30011"
    assert router.pd_router_keeps and router.pd_switch_role is None
    assert order == (0, 1) and "change as one group" in said(out)


def test_a_decode_that_can_switch_binds_its_bootstrap_port_and_may_not_share_it() -> None:
    from agent.pd.refusals import check

    flex = next(u for u in units_of(service("decode")) if "flex" in u.host.unit.name)
    assert "--disaggregation-bootstrap-port 8999" in flex.text and flex.bootstrap_port is None
    clash = service("decode")
    data = clash.model_dump(mode="json", exclude_none=True)
    data["pd"]["decode"][1]["bootstrap_port"] = 8998  # prefill[0]'s
    said = check(host_of({k: v for k, v in data.items() if k != "name"})).refusals
    assert any("share bootstrap port 8998" in line for line in said), said
    no_switch = example()
    no_switch["pd"]["decode"][0]["bootstrap_port"] = 9000
    with pytest.raises(ValueError, match="a decode binds one only with flags enable-pd-role-switch"):
        host_of(no_switch)
