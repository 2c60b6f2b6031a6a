"""The simulated server's prefill-decode roles: a prefill's bootstrap server answers what the real 0.5.23's
does, and a decode refuses a routed request from a prefill of another page size or KV dtype text in
SGLang's own words (/work/shared/sglang/PD-AND-HICACHE-ON-CPU.md, "Failure modes measured")."""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))

from sglang import disagg
from sglang.launch_server import build_parser

V23 = (0, 5, 23)
PAGE_SIZE_WORDS = (
    "RuntimeError: Page size mismatch: prefill server has page_size=1, but decode server has page_size=16. "
    "Both servers must use the same --page-size value."
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def args(*flags: str) -> object:
    base = ["--model-path", "/m", "--port", "30010", "--host", "127.0.0.1"]
    return build_parser(V23).parse_args([*base, *flags])


def test_the_flags_parse_as_sglang_spells_them() -> None:
    a = args("--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake_tcp",
             "--disaggregation-bootstrap-port", "8999")  # fmt: skip
    assert (a.disaggregation_mode, a.disaggregation_bootstrap_port) == ("prefill", 8999)  # type: ignore[attr-defined]
    assert args().disaggregation_mode == "null"  # type: ignore[attr-defined]


def test_the_bootstrap_server_answers_as_the_real_one() -> None:
    port = free_port()
    said: list[str] = []
    disagg.start_bootstrap(
        args("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)), said.append
    )  # type: ignore[arg-type]
    assert said == [f"CommonKVBootstrapServer started successfully on 127.0.0.1:{port}"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        assert r.read() == b"OK"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/route", timeout=5)
    assert missing.value.code == 400
    info = disagg.prefill_info("127.0.0.1", port)
    assert info is not None and info["page_size"] == 1 and info["kv_cache_dtype"] == "auto"
    assert json.dumps(info)


@pytest.mark.parametrize(
    ("decode_flags", "words"),
    [
        (["--page-size", "16"], PAGE_SIZE_WORDS),
        (["--kv-cache-dtype", "bf16"], "RuntimeError: KV cache dtype mismatch: prefill server has "
         "kv_cache_dtype=auto, but decode server has kv_cache_dtype=bf16. Both servers must use the same "
         "--kv-cache-dtype value."),
        ([], None),
    ],
)  # fmt: skip
def test_a_decode_refuses_a_routed_request_from_a_mismatched_prefill(
    decode_flags: list[str], words: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    disagg.start_bootstrap(
        args("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)), lambda m: None
    )  # type: ignore[arg-type]
    exits: list[int] = []
    monkeypatch.setattr(
        disagg.threading, "Timer", lambda s, f: type("T", (), {"start": lambda self: exits.append(1)})()
    )
    logged: list[str] = []
    check = disagg.decode_check(args("--disaggregation-mode", "decode", *decode_flags), logged.append)  # type: ignore[arg-type]
    assert check({"bootstrap_host": "2.2.2.2", "bootstrap_port": port}) is None  # SGLang's own warmup
    assert check({}) is None
    got = check({"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 7})
    assert got == words
    assert logged == ([words] if words else []) and exits == ([1] if words else [])  # the decode exits
