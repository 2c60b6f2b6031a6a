"""A restarted [pd] router is ready only once it lists the workers its command line names: sglang-router
0.3.2 answers /health at once and registers them in the background (host/roles/routerlisted.py). Seen on the
two test hosts: a router restarted by a kill's recovery listed no worker when the group reported."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from agent.host.roles.router import PLAIN, Registration, Worker
from agent.host.roles.routerlisted import named_workers
from agent.protocol.events import Outcome
from agent.protocol.requests import ROUTER_KIND, Timeouts
from tests.pure.txnfakes import Host, Script

PREFILL, DECODE = "http://10.0.0.5:30001", "http://10.0.0.6:30002"


def router_unit(policy: str) -> str:
    argv = (
        "/usr/bin/python3 -m sglang_router.launch_router --host 0.0.0.0 --port 30000 --pd-disaggregation "
        f"\\\n    --prefill {PREFILL} 8998 \\\n    --decode {DECODE} \\\n    --policy {policy}"
    )
    return f"[Unit]\nDescription=router\n\n[Service]\nExecStart={argv}\n"


@dataclass
class LateRouter:
    """The gateway's worker list as a restarted router fills it: empty for its first `empty_for` lists,
    then each worker of `registers` (its own start-up registration); one it never registers stays out."""

    registers: tuple[str, ...] = (PREFILL, DECODE)
    empty_for: int = 3
    lists: int = 0
    added: dict[str, Registration] = field(default_factory=dict)
    urls: list[str] = field(default_factory=list)

    def __call__(self, url: str) -> LateRouter:
        assert url == "http://127.0.0.1:30000", url  # its own API, on its own host
        return self

    def workers(self) -> list[Worker]:
        self.lists += 1
        if self.lists > self.empty_for:
            self.urls += [u for u in self.registers if u not in self.urls]
        return [Worker(str(uuid.uuid5(uuid.NAMESPACE_URL, u)), u, True) for u in self.urls]

    def add(self, url: str, reg: Registration = PLAIN) -> None:
        self.added[url] = reg
        self.urls.append(url)

    def remove(self, worker_id: str) -> None:
        raise AssertionError("a router's start removes no worker")


def restart_router(tmp_path: Path, router: LateRouter, ready_s: float = 30.0) -> tuple[Outcome, str]:
    host = Host(tmp_path, Script())
    host.install(host.etc, router_unit("round_robin"))
    req = host.request(200_000, unit_text=router_unit("random"), timeouts=Timeouts(ready_s=ready_s))
    t = host.transaction(replace(req, kind=ROUTER_KIND, port=30000))
    t.router = router
    result = t.apply()
    events = (Path(req.state_dir) / "txn").glob("*/events.jsonl")
    return result.outcome, "".join(p.read_text() for p in events)


def test_the_routers_start_is_ready_only_once_it_lists_its_workers(tmp_path: Path) -> None:
    router = LateRouter()
    outcome, said = restart_router(tmp_path, router)
    assert outcome is Outcome.APPLIED, said
    assert router.lists > router.empty_for and router.added == {}  # waited for its own registration
    assert "the router lists its 2 worker(s)" in said


def test_a_worker_the_router_never_lists_is_registered_again_with_its_role(tmp_path: Path) -> None:
    router = LateRouter(registers=(PREFILL,), empty_for=0)  # its registration of the decode gave up
    outcome, said = restart_router(tmp_path, router, ready_s=1.0)
    assert outcome is Outcome.APPLIED, said
    assert router.added == {DECODE: Registration("decode")}
    assert f"the router did not list {DECODE}" in said and "registered it again with its role" in said


def test_the_workers_a_router_unit_names_with_their_roles() -> None:
    assert named_workers(router_unit("random")) == {
        PREFILL: Registration("prefill", 8998),
        DECODE: Registration("decode"),
    }
    assert named_workers("[Service]\nExecStart=/usr/bin/python3 -m sglang_router.launch_router\n") == {}
    assert named_workers("not a unit [") == {}


def test_the_wait_for_the_routers_own_registration_is_bounded_below_the_ready_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit that did not come back must not hold the router's start for its whole ready time (900 s by
    default): the wait ends at LISTED_WAIT_S, then the worker is registered again (here it never answers:
    said, not failed on; the routed check gates a forward change)."""
    from agent.host.roles import routerlisted

    monkeypatch.setattr(routerlisted, "LISTED_WAIT_S", 0.5)
    monkeypatch.setattr(routerlisted, "REPAIR_TIMEOUT_S", 0.5)
    router = LateRouter(registers=(PREFILL,), empty_for=0)
    router.add = lambda url, reg=PLAIN: router.added.update({url: reg})  # type: ignore[method-assign]
    outcome, said = restart_router(tmp_path, router, ready_s=900.0)
    assert outcome is Outcome.APPLIED, said
    assert router.added == {DECODE: Registration("decode")}
    assert f"the router does not list {DECODE}" in said
