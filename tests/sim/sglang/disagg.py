"""Prefill-decode disaggregation in the simulated server, what deployctl's [pd] apply meets on a test host.

A prefill (`--disaggregation-mode prefill`) runs SGLang's bootstrap server on --disaggregation-bootstrap-port
(8998 by default): `GET /health` -> OK, `GET /route` with its four rank parameters -> what the prefill
publishes, its page size and its KV dtype as the flags' text (measured on the real 0.5.23,
/work/shared/sglang/PD-AND-HICACHE-ON-CPU.md). A decode, at a routed request (one that carries
`bootstrap_host`/`bootstrap_port`, as sglang-router in PD mode adds), fetches that from the prefill and
compares: a different page size or KV dtype text kills the decode with SGLang's own words
(srt/disaggregation/common/conn.py), and the server exits. No KV moves: each side answers as the plain sim.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's own warmup and health requests (srt/disaggregation/utils.py)
RANKS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")


def add_flags(p: argparse.ArgumentParser) -> None:
    """srt/arg_groups/fields/disagg.py, the flags deployctl renders."""
    add = p.add_argument
    add("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    add("--disaggregation-transfer-backend", default="mooncake",
        choices=["mooncake", "mooncake_tcp", "nixl", "mori", "ascend", "fake"])  # fmt: skip
    add("--disaggregation-bootstrap-port", type=int, default=8998)
    add("--disaggregation-ib-device")
    add("--disaggregation-enable-kv-checksum", action="store_true")
    add("--enable-pd-role-switch", action="store_true")


def published(args: argparse.Namespace) -> dict[str, Any]:
    """What a prefill's bootstrap server answers at /route: the flags' own text, as the real one."""
    return {
        "attn_tp_size": args.tp_size, "attn_cp_size": 1, "dp_size": args.dp_size, "pp_size": 1,
        "page_size": args.page_size or 1, "kv_cache_dtype": args.kv_cache_dtype,
        "follow_bootstrap_room": True, "prefill_http_port": args.port,
    }  # fmt: skip


def start_bootstrap(args: argparse.Namespace, log: Callable[[str], None]) -> None:
    """The prefill's bootstrap server, in a thread of the server process (it dies with it)."""
    info = published(args)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: Any) -> None:
            pass

        def send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/health":
                self.send(200, b"OK", "text/plain")
            elif url.path == "/route" and all(k in parse_qs(url.query) for k in RANKS):
                self.send(200, json.dumps(info).encode())
            elif url.path == "/route":
                self.send(400, b"Missing inputs for bootstrap server.", "text/plain")
            else:
                self.send(404, b"Not Found", "text/plain")

    httpd = ThreadingHTTPServer((args.host, args.disaggregation_bootstrap_port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(f"CommonKVBootstrapServer started successfully on {args.host}:{args.disaggregation_bootstrap_port}")


def mismatch(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """SGLang's handshake check on the decode (srt/disaggregation/common/conn.py), its words."""
    if theirs.get("page_size") != mine["page_size"]:
        return (f"RuntimeError: Page size mismatch: prefill server has page_size={theirs.get('page_size')}, "
                f"but decode server has page_size={mine['page_size']}. Both servers must use the same "
                "--page-size value.")  # fmt: skip
    if theirs.get("kv_cache_dtype") != mine["kv_cache_dtype"]:
        theirs_dtype, mine_dtype = theirs.get("kv_cache_dtype"), mine["kv_cache_dtype"]
        return (f"RuntimeError: KV cache dtype mismatch: prefill server has kv_cache_dtype={theirs_dtype}, "
                f"but decode server has kv_cache_dtype={mine_dtype}. Both servers must use the same "
                "--kv-cache-dtype value.")  # fmt: skip
    return None


def prefill_info(host: str, port: int) -> dict[str, Any] | None:
    query = "&".join(f"{k}=-1" for k in RANKS)
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/route?{query}", timeout=5) as r:
            answer = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def decode_check(
    args: argparse.Namespace, log: Callable[[str], None]
) -> Callable[[dict[str, Any]], str | None]:
    """A decode's check of each routed request: None to serve it, or why it cannot (the server then exits
    on a mismatch, as the real decode does)."""
    mine = published(args)

    def check(body: dict[str, Any]) -> str | None:
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        if not host or host == FAKE_BOOTSTRAP_HOST or not isinstance(port, int):
            return None
        theirs = prefill_info(str(host), port)
        if theirs is None:
            return f"Could not fetch prefill parallel info from {host}:{port}"
        wrong = mismatch(mine, theirs)
        if wrong is not None:
            log(wrong)
            threading.Timer(0.2, lambda: os._exit(1)).start()  # "the decode server exits"
            return wrong
        return checksum(args, body, log)

    return check


def checksum(args: argparse.Namespace, body: dict[str, Any], log: Callable[[str], None]) -> str | None:
    """--disaggregation-enable-kv-checksum on a decode: SGLang's own test switch
    SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB flips the digest of that share of requests (as a corrupted
    transfer would); the decode logs the mismatch and aborts the request with a 500, and serves on
    (srt/disaggregation/decode.py _verify_kv_checksums, _handle_kv_checksum_mismatch)."""
    prob = float(os.environ.get("SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB") or 0)
    if not args.disaggregation_enable_kv_checksum or prob <= 0 or random.random() >= prob:
        return None
    room = body.get("bootstrap_room")
    log(f"KV checksum mismatch req={body.get('rid') or 'sim'} bootstrap_room={room} "
        "expected=0x5d2f01c3 got=0x5d2f01c2")  # fmt: skip
    return "KV checksum mismatch"


STAGING_WORDS = "staging buffer (SGLANG_DISAGG_STAGING_BUFFER) is not supported with runtime role switch"
BUSY_WORDS = "instance is not idle; drain all requests before switching"
GRAPH_WORDS = "decode_cuda_graph_memory_gb is required before capturing decode graphs"


class Roles:
    """The server's PD role as it runs, which `POST /pd_role_switch` flips (disaggregation/role_switch.py):
    the decode's check of routed requests follows the role; the bootstrap server, started on every PD
    instance with --enable-pd-role-switch (srt/managers/disagg_service.py:26), is not rebuilt."""

    def __init__(
        self,
        args: argparse.Namespace,
        log: Callable[[str], None],
        busy: Callable[[], bool],
        info: dict[str, Any],
    ) -> None:
        self.args, self.log, self.busy, self.info = args, log, busy, info
        self.mode: str = args.disaggregation_mode
        self.decode_graphs = self.mode == "decode"  # a prefill launches eager (model_runner.py:1645)
        self.unhealthy = False
        self.check = decode_check(args, log)
        self.show()

    def show(self) -> None:
        """/get_server_info's role and its first state's decode graph memory, what a switch to decode takes
        from a decode peer (scheduler_components/internal_state.py:104)."""
        self.info["disaggregation_mode"] = self.mode
        if self.mode != "null" and self.info.get("internal_states"):
            first = self.info["internal_states"][0]
            first["disaggregation_mode"] = self.mode
            first["decode_cuda_graph_memory_gb"] = 0.25 if self.decode_graphs else 0.0

    def routed(self, body: dict[str, Any]) -> str | None:
        return self.check(body) if self.mode == "decode" else None

    def switch(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """SGLang's answer: 200 on success, 400 with the same object on a rejection (http_server.py:1635)."""
        new = str(body.get("new_role") or "").lower()
        out = {"success": False, "old_role": self.mode, "new_role": new, "safe_to_restore": True}
        why = self.rejected(new, body)
        if why is not None:
            self.log(f"PD role switch rejected ({self.mode} -> {new}): {why[0]}")
            return 400, out | {"message": why[0], "safe_to_restore": why[1]}
        if new == self.mode:
            return 200, out | {"success": True, "message": "already in target role", "safe_to_restore": False}
        if os.environ.get("SGLANG_SIM_ROLE_SWITCH_FAIL"):  # a teardown/rebuild that raises
            self.unhealthy = True
            self.log(
                f"PD role switch ({self.mode} -> {new}) failed during teardown/rebuild; instance unhealthy"
            )
            message = "role switch failed; instance unhealthy, restart required: simulated rebuild failure"
            return 400, out | {"message": message, "safe_to_restore": False}
        self.log(f"PD role switch succeeded: {self.mode} -> {new}")
        self.mode, self.decode_graphs = new, self.decode_graphs or new == "decode"
        self.show()
        return 200, out | {"success": True, "message": "ok", "safe_to_restore": False}

    def rejected(self, new: str, body: dict[str, Any]) -> tuple[str, bool] | None:
        """tokenizer_control_mixin.py:926, then role_switch.py:169 _reject_reason in its order, the idle
        check and the decode graphs' memory (role_switch.py:73-111)."""
        a = self.args
        staging = os.environ.get("SGLANG_DISAGG_STAGING_BUFFER", "").lower() in ("1", "true")
        graph_gb = body.get("decode_cuda_graph_memory_gb")
        graphs = new == "decode" and not self.decode_graphs and new != self.mode
        checks = (
            (not a.enable_pd_role_switch, True, "--enable-pd-role-switch is not set on this server"),
            (self.unhealthy, False, "instance is unhealthy after a failed role switch; restart required"),
            (new not in ("prefill", "decode"), True, f"invalid new_role={new!r}"),
            (self.mode == "null", True, "instance is not running in PD disaggregation mode"),
            (a.disaggregation_transfer_backend not in ("mooncake", "mooncake_tcp", "mori"), True,
             f"transfer backend {a.disaggregation_transfer_backend!r} does not support runtime role switch"),
            (staging, True, STAGING_WORDS),
            (new != self.mode and self.busy(), True, BUSY_WORDS),
            (graphs and graph_gb is None, True, GRAPH_WORDS),
            (graphs and isinstance(graph_gb, (int, float)) and graph_gb < 0, True,
             "decode_cuda_graph_memory_gb must be non-negative"),
        )  # fmt: skip
        return next(((msg, safe) for failed, safe, msg in checks if failed), None)
