"""The host agent's HTTP probes against a real HTTP server on loopback (no test host needed).

It opens sockets, so it lives in the integration tier (the pure tier has none), but it boots nothing:
a stdlib http.server in a thread plays the local SGLang with whatever replies a test scripts.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.host.watch.probe import Probe, ProbeError
from agent.protocol.requests import Smoke

pytestmark = pytest.mark.integration

DEAD_PROXY = "http://127.0.0.1:9"  # discard port: nothing listens, so anything sent through it fails
SMOKE = Smoke(prompt_tokens=50, timeout_s=10)
GOOD = {"choices": [{"message": {"role": "assistant", "content": "Dog."}}], "usage": {"prompt_tokens": 57}}


class Server:
    """Scripted replies by path: (status, body bytes); records the headers of every request."""

    def __init__(self, host: str) -> None:
        self.replies: dict[str, tuple[int, bytes]] = {
            "/health": (200, b""),
            "/server_info": (200, b'{"max_total_num_tokens": 1000}'),
            "/v1/chat/completions": (200, json.dumps(GOOD).encode()),
        }
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                server.headers.append(dict(self.headers))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, body = server.replies.get(self.path, (404, b"not found"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _reply

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class HTTPServer(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.httpd = HTTPServer((host, 0), Handler)
        self.host = host
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def reply(self, path: str, body: Any, status: int = 200) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.replies[path] = (status, raw)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server("127.0.0.1")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def server6() -> Iterator[Server]:
    if not ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    srv = Server("::1")
    try:
        yield srv
    finally:
        srv.stop()


def test_a_good_server_passes(server: Server) -> None:
    probe = Probe(server.host, server.port)
    probe.wait_ready(5)
    res = probe.smoke(SMOKE)
    assert res.passed and res.prompt_tokens == 57 and res.answer == "Dog."


def test_proxies_in_the_environment_are_ignored(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, DEAD_PROXY)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n", encoding="utf-8")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    probe = Probe(server.host, server.port)
    probe.wait_ready(2)
    assert probe.smoke(SMOKE).passed
    assert server.headers and not any("Authorization" in h for h in server.headers), "used .netrc"


def test_ipv6_loopback(server6: Server) -> None:
    probe = Probe("::1", server6.port)
    assert probe.base == f"http://[::1]:{server6.port}"
    probe.wait_ready(2)
    assert probe.smoke(SMOKE).passed


@pytest.mark.parametrize(
    ("host", "base"),
    [
        ("127.0.0.1", "http://127.0.0.1:30000"),
        ("localhost", "http://localhost:30000"),
        ("::1", "http://[::1]:30000"),
        ("fe80::1", "http://[fe80::1]:30000"),
        ("[::1]", "http://[::1]:30000"),
    ],
)
def test_base_url(host: str, base: str) -> None:
    assert Probe(host, 30000).base == base


ODD: list[tuple[str, Any, str]] = [
    ("non-JSON", b"<html>502 Bad Gateway</html>", "not JSON"),
    ("empty body", b"", "not JSON"),
    ("JSON list", [GOOD], "not a JSON object"),
    ("no choices", {"choices": []}, "no choices"),
    ("choices not a list", {"choices": "dog"}, "no choices"),
    ("error", {"error": {"message": "context too long"}}, "context too long"),
    ("choice not an object", {"choices": ["dog"], "usage": {"prompt_tokens": 5}}, "no message"),
    ("no message", {"choices": [{"text": "dog"}], "usage": {"prompt_tokens": 5}}, "no message"),
    (
        "no content",
        {"choices": [{"message": {"role": "assistant"}}], "usage": {"prompt_tokens": 5}},
        "content",
    ),
    ("null content", {"choices": [{"message": {"content": None}}], "usage": {"prompt_tokens": 5}}, "content"),
    ("no usage", {"choices": [{"message": {"content": "dog"}}]}, "prompt_tokens"),
    ("usage not an object", {"choices": [{"message": {"content": "dog"}}], "usage": 5}, "prompt_tokens"),
    (
        "text tokens",
        {"choices": [{"message": {"content": "dog"}}], "usage": {"prompt_tokens": "many"}},
        "prompt_tokens",
    ),
    (
        "bool tokens",
        {"choices": [{"message": {"content": "dog"}}], "usage": {"prompt_tokens": True}},
        "prompt_tokens",
    ),
]


@pytest.mark.parametrize(("body", "detail"), [(b, d) for _, b, d in ODD], ids=[n for n, _, _ in ODD])
def test_odd_smoke_replies_fail_the_smoke_test(server: Server, body: Any, detail: str) -> None:
    server.reply("/v1/chat/completions", body)
    res = Probe(server.host, server.port).smoke(SMOKE)
    assert not res.passed
    assert detail in res.detail


def test_a_wrong_answer_fails_the_smoke_test(server: Server) -> None:
    server.reply(
        "/v1/chat/completions", {"choices": [{"message": {"content": "cat"}}], "usage": {"prompt_tokens": 57}}
    )
    res = Probe(server.host, server.port).smoke(SMOKE)
    assert not res.passed and res.answer == "cat" and "dog" in res.detail


def test_a_dead_server_is_a_probe_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        probe = Probe("127.0.0.1", port)
        with pytest.raises(ProbeError):
            probe.wait_ready(0.3)
        with pytest.raises(ProbeError):
            probe.smoke(SMOKE)
