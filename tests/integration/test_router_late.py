"""The fault matrix's "late router removal": a gateway that answers DELETE with 202 and removes the worker
only after deployctl's poll gave up (sgl-model-gateway queues it as a job). The change is refused with
nothing touched, and the worker is never left out of the router for good.

The gateway is a small stand-in on the laptop (the test host shares its network), speaking the worker API
of `sglang-router` 0.3.2 (GET/POST /workers, DELETE /workers/{id}); its removals wait `delay_s`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.sglang.flags import parse_unit_flags
from tests.integration.conftest import cli, variant, wait_pool
from tests.integration.test_faults import base  # noqa: F401 - the baseline fixture, put back afterwards

pytestmark = pytest.mark.integration


class LateGateway:
    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.workers, self.lock = delay_s, dict[str, str](), threading.Lock()

    def listed(self) -> list[str]:
        with self.lock:
            return sorted(self.workers.values())

    def remove_later(self, wid: str) -> None:
        def run() -> None:
            time.sleep(self.delay_s)
            with self.lock:
                self.workers.pop(wid, None)

        threading.Thread(target=run, daemon=True).start()


@contextmanager
def serving(gateway: LateGateway) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: object = None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with gateway.lock:
                rows = [{"id": k, "url": u, "is_healthy": True} for k, u in gateway.workers.items()]
            self._send(200, {"workers": rows})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            with gateway.lock:
                gateway.workers[str(uuid.uuid4())] = body["url"]
            self._send(202, {"status": "accepted"})

        def do_DELETE(self) -> None:
            gateway.remove_later(self.path.rsplit("/", 1)[-1])
            self._send(202, {"status": "accepted"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_late_router_removal_never_keeps_the_worker_out(sim, base) -> None:  # noqa: F811 - the fixture
    old, pool = base
    worker = f"http://127.0.0.1:{parse_unit_flags(old)['port']}"
    gateway = LateGateway(delay_s=4.0)  # the poll below gives up after 1 s
    gateway.workers["w1"] = worker
    with serving(gateway) as url:
        text = (sim.units_dir / f"{sim.name}.toml").read_text()
        text += f'\n[router]\nurl = "{url}"\nworker_url = "{worker}"\ntimeout_s = 1\n'
        routed = variant(sim, sim.name, text)
        proc = cli(routed, "apply", sim.name, "--context", "200k", "--yes")
        assert proc.returncode != 0, proc.stdout
        assert sim.unit_text() == old and wait_pool(sim) == pool  # nothing touched
        time.sleep(gateway.delay_s + 1)  # whatever the gateway still had queued has run
        assert worker in gateway.listed() or _marked(sim)  # listed, or the mark says who puts it back
        gateway.delay_s = 0.0  # the gateway is prompt again: the next run puts the worker back first
        again = cli(routed, "apply", sim.name, "--context", "200k", "--yes")
        assert again.returncode == 0, again.stdout + again.stderr
        assert gateway.listed().count(worker) == 1 and not _marked(sim)


def _marked(sim) -> bool:
    return (sim.host.root / "var/lib/deployctl/units/sglang.service/router_out.json").exists()
