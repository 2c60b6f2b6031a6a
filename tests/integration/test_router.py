"""A fleet rollout behind the real SGLang model gateway (`sglang-router` 0.3.2 from PyPI) loses no request.

Three simulated hosts serve behind the router; a steady load goes to the router while `deployctl fleet
apply` restarts them one at a time. The router runs with `--disable-retries`, so a request it sends to a
server that is stopping or starting fails and is counted: 0 failed means deployctl took each worker out
before its drain and put it back only once its checks passed. A control run without `[router]` shows that
the same load loses requests when one host restarts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests import fleethosts, testhost
from tests.fleethosts import Fleet, HostSpec
from tests.integration.conftest import DEPLOYCTL, wait_for
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration
HOSTS = ("r1", "r2", "r3")


@dataclass
class Router:
    url: str
    proc: subprocess.Popen[bytes]

    def call(self, method: str, path: str, body: object = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"null")

    def healthy_workers(self) -> set[str]:
        listed = self.call("GET", "/workers")
        assert isinstance(listed, dict)
        return {w["url"] for w in listed["workers"] if w.get("is_healthy")}


@dataclass
class Load:
    """Steady requests to the router from a few threads, counted by how they ended."""

    url: str
    model: str
    stop: threading.Event = field(default_factory=threading.Event)
    counts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say one word."}],
            "max_tokens": 4,
        }
        while not self.stop.is_set():
            req = urllib.request.Request(self.url + "/v1/chat/completions", json.dumps(body).encode())
            req.add_header("content-type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
                    self.counts["ok" if r.status == 200 else f"http {r.status}"] += 1
            except urllib.error.HTTPError as exc:
                self.counts[f"http {exc.code}"] += 1
                self.errors.append(exc.read()[:200].decode(errors="replace"))
            except OSError as exc:
                self.counts["error"] += 1
                self.errors.append(repr(exc)[:200])
            time.sleep(0.05)

    def failed(self) -> int:
        return sum(n for k, n in self.counts.items() if k != "ok")


def _port(f: Fleet, name: str) -> int:
    m = re.search(r"(?m)^port = (\d+)$", (f.units_dir / f"{name}.toml").read_text())
    assert m
    return int(m[1])


@pytest.fixture(scope="module")
def routed() -> Iterator[tuple[Fleet, Router]]:
    missing = testhost.missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    f = fleethosts.boot([HostSpec(name, ("routed",)) for name in HOSTS])
    port, metrics = free_ports(2)
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--policy", "round_robin", "--disable-retries", "--log-level", "warn"]
    # its Prometheus exporter binds 29000 unless told otherwise: another router there would stop this one
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    log = f.work / "router.log"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    router = Router(f"http://127.0.0.1:{port}", proc)
    try:
        try:
            wait_for(lambda: _answers(router), 60, 0.5)
        except AssertionError:
            raise AssertionError(f"the router never answered: {log.read_text()[-2000:]}") from None
        for name in HOSTS:
            worker = f"http://127.0.0.1:{_port(f, name)}"
            wait_for(lambda w=worker: _answers_at(w + "/health"), 300, 0.5)
            router.call("POST", "/workers", {"url": worker})
        wait_for(lambda: len(router.healthy_workers()) == len(HOSTS), 120, 0.5)
        yield f, router
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        f.stop()


def _answers(router: Router) -> bool:
    try:
        router.call("GET", "/workers")
        return True
    except OSError:
        return False


def _answers_at(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _set_router(f: Fleet, router: Router | None, extra: str = "") -> None:
    for name in HOSTS:
        path = f.units_dir / f"{name}.toml"
        text = path.read_text().split("\n# test settings\n")[0] + "\n# test settings\n" + extra
        if router is not None:
            worker = f"http://127.0.0.1:{_port(f, name)}"
            text += f'\n[router]\nurl = "{router.url}"\nworker_url = "{worker}"\n'
        path.write_text(text)


def _under_load(f: Fleet, router: Router, argv: list[str]) -> tuple[subprocess.CompletedProcess[str], Load]:
    """Run deployctl while four threads send requests to the router (from 2 s before to 2 s after)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{_port(f, HOSTS[0])}/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    load = Load(router.url, model)
    threads = [threading.Thread(target=load.run, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(2)
    proc = subprocess.run(
        [DEPLOYCTL, *argv, "--yes"], env={**os.environ, **f.env}, capture_output=True, text=True, timeout=1200
    )
    time.sleep(2)
    load.stop.set()
    for t in threads:
        t.join(timeout=90)
    return proc, load


def test_a_rollout_behind_the_router_loses_no_request(routed: tuple[Fleet, Router]) -> None:
    f, router = routed
    _set_router(f, router)
    before = {name: fleethosts_invocation(f, name) for name in HOSTS}
    argv = ["fleet", "apply", "routed", "--context", "200k", "--canary", "1", "--batch", "1"]
    proc, load = _under_load(f, router, argv)
    print(f"\nbehind the router, a three-host rollout under load: {dict(load.counts)}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert all(fleethosts_invocation(f, name) != before[name] for name in HOSTS)  # each one restarted
    assert load.counts["ok"] > 50, load.counts
    assert load.failed() == 0, (load.counts, load.errors[:5])
    assert len(router.healthy_workers()) == len(HOSTS)  # every worker is back


def test_without_the_router_setting_the_same_load_loses_requests(routed: tuple[Fleet, Router]) -> None:
    # The control: one host's apply under the same load through the same router, deployctl unaware of it.
    # SGLang keeps taking new requests while it drains, so under steady load its drain never ends by
    # itself: the stop runs to TimeoutStopSec (2 + 10 s here) and what it has is cut.
    f, router = routed
    _set_router(f, None, "\n[drain]\ntimeout_s = 2\nstop_allowance_s = 10\n")
    proc, load = _under_load(f, router, ["apply", HOSTS[0], "--context", "100k"])
    print(f"\nthe router not in the inventory, one apply under the same load: {dict(load.counts)}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert load.failed() > 0, load.counts


def fleethosts_invocation(f: Fleet, name: str) -> str:
    out = f.hosts[name].ssh(["systemctl", "show", "-p", "InvocationID", "--value", "sglang.service"])
    return out.stdout.decode().strip()
