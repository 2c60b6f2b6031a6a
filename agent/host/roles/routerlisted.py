"""A [pd] router's start is ready only once it lists the workers its command line names.

sglang-router 0.3.2 answers /health at once and registers the workers of its command line in the background:
its journal says "Worker initialization job submitted (will complete in background)", then "Router ready |
workers: []". Each worker goes through its local_worker_registration workflow, whose first step
(detect_connection_mode) retries a worker that does not answer yet with a linear backoff (1 s more each
time, up to 5 s; its max_attempts from --worker-startup-timeout-secs). A router restarted with its peers (a
group's rollback or recovery starts every old unit at once) thus lists its workers only some time after it
answers: on the two test hosts its /health answered 0.6 s before its second worker was listed, and the
group reported with none listed once. Meanwhile it answers 503 to every request, and a worker whose
registration gave up is never listed.

So its readiness waits until it lists each named worker healthy, and registers (with its role) any it does
not list by then, as a unit put back after its drain is (host/roles/router.py put_back).
"""

from __future__ import annotations

import time

from agent.host.change.ports import Ports
from agent.host.roles.router import Registration, RouterError, RouterPort, find, put_back
from agent.host.watch.poll import wait_until
from agent.protocol.events import Stage
from agent.sglang.flags import FlagsError, unit_lines

# How long the start waits for the router's own registration (at most the start's ready time): its retries
# come at most 5 s apart, so a worker serving by then is listed; one that is not (a unit that failed to
# come back) must not hold the router's start for the whole ready time (900 s by default).
LISTED_WAIT_S = 120.0
REPAIR_TIMEOUT_S = 30.0  # how long a worker registered again may take to show healthy


def named_workers(text: str) -> dict[str, Registration]:
    """The workers the router's ExecStart= names (`--prefill URL [BOOTSTRAP_PORT]`, `--decode URL`), each
    with the role it is registered with; {} for a unit that names none."""
    try:
        execs = [v for s, k, v in unit_lines(text) if (s, k) == ("Service", "ExecStart") and v]
    except FlagsError:
        return {}
    words = execs[-1].split() if execs else []
    named: dict[str, Registration] = {}
    for i, word in enumerate(words[:-1]):
        if word == "--decode":
            named[words[i + 1]] = Registration("decode")
        elif word == "--prefill":
            port = words[i + 2] if i + 2 < len(words) and words[i + 2].isdigit() else None
            named[words[i + 1]] = Registration("prefill", int(port) if port else None)
    return named


def unlisted(router: RouterPort, urls: list[str]) -> list[str]:
    """The URLs the router does not list healthy; all of them while its API does not answer."""
    try:
        workers = router.workers()
    except RouterError:
        return list(urls)
    return [u for u in urls if (w := find(workers, u)) is None or not w.healthy]


def wait_listed(p: Ports, limit_s: float) -> None:
    """Wait (up to limit_s, at most LISTED_WAIT_S) until the router lists each worker its unit names, then
    register any it still does not list; what it came to is said (a warning for a worker left unlisted)."""
    named = named_workers(p.files.read(p.unit) or "")
    if not named:
        return
    router, t0 = p.router(f"http://{p.req.http_host}:{p.req.port}"), time.monotonic()
    limit_s = max(0.0, min(limit_s, LISTED_WAIT_S))
    wait_until(lambda: not unlisted(router, list(named)), limit_s)
    missing = unlisted(router, list(named))
    for url in missing:
        try:
            said = put_back(router, url, REPAIR_TIMEOUT_S, named[url])
            p.log.emit(Stage.READY, "warning", f"the router did not list {url} {limit_s:.0f} s after its "
                       f"start: registered it again with its role; {said}")  # fmt: skip
        except RouterError as exc:
            p.log.emit(Stage.READY, "warning", f"the router does not list {url}: {exc}")
    if not missing:
        waited = round(time.monotonic() - t0, 1)
        p.log.emit(Stage.READY, "step", f"the router lists its {len(named)} worker(s), {waited} s after "
                   "its /health answered")  # fmt: skip
