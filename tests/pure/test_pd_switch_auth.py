"""The role switch's key against SGLang's auth (utils/auth.py:150-176): /pd_role_switch is ADMIN_OPTIONAL
(http_server.py:1636), the decode peer's /get_server_info a normal endpoint; a turned-away switch: refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.secrets import SecretFiles
from agent.host.watch.roleswitch import http_role_switch
from agent.sglang.roleswitch import Said, answer, switch_key

KEYS = st.one_of(st.none(), st.text("abcXYZ019-_", min_size=1, max_size=12))


def allowed(path: str, header: str | None, api: str | None, admin: str | None) -> bool:
    """decide_request_auth for the two endpoints (auth.py:150-176)."""
    sent = header.removeprefix("Bearer ") if header and header.startswith("Bearer ") else None
    if path == "/pd_role_switch":
        return sent == admin if admin else (sent == api if api else True)
    return sent == api if api else True


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, str | None]]]:
    keys: dict[str, str | None] = {"api": None, "admin": None}

    class Handler(BaseHTTPRequestHandler):
        def answer(self, ok: dict[str, object]) -> None:
            good = allowed(self.path, self.headers.get("Authorization"), keys["api"], keys["admin"])
            body = json.dumps(ok if good else {"error": "Unauthorized"}).encode()
            self.send_response(200 if good else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.answer({"success": True, "message": "ok", "safe_to_restore": True})

        def do_GET(self) -> None:
            self.answer({"internal_states": [{"decode_cuda_graph_memory_gb": 0.5}]})

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", keys
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("api,admin", [(None, None), ("k", None), (None, "adm"), ("k", "adm")])
def test_the_switch_sends_the_key_each_endpoint_takes(
    server: tuple[str, dict[str, str | None]], api: str | None, admin: str | None
) -> None:
    base, keys = server
    keys.update(api=api, admin=admin)
    port = http_role_switch("127.0.0.1", int(base.rsplit(":", 1)[1]), api, admin)
    assert port.graph_gb(base) == 0.5  # the peer's normal endpoint takes the API key even with an admin key
    assert answer(*port.switch({"new_role": "decode"})).said is Said.SWITCHED


def test_a_switch_with_a_key_the_server_does_not_have_is_refused_not_broken(
    server: tuple[str, dict[str, str | None]],
) -> None:
    """The admin key changed in the new unit: the running server still has the old one, turns it away before
    the switch, serves its old role; the member restarts on its new unit."""
    base, keys = server
    keys.update(api="k", admin="old")
    port = http_role_switch("127.0.0.1", int(base.rsplit(":", 1)[1]), "k", "new")
    said = answer(*port.switch({"new_role": "decode"}))
    assert said.said is Said.REFUSED and "401" in said.message


@given(api=KEYS, admin=KEYS)
def test_the_switch_key_is_the_one_sglang_accepts(api: str | None, admin: str | None) -> None:
    key = switch_key(api, admin)
    assert allowed("/pd_role_switch", f"Bearer {key}" if key else None, api, admin)


@given(
    code=st.sampled_from([401, 403]),
    body=st.one_of(
        st.none(),
        st.text(max_size=20),
        st.dictionaries(st.text(max_size=8), st.one_of(st.booleans(), st.text(max_size=8)), max_size=3),
    ),
)
def test_any_auth_refusal_is_refused_whatever_its_body(code: int, body: object) -> None:
    assert answer(code, body).said is Said.REFUSED


def test_the_admin_key_is_read_from_the_units_secret_flags(tmp_path: Path) -> None:
    files = SecretFiles(tmp_path, "sglang-decode.service")
    files.write(files.wanted({}, {"api-key": "k", "admin-api-key": 'a"dm'}))
    assert (files.api_key(), files.admin_api_key()) == ("k", 'a"dm')
    files.write(files.wanted({}, {"api-key": "k"}))
    assert files.admin_api_key() is None
