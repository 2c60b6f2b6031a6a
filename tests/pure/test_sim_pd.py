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


def test_the_routers_http2_preface_is_logged_and_the_server_lives_on() -> None:
    """sglang-router 0.3.2 probes every worker with an HTTP/2 preface: SGLang logs it as a bad request and
    goes on. The simulated server did the same until it logged a line refused before its path was parsed
    (an AttributeError in the handler, read from its journal as the start's failure)."""
    import threading

    from sglang.serve import State, make_server

    logged: list[str] = []
    state = State((0, 5, 23), "m", 4096, 1, 1.0, False, False, {}, {}, logged.append)
    state.ready.set()
    server = make_server("127.0.0.1", 0, state)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    errors: list[object] = []
    server.handle_error = lambda request, address: errors.append(sys.exc_info()[1])  # type: ignore[method-assign]
    try:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            s.recv(4096)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    finally:
        server.shutdown()
    assert errors == []
    assert any("PRI * HTTP/2.0" in line for line in logged), logged


def test_each_answered_request_counts_in_metrics_as_sglangs_num_requests_total() -> None:
    """--enable-metrics: /metrics carries sglang:num_requests_total, one more per answered request (not
    per health check), read back by the probe's parser as the routed check reads a decode's."""
    import threading

    from sglang.serve import State, make_server

    from agent.host.watch.probe import Probe

    state = State((0, 5, 23), "m", 4096, 100000, 1e6, False, True, {}, {}, lambda line: None)
    state.ready.set()
    server = make_server("127.0.0.1", 0, state)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = Probe("127.0.0.1", server.server_address[1])
        assert probe.requests_served() == 0
        probe.wait_ready(5)
        body = json.dumps({"text": "the dog", "sampling_params": {"max_new_tokens": 2}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}/generate", data=body)
        urllib.request.urlopen(req, timeout=5).read()
        assert probe.requests_served() == 1
    finally:
        server.shutdown()


def test_the_served_count_is_summed_over_label_sets_and_none_without_it() -> None:
    from agent.host.watch.probe import served_total

    text = (
        "# TYPE sglang:num_requests_total counter\n"
        'sglang:num_requests_total{model_name="m",is_streaming="false"} 3.0\n'
        'sglang:num_requests_total{model_name="m",is_streaming="true"} 2.0\n'
        'sglang:num_requests_total_created{model_name="m"} 1.7e9\n'
    )
    assert served_total(text) == 5
    assert served_total("sglang:num_running_reqs 0.0\n") is None


def test_a_decode_with_the_kv_checksum_aborts_a_request_whose_digest_sglangs_switch_flips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    disagg.start_bootstrap(
        args("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)), lambda m: None
    )  # type: ignore[arg-type]
    routed = {"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 7}
    logged: list[str] = []
    on = disagg.decode_check(
        args("--disaggregation-mode", "decode", "--disaggregation-enable-kv-checksum"), logged.append
    )  # type: ignore[arg-type]
    assert on(routed) is None  # no switch: the digests match
    monkeypatch.setenv("SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB", "1")
    assert on(routed) == "KV checksum mismatch"
    assert logged and logged[0].startswith("KV checksum mismatch req=") and "bootstrap_room=7" in logged[0]
    off = disagg.decode_check(args("--disaggregation-mode", "decode"), logged.append)  # type: ignore[arg-type]
    assert off(routed) is None  # without the flag nothing is verified
