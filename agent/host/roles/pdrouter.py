"""A [pd] service's router and its routed check, as members of the service's group change.

The router (sglang-router 0.3.2 in PD mode) is no SGLang server: it logs no KV pool and no "fired up" line,
and has no /server_info. Its start is ready once systemd runs it, its /health answers and it lists the
workers its command line names (it registers them in the background: host/roles/routerlisted.py); what
proves the service is one completion routed through it (a prefill computes the prompt, a decode pulls its KV
and answers). That routed completion gates the whole change: the last wave of a [pd] group sends it (the
router through itself; the decodes, when the router's own unit is unchanged, through the router's URL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from agent.host.change.decide import Action, Failure, Verdict, fail
from agent.host.change.ports import Ports, ProbePort
from agent.host.roles.routerlisted import wait_listed
from agent.host.watch.poll import wait_until
from agent.host.watch.start import WatchResult
from agent.protocol.events import Stage
from agent.protocol.requests import ROUTER_KIND, Smoke
from agent.sglang.flags import FlagsError, unit_lines

ROUTER_MODULE = "sglang_router.launch_router"
ROUTER_PACKAGE = "sglang_router"  # python -m sglang_router: its __main__ is the console script's cli.main
ROUTER_SCRIPTS = ("sglang-router", "smg", "amg")  # sglang-router 0.3.2's console scripts (entry_points.txt)
ROUTED_PROMPT_TOKENS = 2000  # one short routed completion: it crosses the KV transfer, not the context
# sglang-router 0.3.2 answers 503 `server_selection_failed` while it counts no worker of a role healthy (its
# health checks come every few seconds): asked again, not failed. A 502 (a decode that died) fails at once.
UNSELECTED = "HTTP 503"
UNSELECTED_PAUSE_S = 2.0
ROUTED_TRIES = 12  # routed completions, each its own prompt, until one reaches the unit that sends them
SERVED_SETTLE_S = 2.0  # how long its count may lag its answer
SENDER_POLL_S = 1.0  # how often the unit that sends the routed check is looked at while it waits


def is_router(p: Ports) -> bool:
    """Sent as a router, or its unit runs one: a recovery (the laptop's `recover`, a follower's) or a
    rollback of the router's unit sends no kind, and its old start has no pool either."""
    return p.req.kind == ROUTER_KIND or runs_router(p.files.read(p.unit) or "")


def runs_router(text: str) -> bool:
    """The command of the unit's [Service] ExecStart= (systemd's own reading: continued lines joined, comments
    and other keys skipped) is sglang-router's: `python -m sglang_router.launch_router`, `python -m
    sglang_router launch`, or its console script (`sglang-router launch`, also `smg`/`amg`: the 0.3.2
    package's entry points, sglang_router/cli.py). An engine unit whose later line or comment names the
    router is still an engine."""
    try:
        execs = [
            v for section, key, v in unit_lines(text) if (section, key) == ("Service", "ExecStart") and v
        ]
    except FlagsError:
        return False
    if not execs:
        return False
    words = execs[-1].lstrip("-@:+!").split()  # systemd's special prefixes; the last ExecStart= runs
    return any(_router_at(words, i) for i in range(len(words)))


def _router_at(words: list[str], i: int) -> bool:
    after = words[i + 1 : i + 3]
    if words[i] == "-m":
        return after[:1] == [ROUTER_MODULE] or after == [ROUTER_PACKAGE, "launch"]
    return PurePosixPath(words[i]).name in ROUTER_SCRIPTS and after[:1] == ["launch"]


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
    wait_listed(p, limit - (time.monotonic() - t0))  # it registers its workers after (routerlisted.py)
    return WatchResult(Verdict(Action.READY), {}, round(time.monotonic() - t0, 3), invocation)


def routed_check(p: Ports, smoke: Smoke | None, invocation: str = "") -> str | None:
    """One completion through the router (this unit's own port for the router, else the request's
    routed_url): the reason it failed, or None. SGLang's own failure (a decode's `Page size mismatch`,
    a prefill that is gone) comes back in the answer, or as this unit's end (while_running). A unit that
    sends it through the router proves it served one itself (served_here): a completion another decode
    served proves nothing of it. invocation: this unit's start that passed its own checks."""
    from agent.host.watch.probe import ProbeError

    if not is_router(p) and p.req.routed_url is None:
        return None
    host, port = p.req.http_host, p.req.port
    if p.req.routed_url is not None and not is_router(p):
        parts = urlsplit(p.req.routed_url)
        host, port = parts.hostname or host, parts.port or 80
    base = smoke or p.req.smoke  # a rollback has no smoke test: the service's [smoke] judges the answer
    routed = replace(base, enabled=True, prompt_tokens=min(base.prompt_tokens, ROUTED_PROMPT_TOKENS))
    p.log.emit(Stage.SMOKE, "step", f"routed check: one completion through the router at {host}:{port}")
    try:
        probe = p.probe(host, port, p.secrets.api_key())
        probe.wait_ready(p.req.timeouts.ready_s)
        send = routed_once if is_router(p) else served_here
        return while_running(p, invocation, lambda: send(p, probe, routed))
    except ProbeError as exc:
        return f"routed check through the router failed: {exc}"


def while_running(p: Ports, invocation: str, check: Callable[[], str | None]) -> str | None:
    """The check's answer, or why this unit's start ended first. sglang-router 0.3.2 holds a client whose
    decode died at its first transfer (SGLang's `Page size mismatch`: the prefill keeps the request in its
    bootstrap queue, measured on CPU), so the answer would come only with the smoke timeout (900 s)."""
    if not invocation:
        return check()
    box: list[str | Exception | None] = []

    def run() -> None:
        try:
            box.append(check())
        except Exception as exc:  # raised again in the caller's thread
            box.append(exc)

    worker = threading.Thread(target=run, name="routed-check", daemon=True)
    worker.start()
    while not box:
        worker.join(SENDER_POLL_S)
        state = p.systemd.unit_state(p.unit)
        if not box and (state.active_state != "active" or state.invocation_id != invocation):
            return ended(p, invocation, state.active_state)  # the worker is left to its own timeout
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def ended(p: Ports, invocation: str, state: str) -> str:
    """Why the unit's start ended under the routed check: its journal's failure (parse-log's kind and line)
    and the fix SGLang's line gives, where it logged one."""
    from agent.sglang.logs.fixes import fix_for
    from agent.sglang.logs.summary import summarize

    said = f"{p.unit} ended during the routed check ({state})"
    failure = summarize(p.journal.invocation_tail(p.unit, invocation, 2000)).failure
    if failure is None:
        return said
    fixed = fix_for(failure.failure_kind, failure.line)
    return f"{said}: {failure.failure_kind}: {failure.line}" + (f"; what to do: {fixed}" if fixed else "")


def routed_once(p: Ports, router: ProbePort, routed: Smoke) -> str | None:
    """One routed completion, asked again while the router selects no worker of a role (503)."""
    res = router.smoke(routed)
    deadline = time.monotonic() + p.req.timeouts.ready_s
    while not res.passed and res.detail.startswith(UNSELECTED) and time.monotonic() < deadline:
        time.sleep(UNSELECTED_PAUSE_S)  # the router has not seen the restarted units healthy yet
        res = router.smoke(routed)
    if not res.passed:
        return f"routed check through the router failed: {res.detail or res.answer}"
    p.log.emit(Stage.SMOKE, "step", f"routed check: answer {res.answer!r} after {res.seconds:.1f} s")
    return None


def served_here(p: Ports, router: ProbePort, routed: Smoke) -> str | None:
    """Routed completions, each with a prompt of its own (a cache-aware router sends a repeated one where
    it went before), until this unit's own count of finished requests grows: the router sent it one and
    it answered. Other traffic counted meanwhile proves the same: it serves through the router. A unit
    that never does within ROUTED_TRIES fails the change."""
    own = p.http()
    before = own.requests_served()
    if before is None:
        why = "its /metrics has no sglang:num_requests_total (no --enable-metrics)"
        p.log.emit(Stage.SMOKE, "warning", f"routed check: which unit served it is not proven: {why}")
        return routed_once(p, router, routed)
    settle = min(SERVED_SETTLE_S, p.req.timeouts.ready_s)  # SGLang counts it just after it answers
    for n in range(1, ROUTED_TRIES + 1):
        failed = routed_once(p, router, replace(routed, sentence=f"Routed check {n}. {routed.sentence}"))
        if failed is not None:
            return failed
        if wait_until(lambda: (own.requests_served() or 0) > before, settle):
            p.log.emit(Stage.SMOKE, "step", f"routed check: this unit served one (try {n})")
            return None
    return (f"routed check: the router sent this unit none of {ROUTED_TRIES} routed completions (its "
            f"sglang:num_requests_total stayed {before}): it does not serve through the router")  # fmt: skip


CHECKSUM_MISMATCH = "KV checksum mismatch req="  # srt/disaggregation/decode.py _verify_kv_checksums
# a prefill of another TP width or PP stage: its requests are admitted unverified (decode.py:2580-2597)
CHECKSUM_SKIPPED = "KV checksum skipped: prefill layout signature"


def checksum_said(p: Ports, invocation_id: str, flags: Mapping[str, object]) -> str | None:
    """After the routed check of a unit started with --disaggregation-enable-kv-checksum: a mismatch its
    journal logged fails the change, though the router's retry (another transfer) answered the client."""
    if is_router(p) or p.req.routed_url is None or not flags.get("disaggregation-enable-kv-checksum"):
        return None
    lines = p.journal.invocation_tail(p.unit, invocation_id, 2000) if invocation_id else []
    bad = next((line for line in lines if CHECKSUM_MISMATCH in line), None)
    skipped = next((line for line in lines if CHECKSUM_SKIPPED in line), None)
    if bad is None and skipped is not None:  # another layout signature: admitted unverified
        p.log.emit(Stage.SMOKE, "step", f"routed check: the KV checksum was skipped ({skipped.strip()})")
        return None
    if bad is None:
        p.log.emit(Stage.SMOKE, "step", "routed check: the KV checksum matched (no mismatch logged)")
        return None
    return f"KV checksum mismatch: the KV this unit received is not what the prefill sent ({bad.strip()})"


def pool_said(summary: dict[str, object]) -> str:
    """The pool a start logged, in words; a router has none."""
    pool = summary.get("kv_tokens")
    return f"KV pool {pool:,} tokens" if isinstance(pool, int) else "no KV pool (a router)"
