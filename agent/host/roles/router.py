"""Take the server out of its router before a restart and put it back once it passed its checks.

The SGLang model gateway (`sglang-router` 0.3.2 on PyPI, `python -m sglang_router.launch_router`) keeps its
workers behind an HTTP API, measured against the release: `GET /workers` lists them
(`{"workers": [{"id": UUID, "url": ..., "is_healthy": ...}]}`), `POST /workers` with `{"url": ...}` adds
one and `DELETE /workers/{id}` removes one; both answer 202 and act in the background (the gateway queues
them as jobs: `core/job_queue.rs` in sgl-model-gateway, its "worker job queue" log lines in sglang#12621), so
each change is followed by polling the list until it shows, and a removal may show only after that poll
gave up. A removed worker gets no new requests; the drain then waits for the ones it already has.

Nothing may keep a worker out for good: the "worker out" mark is written before the DELETE is sent, a run
whose removal was not confirmed puts the worker back before it reports (`undo_removal`), and the next run
that finds the mark puts it back. One failed `GET /workers` while polling is not an answer: the poll goes on.

The decisions are pure (`parse_workers`, `find`, `Outcome`); `HttpRouter` is the edge, `RouterPort` what the
transaction needs, so fakes test every path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

from agent.host.watch.poll import wait_until


class RouterError(Exception):
    """The router did not answer, or not as the gateway does."""


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool


def same_url(a: str, b: str) -> bool:
    """The router keeps a worker's URL as given; a trailing slash or the scheme's case is the same one."""
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def parse_workers(body: object) -> list[Worker]:
    """`GET /workers` JSON -> its workers; RouterError for a body the gateway would not send."""
    workers = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(workers, list):
        raise RouterError("GET /workers did not answer a list of workers")
    out = []
    for w in workers:
        if not isinstance(w, dict) or not isinstance(w.get("id"), str) or not isinstance(w.get("url"), str):
            raise RouterError("GET /workers listed a worker without an id and a url")
        out.append(Worker(w["id"], w["url"], w.get("is_healthy") is True))
    return out


@dataclass(frozen=True)
class Registration:
    """How the router is to know a worker it adds again. sglang-router 0.3.2 in PD mode takes its role in
    POST /workers (`worker_type` "prefill" with the prefill's `bootstrap_port`, or "decode"; its
    WorkerConfigRequest); by its URL alone a worker comes back `"worker_type": "regular"` and serves
    neither role (measured against the release in PD mode)."""

    worker_type: str | None = None  # None: a plain worker (the router in its regular mode)
    bootstrap_port: int | None = None

    def body(self, url: str) -> dict[str, object]:
        body: dict[str, object] = {"url": url}
        if self.worker_type is not None:
            body["worker_type"] = self.worker_type
        if self.bootstrap_port is not None:
            body["bootstrap_port"] = self.bootstrap_port
        return body


PLAIN = Registration()


def find(workers: list[Worker], url: str) -> Worker | None:
    return next((w for w in workers if same_url(w.url, url)), None)


class RouterPort(Protocol):
    def workers(self) -> list[Worker]: ...

    def add(self, url: str, reg: Registration = PLAIN) -> None: ...

    def remove(self, worker_id: str) -> None: ...


def gone(router: RouterPort, url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return find(router.workers(), url) is None
        except RouterError:  # one failed GET while polling says nothing either way: poll again
            return False

    return check


def healthy(router: RouterPort, url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            worker = find(router.workers(), url)
        except RouterError:
            return False
        return worker is not None and worker.healthy

    return check


@dataclass(frozen=True)
class Taken:
    """What taking the worker out of the router did."""

    out: bool  # it is out now (it was listed and was removed)
    listed: bool  # it was listed before
    message: str


def take_out(router: RouterPort, url: str, timeout_s: float, mark: Callable[[], None]) -> Taken:
    """Remove the worker before a restart; a worker the router does not list is left as it is (not added).

    mark() writes the durable "worker out" mark: it runs before the DELETE is sent, so a run killed at any
    point after it leaves the mark for the next run. Raises RouterError when the router does not answer or
    does not let the worker go within timeout_s (then the caller owes an `undo_removal`).
    """
    worker = find(router.workers(), url)
    if worker is None:
        return Taken(
            False, False, f"{url} is not in the router: nothing to take out (it is not put in after)"
        )
    mark()
    router.remove(worker.id)
    if not wait_until(gone(router, url), timeout_s):
        raise RouterError(f"the router still lists {url} {timeout_s:g} s after its removal")
    return Taken(True, True, f"took {url} out of the router: it sends it no new requests")


def put_back(router: RouterPort, url: str, timeout_s: float, reg: Registration = PLAIN) -> str:
    """Add the worker again (as `reg` says) and wait until the router lists it healthy; RouterError
    otherwise."""
    if find(router.workers(), url) is None:
        router.add(url, reg)
    if not wait_until(healthy(router, url), timeout_s):
        raise RouterError(f"the router does not list {url} as healthy {timeout_s:g} s after adding it")
    return f"put {url} back in the router: it serves again"


@dataclass(frozen=True)
class Undone:
    """What putting back a worker whose removal was not confirmed did."""

    sure: bool  # the removal showed and the worker is listed again: the mark may go
    message: str


def undo_removal(router: RouterPort, url: str, timeout_s: float, reg: Registration = PLAIN) -> Undone:
    """After a DELETE whose removal did not show in time: the gateway may still run it (it is queued), so
    wait for it once more, then put the worker back (or check it is listed). When the removal never showed,
    a worker still listed may yet be removed: the caller keeps the mark, and the next run checks again.
    RouterError when the worker cannot be put back."""
    landed = wait_until(gone(router, url), timeout_s)
    said = put_back(router, url, timeout_s, reg)
    if landed:
        return Undone(True, f"the router removed {url} late; {said}")
    return Undone(False, f"the router still lists {url} after its removal was asked: it is kept listed, and "
                         "the next run checks it again")  # fmt: skip


class HttpRouter:
    """The gateway's worker API over HTTP (requests)."""

    def __init__(self, base: str, timeout_s: float = 10.0) -> None:
        import requests  # only when a router is configured

        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.trust_env = False  # as the probe: no proxy, .netrc or CA bundle from the environment
        self._errors: tuple[type[Exception], ...] = (requests.RequestException, ValueError)

    def _call(self, method: str, path: str, ok: tuple[int, ...], **kw: object) -> object:
        try:
            r = self.session.request(method, f"{self.base}{path}", timeout=self.timeout_s, **kw)  # type: ignore[arg-type]
            if r.status_code not in ok:
                raise RouterError(f"{method} {self.base}{path} answered HTTP {r.status_code}: {r.text[:200]}")
            return r.json() if method == "GET" else None
        except self._errors as exc:
            raise RouterError(f"{method} {self.base}{path} failed: {exc}") from None

    def workers(self) -> list[Worker]:
        return parse_workers(self._call("GET", "/workers", (200,)))

    def add(self, url: str, reg: Registration = PLAIN) -> None:
        self._call("POST", "/workers", (200, 201, 202), json=reg.body(url))

    def remove(self, worker_id: str) -> None:
        self._call("DELETE", f"/workers/{quote(worker_id, safe='')}", (200, 202, 204))
