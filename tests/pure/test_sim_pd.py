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
from typing import Any

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


def _switching_server(*flags: str) -> tuple[Any, Any, str]:
    """A simulated server of a PD role with `POST /pd_role_switch` wired as startup.py wires it."""
    import threading

    from sglang.serve import State, make_server

    info: dict[str, Any] = {"internal_states": [{}]}
    state = State((0, 5, 23), "m", 4096, 100000, 1e6, False, False, info, {}, lambda line: None)
    state.ready.set()
    roles = disagg.Roles(args(*flags), lambda line: None, lambda: bool(state.in_flight), info)  # type: ignore[arg-type]
    state.routed, state.role_switch = roles.routed, roles.switch
    server = make_server("127.0.0.1", 0, state)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state, f"http://127.0.0.1:{server.server_address[1]}"


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{url}/pd_role_switch", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


PREFILL = ("--disaggregation-mode", "prefill", "--enable-pd-role-switch")


def test_a_role_switch_as_sglang_answers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang 0.5.23's rejections in its words and order (tokenizer_control_mixin.py:926,
    role_switch.py:169), 400 with the same object; a switch flips the role a routed request meets."""
    monkeypatch.delenv("SGLANG_SIM_ROLE_SWITCH_FAIL", raising=False)
    server, state, url = _switching_server(*PREFILL)
    try:
        same = {"success": True, "message": "already in target role", "old_role": "prefill"}
        assert _post(url, {"new_role": "prefill"}) == (
            200,
            {**same, "new_role": "prefill", "safe_to_restore": False},
        )
        code, said = _post(url, {"new_role": "decode"})
        assert (code, said["message"], said["safe_to_restore"]) == (400, disagg.GRAPH_WORDS, True)
        assert _post(url, {"new_role": "both"})[1]["message"] == "invalid new_role='both'"
        state.in_flight["r1"] = 0.0
        assert _post(url, {"new_role": "decode", "decode_cuda_graph_memory_gb": 0.25})[1]["message"] == (
            disagg.BUSY_WORDS
        )
        state.in_flight.clear()
        assert state.server_info["internal_states"][0]["decode_cuda_graph_memory_gb"] == 0.0
        code, said = _post(url, {"new_role": "decode", "decode_cuda_graph_memory_gb": 0.25})
        assert (code, said["success"], said["message"], said["old_role"]) == (200, True, "ok", "prefill")
        assert state.server_info["disaggregation_mode"] == "decode"
        assert state.server_info["internal_states"][0]["decode_cuda_graph_memory_gb"] == 0.25
        assert _post(url, {"new_role": "prefill"})[1]["success"] is True  # back, graphs kept
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("flags", "env", "words"),
    [
        (("--disaggregation-mode", "prefill"), None, "--enable-pd-role-switch is not set on this server"),
        (("--enable-pd-role-switch",), None, "instance is not running in PD disaggregation mode"),
        ((*PREFILL, "--disaggregation-transfer-backend", "nixl"), None,
         "transfer backend 'nixl' does not support runtime role switch"),
        (PREFILL, "SGLANG_DISAGG_STAGING_BUFFER", disagg.STAGING_WORDS),
    ],
)  # fmt: skip
def test_each_rejection_safe_to_restore(
    flags: tuple[str, ...], env: str | None, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env:
        monkeypatch.setenv(env, "1")
    server, _, url = _switching_server(*flags)
    try:
        assert _post(url, {"new_role": "decode", "decode_cuda_graph_memory_gb": 0}) == (400, {
            "success": False, "message": words, "old_role": flags[1] if flags[0].endswith("mode") else "null",
            "new_role": "decode", "safe_to_restore": True})  # fmt: skip
    finally:
        server.shutdown()


def test_a_rebuild_that_fails_leaves_the_server_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    """role_switch.py:134: teardown or rebuild raised: not safe to restore, and every later switch is
    refused until a restart."""
    monkeypatch.setenv("SGLANG_SIM_ROLE_SWITCH_FAIL", "1")
    server, _, url = _switching_server(*PREFILL)
    try:
        code, said = _post(url, {"new_role": "decode", "decode_cuda_graph_memory_gb": 0.25})
        assert (code, said["success"], said["safe_to_restore"]) == (400, False, False)
        assert said["message"].startswith("role switch failed; instance unhealthy, restart required")
        again = _post(url, {"new_role": "decode", "decode_cuda_graph_memory_gb": 0.25})[1]
        assert again["message"] == "instance is unhealthy after a failed role switch; restart required"
    finally:
        server.shutdown()
