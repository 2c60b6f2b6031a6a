"""The drain's edge: ask the running server over HTTP, wait, restart, and watch the old server go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.host.events import EventLog
from agent.host.watch import drain
from agent.protocol.events import Stage
from agent.protocol.requests import Request

if TYPE_CHECKING:
    from agent.host.systemd import JobResult


def restart_drained(
    req: Request,
    api_key: str | None,
    restart: Callable[[], JobResult],
    log: EventLog,
    old_log: Callable[[], list[str]],
) -> tuple[JobResult, drain.Drain]:
    """Wait for the running server's requests (bounded), then restart while watching it stop.

    old_log: the old server's last lines, read once the restart job is done (SGLang's own drain lines).
    """
    from agent.host.watch.probe import Probe, read_load  # requests: only when a restart is due

    probe = Probe(req.http_host, req.port, api_key)

    def read() -> drain.Load | None:
        return read_load(probe)

    waited = _wait(req, read, log)
    if waited.end not in (drain.End.IDLE, drain.End.TIMEOUT):
        return restart(), drain.result(waited, None, req.drain_timeout_s)
    job, seen = _watched(read, restart)
    logged = drain.logged_left(old_log())
    return job, drain.result(waited, seen, req.drain_timeout_s, logged)


def _watched(read: drain.Reader, restart: Callable[[], JobResult]) -> tuple[JobResult, drain.StopWatch]:
    """Restart while a thread watches the old server go; what it saw so far stands if its last poll hangs."""
    done = threading.Event()
    seen = drain.StopWatch()
    watcher = threading.Thread(
        target=lambda: seen.run(read, done.is_set, time.monotonic, time.sleep),
        name="drain-watch",
        daemon=True,
    )
    watcher.start()
    try:
        job = restart()
    finally:
        done.set()
    watcher.join(timeout=10)
    return job, seen


def wait_for_requests(req: Request, api_key: str | None, log: EventLog) -> drain.Drain:
    """The drain's wait alone (no restart follows: a [pd] role switch needs the server idle)."""
    from agent.host.watch.probe import Probe, read_load

    probe = Probe(req.http_host, req.port, api_key)
    return drain.result(_wait(req, lambda: read_load(probe), log), None, req.drain_timeout_s)


def _wait(req: Request, read: Callable[[], drain.Load | None], log: EventLog) -> drain.Waited:
    """The drain's wait for the running server's requests (told when there are any); OFF without --drain."""
    if not req.drain:
        return drain.Waited(drain.End.OFF, 0, 0, 0.0)
    first = _first_look(read)
    if first is not None and first.total:
        log.emit(
            Stage.DRAIN,
            "step",
            f"draining: {first.running} running, {first.waiting} waiting; waiting up to "
            f"{req.drain_timeout_s:g} s for them before the restart",
            running=first.running,
            waiting=first.waiting,
        )
    return drain.wait_idle(read, req.drain_timeout_s, time.monotonic, time.sleep)


def _first_look(read: Callable[[], drain.Load | None]) -> drain.Load | None:
    try:
        return read()
    except drain.NoLoad:
        return None
