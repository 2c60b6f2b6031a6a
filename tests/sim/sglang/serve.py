"""HTTP side of the simulated SGLang server: health, info, models, chat completions, generate."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD = re.compile(r"\w+|[^\w\s]")
ANIMALS = {
    *("dog", "cat", "fox", "horse", "cow", "bird", "mouse", "rabbit", "lion", "tiger", "bear", "wolf"),
    *("sheep", "pig", "goat", "duck", "owl", "frog", "fish", "snake", "elephant", "monkey", "deer", "camel"),
}


def count_tokens(text: str) -> int:
    """A stand-in tokenizer: one token per word or punctuation mark."""
    return len(WORD.findall(text))


def answer(prompt: str) -> str:
    """Answer the smoke test's needle question from the prompt; anything else gets a fixed reply."""
    if re.search(r"what animal", prompt, re.IGNORECASE):
        found = [w.lower() for w in WORD.findall(prompt) if w.lower() in ANIMALS]
        return found[-1].capitalize() if found else "None"
    if re.search(r"capital .*France", prompt, re.IGNORECASE):
        return "Paris."
    return "This is a reply from the simulated SGLang server."


@dataclass
class State:
    """What the HTTP side knows about the running server."""

    version: tuple[int, int, int]
    served_model_name: str
    context_len: int
    pool: int
    prefill_tokens_per_s: float
    allow_auto_truncate: bool
    enable_metrics: bool
    server_info: dict[str, Any]
    model_info: dict[str, Any]
    access_log: Callable[[str], None]
    ready: threading.Event = field(default_factory=threading.Event)
    odd_reply: str = ""  # a fault: chat completions answer with this kind of malformed body
    api_key: str | None = None  # --api-key: /v1/* answers 401 without `Authorization: Bearer <key>`
    max_running: int = 1 << 30  # the scheduler's cap: requests beyond it wait
    decode_seconds_per_token: float = 0.0  # SGLANG_SIM_DECODE_SECONDS_PER_TOKEN: long generations
    draining: threading.Event = field(default_factory=threading.Event)  # SIGTERM received
    in_flight: dict[str, float] = field(default_factory=dict)  # rid -> when it arrived
    # SGLANG_SIM_OOM_OVER_TOKENS (a fault): more prompt tokens than this in prefill at once is a CUDA OOM, as
    # a fraction that leaves too little for activations gives under load
    oom_over_tokens: int = 0
    prefilling: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # multi-node: another node's connection closed. No heartbeat tells node 0 (SGLang issues #3099, #4780),
    # so /health stays 200 and only a request's collective, which never completes, times out
    peer_lost: Callable[[], bool] = lambda: False
    peer_timeout_s: float = 5.0  # SGLANG_SIM_PEER_TIMEOUT_S
    error_log: Callable[[str], None] = print
    # a decode of a prefill-decode pair: why a routed request cannot be served (disagg.py), else None
    routed: Callable[[dict[str, Any]], str | None] = lambda body: None
    # PD with --enable-pd-role-switch: POST /pd_role_switch (disagg.Roles.switch); a server of no PD role 404s
    role_switch: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]] | None = None
    finished: int = 0  # requests answered: /metrics sglang:num_requests_total (not health checks)

    def loads(self) -> dict[str, Any]:
        """GET /v1/loads?include=core as SGLang 0.5.23 answers it (v1_loads.py, load_snapshot.py)."""
        with self.lock:
            n = len(self.in_flight)
        rank = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": min(n, self.max_running)}
        rank |= {"num_waiting_reqs": max(0, n - self.max_running), "num_used_tokens": 0}
        rank |= {"max_total_num_tokens": self.pool, "max_running_requests": self.max_running}
        version = ".".join(map(str, self.version))
        return {"timestamp": "", "version": version, "accelerator": "NVIDIA H200", "num_accelerators": 1,
                "loads": [rank]}  # fmt: skip

    @property
    def max_req_input_len(self) -> int:
        return min(self.context_len - 1, self.pool - 1) - 5


class BadRequest(Exception):
    """A request SGLang answers with HTTP 400."""


class CollectiveTimeout(Exception):
    """A request whose collective never completes because another node is gone: HTTP 500."""


def collective(state: State) -> None:
    """A forward pass needs every node: with one gone it waits out the timeout, logs as NCCL's watchdog
    does (ProcessGroupNCCL.cpp) and fails."""
    if not state.peer_lost():
        return
    time.sleep(state.peer_timeout_s)
    ms = round(state.peer_timeout_s * 1000)
    message = (
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2051, OpType=ALLREDUCE, "
        f"NumelIn=7168, NumelOut=7168, Timeout(ms)={ms}) ran for {ms + 3} milliseconds before timing out."
    )
    state.error_log(message)
    raise CollectiveTimeout(message)


def check_length(state: State, n: int, max_new: int | None) -> int:
    """Apply SGLang's length checks; return the (possibly truncated) prompt length."""
    if n >= state.context_len:
        if not state.allow_auto_truncate:
            raise BadRequest(
                f"The input ({n} tokens) is longer than the model's context length "
                f"({state.context_len} tokens)."
            )
        n = state.context_len - 1
    if max_new is not None and n + max_new > state.context_len:
        raise BadRequest(
            "Requested token count exceeds the model's maximum context length of "
            f"{state.context_len} tokens. "
            f"You requested a total of {n + max_new} tokens: {n} tokens from the input messages and "
            f"{max_new} tokens for the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit."
        )
    if n > state.max_req_input_len:
        if not state.allow_auto_truncate:
            raise BadRequest(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({state.max_req_input_len} "
                "tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        n = state.max_req_input_len
    return n


def generate(state: State, prompt: str, prompt_tokens: int, max_new: int | None) -> tuple[str, int, int]:
    """Run one simulated request: length checks, prefill time, decode time, a short answer."""
    n = check_length(state, prompt_tokens, max_new)
    collective(state)
    rid = uuid.uuid4().hex
    with state.lock:
        state.in_flight[rid] = time.time()
    try:
        time.sleep(n / state.prefill_tokens_per_s + (max_new or 0) * state.decode_seconds_per_token)
    finally:
        with state.lock:
            del state.in_flight[rid]
            state.finished += 1
    words = WORD.findall(answer(prompt))
    if max_new is not None:
        words = words[:max_new]
    text = " ".join(words).replace(" .", ".").replace(" ,", ",")
    return text, n, len(words)


def message_text(content: Any) -> str:
    """The text of an OpenAI message content (a string or a list of parts)."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


class Handler(BaseHTTPRequestHandler):
    """One request; the routes mirror SGLang's FastAPI app."""

    server_version = "uvicorn"
    sys_version = ""
    state: State

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        host, port = self.client_address[:2]
        phrase = self.responses.get(int(code), ("",))[0] if str(code).isdigit() else ""
        # A request line refused before it was parsed (the router's HTTP/2 preface, "PRI * HTTP/2.0") has
        # no path yet: uvicorn logs it and warns "Invalid HTTP request received.", the server lives on.
        line = getattr(self, "requestline", "") or f"{self.command} {getattr(self, 'path', '')}"
        self.state.access_log(f'{host}:{port} - "{line}" {code} {phrase}')

    def reply(self, code: int, body: Any = None, ctype: str = "application/json") -> None:
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code: int, message: str) -> None:
        self.reply(
            code,
            {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": code},
        )

    def refused(self) -> bool:
        """SGLang's API-key check: only the OpenAI-style routes need the key here."""
        key = self.state.api_key
        if not key or not self.path.startswith("/v1/"):
            return False
        if self.headers.get("authorization") == f"Bearer {key}":
            return False
        self.reply(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        if self.refused():
            return
        s, path = self.state, self.path.split("?")[0]
        new = s.version >= (0, 5, 10)
        if path in ("/health", "/health_generate"):
            always_up = path == "/health" and s.version < (0, 4, 10)
            # 503 while it drains after SIGTERM, though it still takes new requests (http_server.py)
            self.reply(200 if always_up or (s.ready.is_set() and not s.draining.is_set()) else 503)
        elif path == "/v1/loads" and s.version >= (0, 5, 23):  # the release read for it
            self.reply(200, s.loads())
        elif path == "/get_server_info" or (new and path == "/server_info"):
            self.reply(200, s.server_info)
        elif path == "/get_model_info" or (new and path == "/model_info"):
            self.reply(200, s.model_info)
        elif path == "/v1/models":
            card = {
                "id": s.served_model_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
            }
            card |= {"root": s.served_model_name, "max_model_len": s.context_len}
            self.reply(200, {"object": "list", "data": [card]})
        elif path == "/metrics" and s.enable_metrics:
            name = s.served_model_name
            text = "# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV pool.\n"
            text += "# TYPE sglang:max_total_num_tokens gauge\n"
            text += f'sglang:max_total_num_tokens{{model_name="{name}"}} {s.pool}.0\n'
            text += "# TYPE sglang:num_requests_total counter\n"
            text += f'sglang:num_requests_total{{model_name="{name}",is_streaming="false"}} {s.finished}.0\n'
            running = s.loads()["loads"][0]
            for metric, key in (
                ("num_running_reqs", "num_running_reqs"),
                ("num_queue_reqs", "num_waiting_reqs"),
            ):
                text += f"# TYPE sglang:{metric} gauge\n"
                text += f'sglang:{metric}{{model_name="{name}"}} {running[key]}.0\n'
            self.reply(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.refused():
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        except ValueError:
            self.error(400, "Invalid JSON body")
            return
        wrong = self.state.routed(body) if isinstance(body, dict) else None
        if wrong is not None:
            self.reply(500, {"object": "error", "message": wrong, "type": "InternalServerError", "code": 500})
            return
        try:
            if self.path == "/v1/chat/completions":
                self.chat(body)
            elif self.path == "/generate":
                self.native_generate(body)
            elif self.path == "/pd_role_switch" and self.state.role_switch is not None:
                self.reply(*self.state.role_switch(body if isinstance(body, dict) else {}))
            else:
                self.reply(404, {"detail": "Not Found"})
        except BadRequest as exc:
            self.error(400, str(exc))
        except CollectiveTimeout as exc:
            body = {"object": "error", "message": str(exc), "type": "InternalServerError", "param": None}
            self.reply(500, body | {"code": 500})

    def chat(self, body: dict[str, Any]) -> None:
        if self.state.odd_reply:
            self.odd_chat_reply(self.state.odd_reply)
            return
        messages = body.get("messages") or []
        prompt = "\n".join(message_text(m.get("content")) for m in messages)
        # one role token per message stands in for the chat template
        n = sum(count_tokens(message_text(m.get("content"))) + 1 for m in messages)
        max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        if body.get("stream"):
            self.stream_chat(body, prompt, n, max_new)
            return
        text, n, m = generate(self.state, prompt, n, max_new)
        usage = {
            "prompt_tokens": n,
            "total_tokens": n + m,
            "completion_tokens": m,
            "prompt_tokens_details": None,
        }
        head = {"id": uuid.uuid4().hex, "created": int(time.time()), "model": self.state.served_model_name}
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None}}
        choice |= {"logprobs": None, "finish_reason": "stop", "matched_stop": None}
        self.reply(200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage})

    def stream_chat(self, body: dict[str, Any], prompt: str, n: int, max_new: int | None) -> None:
        """A streamed chat answer as SGLang sends it: the first token after the prefill, then one per step."""
        s = self.state
        n = check_length(s, n, max_new)
        collective(s)
        rid = uuid.uuid4().hex
        with s.lock:
            s.in_flight[rid] = time.time()
            s.prefilling += n
            oom = bool(s.oom_over_tokens) and s.prefilling > s.oom_over_tokens
        prefilled = False
        try:
            if oom:
                self.error(500, f"CUDA out of memory. Tried to allocate {n * 70 / 2**20:.2f} GiB")
                return
            time.sleep(n / s.prefill_tokens_per_s)
            with s.lock:
                s.prefilling -= n
            prefilled = True
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            head = {"id": rid, "created": int(time.time()), "model": s.served_model_name}
            words = WORD.findall(answer(prompt))[: max_new if max_new is not None else None]
            if body.get("ignore_eos") and max_new:
                words = (words * max_new)[:max_new] if words else ["x"] * max_new
            for word in words:
                delta = {"index": 0, "delta": {"content": word + " "}}
                self.wfile.write(f"data: {json.dumps({**head, 'choices': [delta]})}\n\n".encode())
                self.wfile.flush()
                time.sleep(s.decode_seconds_per_token)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": n, "completion_tokens": len(words), "total_tokens": n + len(words)}
                self.wfile.write(f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            with s.lock:
                del s.in_flight[rid]
                s.finished += 1
                if not prefilled:
                    s.prefilling -= n

    def odd_chat_reply(self, kind: str) -> None:
        """A 200 reply no healthy server gives: the smoke test must fail on it, never crash."""
        odd: dict[str, Any] = {
            "not_json": b"<html>upstream says hello</html>",
            "no_choices": {"id": "x", "object": "chat.completion", "choices": []},
            "error": {"error": {"message": "internal server error", "code": 500}},
            "list": [{"choices": [{"message": {"content": "dog"}}]}],
        }
        payload = odd[kind]
        self.reply(200, payload, "text/html" if isinstance(payload, bytes) else "application/json")

    def native_generate(self, body: dict[str, Any]) -> None:
        prompt = body.get("text") or ""
        n = len(body["input_ids"]) if body.get("input_ids") else count_tokens(str(prompt))
        max_new = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
        text, n, m = generate(self.state, str(prompt), n, max_new)
        meta = {"id": uuid.uuid4().hex, "prompt_tokens": n, "completion_tokens": m, "cached_tokens": 0}
        self.reply(
            200, {"text": text, "meta_info": meta | {"finish_reason": {"type": "stop", "matcher": None}}}
        )


class SimServer(ThreadingHTTPServer):
    """uvicorn's place: one thread per connection, none of them keeping the process alive."""

    daemon_threads = True


class SimServer6(SimServer):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, state: State) -> ThreadingHTTPServer:
    """Bind the listening socket (OSError when the port is taken)."""
    handler = type("BoundHandler", (Handler,), {"state": state})
    return (SimServer6 if ":" in host else SimServer)((host, port), handler)


class PlaceholderHandler(BaseHTTPRequestHandler):
    """A node rank >= 1's stand-in HTTP server (srt/utils/common.py launch_dummy_health_check_server):
    /health, /health_generate and /ping always 200, anything else 404; uvicorn at log_level=warning, so
    no access log."""

    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.split("?")[0] in ("/health", "/health_generate", "/ping"):
            self.answer(200, b"")
        else:
            self.answer(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        known = self.path.split("?")[0] in ("/health", "/health_generate", "/ping")
        self.answer(
            405 if known else 404, b'{"detail":"Method Not Allowed"}' if known else b'{"detail":"Not Found"}'
        )


def make_placeholder(host: str, port: int) -> ThreadingHTTPServer:
    """Bind the placeholder server (OSError when the port is taken)."""
    return (SimServer6 if ":" in host else SimServer)((host, port), PlaceholderHandler)
