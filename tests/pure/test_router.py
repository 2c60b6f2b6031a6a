"""Behind a router: out before the restart's drain, back in after the checks, whatever the change came to.

The fake keeps the gateway's worker list as `sglang-router` 0.3.2 does (GET/POST/DELETE /workers, measured
against the release); it records at which restart count each call came, so the order is tested. As the
gateway, it can run a DELETE late (it queues it as a job and answers 202), on a fake clock that moves only
when deployctl's poll sleeps, and fail one GET /workers while deployctl polls.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

import agent.host.roles.router as router_mod
from agent.host.roles.router import (
    PLAIN,
    Registration,
    RouterError,
    Worker,
    parse_workers,
    put_back,
    take_out,
)
from agent.host.state import StateDir
from agent.host.watch.poll import wait_until
from agent.protocol.common import ProtocolError
from agent.protocol.events import Outcome
from agent.protocol.requests import Request
from tests.pure.txnfakes import Host, Script, unit_text

OLD, NEW, TOO_BIG = 100_000, 200_000, 400_000
ROUTER, ME, OTHER = "http://127.0.0.1:29000", "http://10.0.0.5:30000", "http://10.0.0.6:30000"


@dataclass
class FakeRouter:
    host: Host | None = None
    workers_: dict[str, Worker] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)  # (call, restarts so far)
    down: bool = False
    sticky: bool = False  # a removal that never shows (the router keeps listing the worker)

    def __call__(self, url: str) -> FakeRouter:
        assert url == ROUTER
        return self

    def _note(self, call: str) -> None:
        if self.down:
            raise RouterError(f"GET {ROUTER}/workers failed: connection refused")
        self.calls.append((call, self.host.systemd.restarts if self.host else 0))

    delay_s: float = 0.0  # the gateway runs a DELETE this long after answering it (0: at once)
    fail_lists: set[int] = field(default_factory=set)  # the n-th GET /workers after a DELETE fails (from 1)
    now: float = 0.0  # the fake clock: it moves when deployctl's poll sleeps, or by later()
    pending: list[tuple[float, str]] = field(default_factory=list)  # (when, worker id) removals queued
    lists_since_delete: int | None = None
    mark: Callable[[], str | None] = lambda: None  # the "worker out" mark on the host, as the run left it
    marks_at_delete: list[str | None] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def later(self, seconds: float) -> None:
        self.now += seconds
        for when, wid in list(self.pending):
            if when <= self.now:
                self.pending.remove((when, wid))
                self.workers_.pop(wid, None)

    def workers(self) -> list[Worker]:
        self._note("list")
        if self.lists_since_delete is not None:
            self.lists_since_delete += 1
            if self.lists_since_delete in self.fail_lists:
                raise RouterError(f"GET {ROUTER}/workers failed: read timed out")
        return list(self.workers_.values())

    regs: dict[str, Registration] = field(default_factory=dict)  # url -> how it was last added

    def add(self, url: str, reg: Registration = PLAIN) -> None:
        self._note("add")
        wid = str(uuid.uuid4())
        self.workers_[wid] = Worker(wid, url, healthy=True)
        self.regs[url] = reg

    def remove(self, worker_id: str) -> None:
        self._note("remove")
        self.marks_at_delete.append(self.mark())
        self.lists_since_delete = 0
        if self.sticky:
            return
        self.pending.append((self.now + self.delay_s, worker_id))
        self.later(0.0)

    def urls(self) -> list[str]:
        return sorted(w.url for w in self.workers_.values())

    def changes(self) -> list[tuple[str, int]]:
        return [c for c in self.calls if c[0] != "list"]


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000, "400000": 250_000}))
    h.install(h.etc, unit_text(OLD))
    return h


def routed(host: Host, router: FakeRouter, context: int, **kw: object) -> Request:
    router.host = host
    for url in (ME, OTHER):
        router.add(url)
    router.calls.clear()
    req = host.request(context, router_url=ROUTER, router_worker_url=ME, router_timeout_s=0.5, **kw)
    router.mark = lambda: StateDir(req.state_dir).router_left_out(req.unit)
    return req


def run(host: Host, router: FakeRouter, req: Request) -> tuple[Outcome, dict[str, object]]:
    t = host.transaction(req)
    t.router = router
    result = t.rollback() if req.verb == "rollback" else t.apply()
    return result.outcome, result.data


def test_the_worker_is_out_before_the_restart_and_back_after_the_checks(host: Host) -> None:
    router = FakeRouter()
    outcome, data = run(host, router, routed(host, router, NEW))
    assert outcome is Outcome.APPLIED
    assert router.changes() == [("remove", 0), ("add", 1)]  # out before restart 1, in after it
    assert router.urls() == sorted([ME, OTHER])
    assert data["router"] == {"url": ROUTER, "worker": ME, "out_s": data["router"]["out_s"], "back": True}  # type: ignore[index]


def test_a_rolled_back_change_puts_the_old_server_back(host: Host) -> None:
    router = FakeRouter()
    outcome, _ = run(host, router, routed(host, router, TOO_BIG))
    assert outcome is Outcome.ROLLED_BACK
    assert router.changes() == [("remove", 0), ("add", 2)]  # after the rollback's restart
    assert ME in router.urls()


def test_a_server_that_does_not_serve_afterwards_stays_out(host: Host) -> None:
    router = FakeRouter()
    req = routed(host, router, TOO_BIG)
    host.probe.down = True  # neither the new nor the restored server answers
    outcome, data = run(host, router, req)
    assert outcome is Outcome.ROLLBACK_FAILED
    assert router.changes() == [("remove", 0)] and ME not in router.urls()
    assert data["router"]["back"] is False  # type: ignore[index]


def test_a_router_that_does_not_answer_refuses_the_change_before_anything_is_touched(host: Host) -> None:
    router = FakeRouter()
    req = routed(host, router, NEW)
    router.down = True
    outcome, _ = run(host, router, req)
    assert outcome is Outcome.ERROR
    assert host.systemd.restarts == 0 and (host.etc / "sglang.service").read_text() == unit_text(OLD)
    assert not list(host.etc.glob("sglang.service.bak.*"))


def test_a_router_that_keeps_listing_the_worker_refuses_the_change(host: Host) -> None:
    router = FakeRouter(sticky=True)
    outcome, _ = run(host, router, routed(host, router, NEW))
    assert outcome is Outcome.ERROR and host.systemd.restarts == 0


def test_a_worker_the_router_does_not_list_is_left_out(host: Host) -> None:
    router = FakeRouter()
    req = routed(host, router, NEW)
    router.workers_ = {k: w for k, w in router.workers_.items() if w.url != ME}
    outcome, data = run(host, router, req)
    assert outcome is Outcome.APPLIED and router.changes() == [] and ME not in router.urls()
    assert data["router"]["back"] is None  # type: ignore[index]


def test_nothing_to_do_touches_no_router(host: Host) -> None:
    router = FakeRouter()
    outcome, _ = run(host, router, routed(host, router, OLD))
    assert outcome is Outcome.UP_TO_DATE and router.calls == []


def test_a_manual_rollback_goes_through_the_router_too(host: Host) -> None:
    router = FakeRouter()
    req = routed(host, router, NEW)
    run(host, router, req)
    router.calls.clear()
    outcome, data = run(host, router, replace(req, verb="rollback", unit_text=None, target_context=None))
    assert outcome is Outcome.APPLIED, data
    assert host.systemd.loaded == unit_text(OLD) and router.urls() == sorted([ME, OTHER])
    assert [c for c, _ in router.changes()] == ["remove", "add"]


def test_the_router_list_is_read_as_the_gateway_sends_it() -> None:
    body = {"workers": [{"id": "4f1c", "url": "http://10.0.0.5:30000/", "is_healthy": True, "load": 0}]}
    assert parse_workers(body) == [Worker("4f1c", "http://10.0.0.5:30000/", True)]
    for bad in ({}, {"workers": [{"url": ME}]}, [], {"workers": "x"}):
        with pytest.raises(RouterError):
            parse_workers(bad)
    router = FakeRouter(workers_={"4f1c": Worker("4f1c", "HTTP://10.0.0.5:30000/", True)})
    assert take_out(router, ME, 0.1, lambda: None).out  # the same worker, however its URL was written
    assert "back in the router" in put_back(router, ME, 0.1)


@pytest.mark.parametrize(
    "fields",
    [
        {"router_url": ROUTER},  # no worker URL
        {"router_url": "file:///etc/passwd", "router_worker_url": ME},
        {"router_url": ROUTER, "router_worker_url": "http://h:1/\nx"},
        {"router_url": ROUTER, "router_worker_url": ME, "router_timeout_s": 0},
    ],
)
def test_a_bad_router_setting_is_refused_on_the_wire(fields: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        Request("apply", unit_text="[Service]\nExecStart=/x\n", target_context=1, **fields).validate()  # type: ignore[arg-type]


def test_a_run_killed_while_the_worker_was_out_is_put_back_by_the_next_run(host: Host) -> None:
    router = FakeRouter()
    req = routed(host, router, OLD)
    # the killed run: it took the worker out, marked it, and died before putting it back
    router.remove(next(k for k, w in router.workers_.items() if w.url == ME))
    StateDir(req.state_dir).mark_router_out(req.unit, ME)
    outcome, _ = run(host, router, req)  # cron's next run: nothing to change
    assert outcome is Outcome.UP_TO_DATE
    assert ME in router.urls() and StateDir(req.state_dir).router_left_out(req.unit) is None


def test_a_worker_put_back_leaves_no_mark_and_one_left_out_keeps_it(host: Host) -> None:
    router = FakeRouter()
    req = routed(host, router, NEW)
    run(host, router, req)
    assert StateDir(req.state_dir).router_left_out(req.unit) is None
    req = replace(req, unit_text=unit_text(TOO_BIG), target_context=TOO_BIG)
    host.probe.down = True
    run(host, router, req)
    assert StateDir(req.state_dir).router_left_out(req.unit) == ME  # still out: the next run tries again


# -- the gateway runs a DELETE late, or a GET fails while deployctl polls: the worker is never out for good --
@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> FakeRouter:
    """A router on a fake clock: deployctl's polls sleep on it, so a late removal lands when it would."""
    router = FakeRouter()
    fake = functools.partial(wait_until, clock=router.clock, sleep=router.later)
    monkeypatch.setattr(router_mod, "wait_until", fake)
    return router


def test_the_worker_out_mark_is_written_before_the_delete(host: Host, gateway: FakeRouter) -> None:
    run(host, gateway, routed(host, gateway, NEW))
    assert gateway.marks_at_delete == [ME]


def test_a_get_that_fails_once_while_polling_leaves_no_worker_out(host: Host, gateway: FakeRouter) -> None:
    gateway.fail_lists = {1}
    req = routed(host, gateway, NEW)
    outcome, _ = run(host, gateway, req)
    assert outcome is Outcome.APPLIED
    assert ME in gateway.urls() and StateDir(req.state_dir).router_left_out(req.unit) is None


def test_a_removal_that_shows_after_the_poll_gave_up_is_undone_before_the_report(
    host: Host, gateway: FakeRouter
) -> None:
    gateway.delay_s = 0.7  # the poll gives up at 0.5 s; the gateway's queued job runs at 0.7 s
    req = routed(host, gateway, NEW)
    outcome, _ = run(host, gateway, req)
    assert outcome is Outcome.ERROR and host.systemd.restarts == 0
    gateway.later(60.0)  # whatever the gateway still had queued has run
    assert ME in gateway.urls() and StateDir(req.state_dir).router_left_out(req.unit) is None


def test_a_removal_that_lands_after_the_run_is_put_back_by_the_next_run(
    host: Host, gateway: FakeRouter
) -> None:
    gateway.delay_s = 30.0  # long after the run reported
    req = routed(host, gateway, NEW)
    outcome, _ = run(host, gateway, req)
    assert outcome is Outcome.ERROR and host.systemd.restarts == 0
    assert StateDir(req.state_dir).router_left_out(req.unit) == ME  # not sure yet: the mark stays
    gateway.later(60.0)
    assert ME not in gateway.urls()  # the late removal landed
    outcome, _ = run(
        host, gateway, replace(req, unit_text=unit_text(OLD), target_context=OLD)
    )  # cron's next run
    assert outcome is Outcome.UP_TO_DATE
    assert ME in gateway.urls() and StateDir(req.state_dir).router_left_out(req.unit) is None


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 0.7, 1.2, 30.0])
@pytest.mark.parametrize("fails", [set(), {1}, {2}, {1, 2}, {3}])
def test_no_removal_timing_and_no_failed_get_keeps_the_worker_out_for_good(
    host: Host, gateway: FakeRouter, delay_s: float, fails: set[int]
) -> None:
    """Every late removal against every failed poll: once the gateway has run what it queued, the worker is
    listed or the mark says it is out; the next run (nothing to do) leaves it listed once, with no mark."""
    gateway.delay_s, gateway.fail_lists = delay_s, fails
    req = routed(host, gateway, NEW)
    outcome, _ = run(host, gateway, req)
    assert outcome in (Outcome.APPLIED, Outcome.ERROR)
    gateway.later(60.0)
    marked = StateDir(req.state_dir).router_left_out(req.unit)
    assert ME in gateway.urls() or marked == ME
    gateway.fail_lists = set()
    now = NEW if outcome is Outcome.APPLIED else OLD
    again, _ = run(host, gateway, replace(req, unit_text=unit_text(now), target_context=now))
    assert again is Outcome.UP_TO_DATE
    gateway.later(60.0)
    assert [w.url for w in gateway.workers_.values()].count(ME) == 1
    assert StateDir(req.state_dir).router_left_out(req.unit) is None


def test_a_pd_worker_is_put_back_with_its_role_and_bootstrap_port() -> None:
    """sglang-router 0.3.2 in PD mode lists a worker re-added by its URL alone as `regular` (measured):
    a [pd] unit goes back with its `worker_type` and a prefill with its `bootstrap_port`."""
    router = FakeRouter()
    put_back(router, ME, 0.1, Registration("prefill", 8998))
    assert router.regs[ME] == Registration("prefill", 8998)
    assert Registration("prefill", 8998).body(ME) == {
        "url": ME,
        "worker_type": "prefill",
        "bootstrap_port": 8998,
    }
    assert Registration("decode").body(ME) == {"url": ME, "worker_type": "decode"}
    assert PLAIN.body(ME) == {"url": ME}


@pytest.mark.parametrize(("kind", "port"), [("regular", None), ("decode", 0), ("decode", 70000)])
def test_a_request_refuses_a_role_or_port_the_router_does_not_take(kind: str, port: int | None) -> None:
    with pytest.raises(ProtocolError):
        replace(Request(verb="apply"), router_worker_type=kind, router_bootstrap_port=port).validate()
