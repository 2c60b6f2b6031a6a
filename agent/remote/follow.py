"""Follow a transaction to its outcome, and re-attach when the link drops: one follower for deploy and fleet.

The host finishes a change on its own (commit or rollback) whatever happens to the SSH link, so a dropped
link is no reason to stop watching: the follower reconnects, asks the host's status after the transaction
it asked for (its id is chosen on the laptop), and follows it again or takes its outcome. Only this run's
own transaction counts: another one's outcome (an earlier apply, a cron run) would make an untouched host
look applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol, cast

from agent.errors import ConnectError
from agent.inventory import HostConfig
from agent.protocol.answers import StatusAnswer
from agent.protocol.events import Event, EventJson
from agent.protocol.requests import Request
from agent.remote.client import AgentClient, base_request, open_transport
from agent.remote.transport import ConnectionLost

REATTACH_TRIES = 5
NOT_STARTED = (
    "the transaction never started on the host (the link dropped before it began): this run changed "
    "nothing there; re-run"
)


class EventSource(Protocol):
    def events(self, req: Request) -> Iterator[Event]: ...


class Reconnecting(Protocol):
    def call(self, req: Request) -> object: ...

    def events(self, req: Request) -> Iterator[Event]: ...


Reconnect = Callable[[], AbstractContextManager[Reconnecting]]


@contextmanager
def connected(host: HostConfig) -> Iterator[AgentClient]:
    """The host's agent over its inventory connection (the host key is known by now: never trusted anew)."""
    transport = open_transport(host)
    try:
        yield AgentClient(transport, host)
    finally:
        transport.close()


def _ignore(why: str) -> None:
    return None


def _sleep(seconds: float) -> None:
    time.sleep(seconds)  # looked up when called: tests put a fake clock in its place


@dataclass(frozen=True)
class Watch:
    """Where a follow's events go, who hears of a dropped link, and how to reconnect (fakes in tests)."""

    on_event: Callable[[Event], None]
    on_lost: Callable[[str], None] = _ignore
    reconnect: Reconnect | None = None  # None: the host's inventory connection
    sleep: Callable[[float], None] = _sleep


def follow(source: EventSource, host: HostConfig, req: Request, watch: Watch) -> Event:
    """Every event of the transaction to watch.on_event; its outcome event. A dropped link (on_lost is
    told) is re-attached to, REATTACH_TRIES times; ConnectionLost when none of them gets through."""
    on_event = watch.on_event
    ours: set[str] = {req.txn} if req.txn else set()  # and any the host answered with
    try:
        return _stream(source.events(req), on_event, ours)
    except ConnectionLost as exc:
        watch.on_lost(exc.message)
    seen_unstarted = False
    for attempt in range(REATTACH_TRIES):
        watch.sleep(min(2.0 * (attempt + 1), 10.0))
        try:
            with (watch.reconnect or (lambda: connected(host)))() as again:
                found = reattach(
                    cast(StatusAnswer, again.call(base_request(host, "status", txn=req.txn))), ours
                )
                if isinstance(found, str):
                    return _stream(again.events(base_request(host, "follow", txn=found)), on_event, ours)
                # "not started" twice: the first answer may come while the request is still being read
                if found is not None and (found.data.get("outcome") != "not_started" or seen_unstarted):
                    return found
                seen_unstarted = found is not None
        except (ConnectError, ConnectionLost):
            continue
    raise ConnectionLost("could not re-attach to the transaction")


def reattach(status: StatusAnswer, ours: set[str]) -> str | Event | None:
    """After a dropped link, from the host's status: the transaction to follow (its id), its outcome, or
    None to ask again."""
    running = (status.get("running") or {}).get("txn")
    if running in ours:
        return str(running)
    last = status.get("last_outcome")
    asked = status.get("txn")
    for outcome in (
        last if last and last.get("txn") in ours else None,
        asked.get("outcome") if asked else None,
    ):
        if outcome:
            return _event(outcome)
    if asked and asked.get("known"):  # asked for and not finished: its runner is starting, or died
        return None if running else str(asked["id"])
    txn = asked["id"] if asked else next(iter(ours), "-")
    return Event(txn, 0, _now(), "done", "outcome", NOT_STARTED, {"outcome": "not_started"})


def _event(raw: EventJson) -> Event:
    return Event(str(raw.get("txn", "-")), int(raw.get("seq", 0)), str(raw.get("ts", _now())),
                 str(raw.get("stage", "done")), "outcome", str(raw.get("message", "")),
                 dict(raw.get("data") or {}))  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _stream(events: Iterator[Event], on_event: Callable[[Event], None], ours: set[str]) -> Event:
    outcome: Event | None = None
    for event in events:
        if event.txn not in ("", "-"):
            ours.add(event.txn)
        on_event(event)
        if event.is_outcome:
            outcome = event
    if outcome is None:
        raise ConnectionLost("the agent ended without an outcome")
    return outcome
