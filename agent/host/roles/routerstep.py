"""The router step of the host transaction: take the server out of the model gateway before a change, put
whatever serves afterwards back in (host/roles/router.py speaks its API): a wrapper of the plain change."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.host.change.ports import Ports, Result, flags_of
from agent.host.roles.router import (
    Registration,
    RouterError,
    RouterPort,
    put_back,
    take_out,
    undo_removal,
)
from agent.protocol.events import Outcome, RouterData, Stage
from agent.protocol.requests import Request


def registration(req: Request) -> Registration:
    """A [pd] unit's role in the router (its worker type and a prefill's bootstrap port); else plain."""
    return Registration(req.router_worker_type, req.router_bootstrap_port)


def registration_of(p: Ports) -> Registration:
    """The request's registration; a member that switches its role goes back in with the role of the unit
    installed then: its new unit once switched (or restarted on it), its old one once rolled back."""
    if p.req.pd_switch_role is None:
        return registration(p.req)
    flags = flags_of(p.files.read(p.unit) or "")
    mode = flags.get("disaggregation-mode")
    if mode not in ("prefill", "decode"):
        return registration(p.req)
    port = flags.get("disaggregation-bootstrap-port", "8998")  # SGLang's default (fields/disagg.py)
    bootstrap = int(port) if mode == "prefill" and isinstance(port, str) and port.isdigit() else None
    return Registration(str(mode), bootstrap)


def out_of_router(p: Ports, change: Callable[[], Result]) -> Result:
    """With a router in front: take the server out before the change (so the drain only waits for
    what it has), and put whatever serves afterwards back in, however the change ended."""
    url, worker = p.req.router_url, p.req.router_worker_url
    if url is None or worker is None:
        return change()
    router = p.router(url)
    try:  # the mark is written before the DELETE: a run killed after it leaves it for the next run
        taken = take_out(
            router,
            worker,
            p.req.router_timeout_s,
            lambda: p.state.mark_router_out(p.unit, worker),
        )
    except RouterError as exc:
        return router_refused(p, router, worker, exc)
    p.log.emit(Stage.ROUTER, "step", taken.message, out=taken.out)
    left = time.monotonic()
    result: Result | None = None
    try:
        result = change()
    finally:
        back = back_in_router(p, router, worker) if taken.out else None
        if result is not None:
            out_s = round(time.monotonic() - left, 3) if taken.out else 0.0
            result.data["router"] = RouterData(url=url, worker=worker, out_s=out_s, back=back)
    return result


def router_refused(p: Ports, router: RouterPort, worker: str, exc: RouterError) -> Result:
    """The removal was not confirmed: nothing changes, and a worker whose DELETE went out is put back
    (or found listed) before the run reports; the mark stays unless that is sure."""
    if p.state.router_left_out(p.unit) == worker:
        try:
            undone = undo_removal(router, worker, p.req.router_timeout_s, registration_of(p))
            p.log.emit(Stage.ROUTER, "step" if undone.sure else "warning", undone.message)
            if undone.sure:
                p.state.clear_router_out(p.unit)
        except RouterError as again:
            p.log.emit(Stage.ROUTER, "warning", f"putting {worker} back failed: {again}; the next run "
                       "puts it back")  # fmt: skip
    return Result(Outcome.ERROR, f"the router at {p.req.router_url} did not take {worker} out: {exc}; "
                  "nothing changed")  # fmt: skip


def back_in_router(p: Ports, router: RouterPort, worker: str) -> bool:
    """Put the worker back when its server answers /health; a server that does not stays out."""
    from agent.host.watch.probe import ProbeError

    try:
        p.http().wait_ready(10.0)
    except ProbeError as exc:
        p.log.emit(Stage.ROUTER, "warning", f"left {worker} out of the router: the server does not "
                   f"serve ({exc})")  # fmt: skip
        return False
    try:
        p.log.emit(Stage.ROUTER, "step", put_back(router, worker, p.req.router_timeout_s, registration_of(p)))
    except RouterError as exc:
        p.log.emit(Stage.ROUTER, "warning", f"putting {worker} back in the router failed: {exc}")
        return False
    p.state.clear_router_out(p.unit)
    return True


def rejoin_left_out(p: Ports) -> None:
    """An earlier run took the worker out and was killed before it put it back: put it back now, once
    that run's change is finished (recovered or kept) and the server answers."""
    worker = p.state.router_left_out(p.unit)
    if worker is None or p.req.router_url is None or worker != p.req.router_worker_url:
        return
    p.log.emit(Stage.ROUTER, "step", f"an earlier run left {worker} out of the router")
    back_in_router(p, p.router(p.req.router_url), worker)


def rejoin_verified(p: Ports) -> str | None:
    """A [pd] member, once its new server passed its own checks: back in the router before the routed
    check (its own, or its peers': a decode's needs the prefill listed, and the group decides only after
    it). A one-host change puts its server back after the decision instead. The reason it failed, or
    None."""
    worker = p.req.router_worker_url
    if p.req.router_worker_type is None or p.req.router_url is None or worker is None:
        return None
    if p.state.router_left_out(p.unit) != worker:
        return None
    if back_in_router(p, p.router(p.req.router_url), worker):
        return None
    return f"the router at {p.req.router_url} did not take {worker} back"
