"""A [pd] service's router and its routed check, as members of the service's group change.

The router (sglang-router 0.3.2 in PD mode) is no SGLang server: it logs no KV pool and no "fired up" line,
and has no /server_info. Its start is ready once systemd runs it and its /health answers; what proves the
service is one completion routed through it (a prefill computes the prompt, a decode pulls its KV and
answers). That routed completion gates the whole change: the last wave of a [pd] group sends it (the router
through itself; the decodes, when the router's own unit is unchanged, through the router's URL).
"""

from __future__ import annotations

import time
from dataclasses import replace
from urllib.parse import urlsplit

from agent.host.change.decide import Action, Failure, Verdict, fail
from agent.host.change.ports import Ports
from agent.host.watch.poll import wait_until
from agent.host.watch.start import WatchResult
from agent.protocol.events import Stage
from agent.protocol.requests import ROUTER_KIND, Smoke

ROUTER_MODULE = "sglang_router.launch_router"
ROUTED_PROMPT_TOKENS = 2000  # one short routed completion: it crosses the KV transfer, not the context
# sglang-router 0.3.2 answers 503 `server_selection_failed` while it counts no worker of a role healthy (its
# health checks come every few seconds): asked again, not failed. A 502 (a decode that died) fails at once.
UNSELECTED = "HTTP 503"
UNSELECTED_PAUSE_S = 2.0


def is_router(p: Ports) -> bool:
    """Sent as a router, or its unit runs one: a recovery (the laptop's `recover`, a follower's) or a
    rollback of the router's unit sends no kind, and its old start has no pool either."""
    return p.req.kind == ROUTER_KIND or runs_router(p.files.read(p.unit) or "")


def runs_router(text: str) -> bool:
    """The unit's command is sglang-router's (`python -m sglang_router.launch_router`)."""
    return ROUTER_MODULE in text.partition("ExecStart=")[2]


def watch_router(p: Ports, invocation: str) -> WatchResult:
    """The router's start: running (not failed, not restarted under the watch) and /health answers."""
    from agent.host.watch.probe import ProbeError

    t0, limit = time.monotonic(), p.req.timeouts.ready_s
    if not wait_until(lambda: p.systemd.unit_state(p.unit).active_state in ("active", "failed"), limit):
        return WatchResult(fail(f"the router did not start within {limit:.0f} s", Failure.TIMEOUT), {}, 0.0)
    try:
        p.http().wait_ready(limit)
    except ProbeError as exc:
        return WatchResult(fail(f"the router does not serve: {exc}", Failure.TIMEOUT), {}, 0.0)
    state = p.systemd.unit_state(p.unit)
    if state.active_state != "active" or state.invocation_id != invocation:
        why = f"the router's unit is {state.active_state} (it exited or restarted under the watch)"
        return WatchResult(fail(why, Failure.SERVICE_FAILED), {}, 0.0)
    p.log.emit(Stage.READY, "step", "the router runs and answers /health")
    return WatchResult(Verdict(Action.READY), {}, round(time.monotonic() - t0, 3), invocation)


def routed_check(p: Ports, smoke: Smoke | None) -> str | None:
    """One completion through the router (this unit's own port for the router, else the request's
    routed_url): the reason it failed, or None. SGLang's own failure (a decode's `Page size mismatch`,
    a prefill that is gone) comes back in the answer."""
    from agent.host.watch.probe import ProbeError

    if not is_router(p) and p.req.routed_url is None:
        return None
    host, port = p.req.http_host, p.req.port
    if p.req.routed_url is not None and not is_router(p):
        parts = urlsplit(p.req.routed_url)
        host, port = parts.hostname or host, parts.port or 80
    base = smoke or Smoke()
    routed = replace(base, enabled=True, prompt_tokens=min(base.prompt_tokens, ROUTED_PROMPT_TOKENS))
    p.log.emit(Stage.SMOKE, "step", f"routed check: one completion through the router at {host}:{port}")
    try:
        probe = p.probe(host, port, p.secrets.api_key())
        probe.wait_ready(p.req.timeouts.ready_s)
        res = probe.smoke(routed)
        deadline = time.monotonic() + p.req.timeouts.ready_s
        while not res.passed and res.detail.startswith(UNSELECTED) and time.monotonic() < deadline:
            time.sleep(UNSELECTED_PAUSE_S)  # the router has not seen the restarted units healthy yet
            res = probe.smoke(routed)
    except ProbeError as exc:
        return f"routed check through the router failed: {exc}"
    if not res.passed:
        return f"routed check through the router failed: {res.detail or res.answer}"
    p.log.emit(Stage.SMOKE, "step", f"routed check: answer {res.answer!r} after {res.seconds:.1f} s")
    return None


def pool_said(summary: dict[str, object]) -> str:
    """The pool a start logged, in words; a router has none."""
    pool = summary.get("kv_tokens")
    return f"KV pool {pool:,} tokens" if isinstance(pool, int) else "no KV pool (a router)"
