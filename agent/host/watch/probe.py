"""HTTP checks of a started server: readiness, the pool it reports, and the long-prompt smoke test."""

from __future__ import annotations

import ipaddress
import json
import re
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

with warnings.catch_warnings():  # the bundle ships requests without a charset detector; we never need one
    warnings.simplefilter("ignore")
    import requests

from agent.host.watch.drain import Load, NoLoad, parse_loads, parse_metrics
from agent.host.watch.loadcheck import DECODE_TOKENS, LoadResult, LoadSpec, Reply, verdict
from agent.protocol.events import SmokeData
from agent.protocol.requests import Smoke

# SGLang 0.5.23's /health answers within SGLANG_HEALTH_CHECK_TIMEOUT (20 s, srt/entrypoints/http_server.py);
# a probe waits longer than that, so the server's health generation always ends with its own answer.
HEALTH_PROBE_S = 25.0
HEALTH_GAP_S = 1.0  # the least time between two probes: /health's own sleep step

# Words and marks: every tokenizer in use splits at least here (byte-level BPE, SentencePiece), so a prompt
# counted by the server below half of this did not reach the model whole.
_WORD = re.compile(r"\w+|[^\w\s]")


class ProbeError(Exception):
    """The server did not answer as a healthy SGLang does; the text says how."""


@dataclass(frozen=True)
class SmokeResult:
    prompt_tokens: int
    seconds: float
    answer: str
    passed: bool
    detail: str = ""

    def to_dict(self) -> SmokeData:
        return SmokeData(
            prompt_tokens=self.prompt_tokens,
            seconds=self.seconds,
            answer=self.answer,
            passed=self.passed,
            detail=self.detail,
        )


def url_host(host: str) -> str:
    """`host` as it goes in a URL: IPv6 literals in brackets (`::1` -> `[::1]`), anything else as is."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:  # a name, or already bracketed
        return host


def chat_answer(data: object) -> tuple[str | None, str]:
    """The assistant's text from a parsed chat-completions body, or None and why there is none."""
    if not isinstance(data, dict):
        return None, "reply is not a JSON object"
    if "error" in data:
        error = data["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        return None, f"server error: {str(message)[:200]}"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return None, "reply has no choices"
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return None, "first choice has no message"
    content = message.get("content")
    if not isinstance(content, str):
        return None, f"message content is {type(content).__name__}, not text"
    return content.strip(), ""


def usage_count(data: object, name: str = "prompt_tokens") -> int | None:
    """usage.<name> when the body carries it as a number (bool excluded), else None."""
    usage = data.get("usage") if isinstance(data, dict) else None
    tokens = usage.get(name) if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def prompt_tokens(data: object) -> int | None:
    return usage_count(data, "prompt_tokens")


def judge(expect: str, words_sent: int, tokens: int, completion: int | None, answer: str) -> str:
    """Why a smoke reply fails ("" when it passes). The prompt must have reached the model whole and an
    answer come; `expect` must be in it unless empty (a random-weight model answers noise)."""
    if tokens * 2 < words_sent:
        return (
            f"usage.prompt_tokens {tokens:,} is under half the {words_sent:,} words sent: the prompt was cut"
        )
    if completion is not None and completion < 1:
        return "no token was generated"
    if expect and expect.lower() not in answer.lower():
        return f"expected {expect!r}"
    return ""


class Probe:
    def __init__(self, host: str, port: int, api_key: str | None = None) -> None:
        self.base = f"http://{url_host(host)}:{port}"
        self.session = requests.Session()
        if api_key:  # a server started with --api-key answers /v1/* only with it
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        # The server is on this host: talk to it directly. Without this, requests reads HTTP(S)_PROXY,
        # ALL_PROXY and NO_PROXY from the environment (a unit or login shell may set them for downloads),
        # sends loopback traffic to the proxy and every check fails; it would also add credentials from
        # ~/.netrc or $NETRC and honour REQUESTS_CA_BUNDLE. trust_env=False turns all of that off at once.
        self.session.trust_env = False
        self.clock, self.sleep = time.monotonic, time.sleep  # fakes in the pure tests

    def wait_ready(self, timeout_s: float) -> None:
        """One GET /health at a time until 200, bounded by timeout_s (the last probe may end one probe's
        bound after it). Called once the journal's ready line is in, so the first probe normally answers.

        SGLang 0.5.23's /health (srt/entrypoints/http_server.py `health_generate`) answers 503 at once while
        the server starts, and otherwise generates one token and sleeps in 1 s steps until the scheduler
        answers, for up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) before its own 503. A client that gives up
        first leaves that generation running in the engine (sglang#35884: piled-up orphans crashed
        prefill), so each probe waits longer than the server's own bound, and the next probe starts no
        sooner than the last one took (and at least 1 s later): no two overlap, none is orphaned.
        """
        deadline = self.clock() + timeout_s
        last = "no answer yet"
        while True:
            began = self.clock()
            try:
                if self._healthy():
                    return
                last = "it answered 503"
            except requests.RequestException as exc:
                last = f"it did not answer: {exc}"
            took = self.clock() - began
            if self.clock() + max(HEALTH_GAP_S, took) >= deadline:
                raise ProbeError(f"{self.base}/health not healthy within {timeout_s:.0f} s ({last})")
            self.sleep(max(HEALTH_GAP_S, took))

    def _healthy(self) -> bool:
        return self.session.get(f"{self.base}/health", timeout=HEALTH_PROBE_S).status_code == 200

    def server_info(self) -> dict[str, Any]:
        """GET /server_info (/get_server_info before 0.5.10): the arguments the server resolved."""
        try:
            r = self.session.get(f"{self.base}/server_info", timeout=30)
            if r.status_code == 404:
                r = self.session.get(f"{self.base}/get_server_info", timeout=30)
            data: object = r.json() if r.status_code == 200 else None
        except (requests.RequestException, ValueError) as exc:
            raise ProbeError(f"{self.base}/server_info did not answer: {exc}") from None
        if not isinstance(data, dict):
            raise ProbeError(f"{self.base}/server_info answered HTTP {r.status_code}, not a JSON object")
        return data

    def requests_served(self) -> int | None:
        """The requests this server finished (`sglang:num_requests_total` of /metrics, summed over its
        label sets; SGLang 0.5.23 counts them in the tokenizer manager, srt/managers/tokenizer_manager.py
        collect_metrics, and not its own health checks: they are sent with log_metrics=False,
        srt/entrypoints/http_server.py:761). None when it does not say (no --enable-metrics)."""
        try:
            r = self.session.get(f"{self.base}/metrics", timeout=5)
        except requests.RequestException:
            return None
        return served_total(r.text) if r.status_code == 200 else None

    def smoke(self, smoke: Smoke, model: str | None = None) -> SmokeResult:
        """A long prompt with a known answer: proves a request that needs the new context really fits.
        With an empty `expect` (a random-weight model) any answer passes, once usage shows the prompt whole.

        Any reply but a well-formed completion is a failed test (passed=False, detail says why); only a
        request that gets no reply at all raises ProbeError.
        """
        prompt = long_prompt(smoke, smoke.prompt_tokens)
        body: dict[str, Any] = {
            "model": model or "default",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
            "temperature": 0,
        }
        start = time.monotonic()
        try:
            r = self.session.post(f"{self.base}/v1/chat/completions", json=body, timeout=smoke.timeout_s)
        except requests.RequestException as exc:
            raise ProbeError(f"smoke test request failed: {exc}") from None
        seconds = time.monotonic() - start
        if r.status_code != 200:
            return SmokeResult(0, seconds, "", False, f"HTTP {r.status_code}: {r.text[:200]}")
        try:
            data: object = r.json()
        except ValueError:
            return SmokeResult(0, seconds, "", False, f"reply is not JSON: {r.text[:200]!r}")
        answer, reason = chat_answer(data)
        tokens = prompt_tokens(data)
        if answer is None:
            return SmokeResult(tokens or 0, seconds, "", False, reason)
        if tokens is None:
            return SmokeResult(0, seconds, answer, False, "reply has no numeric usage.prompt_tokens")
        why = judge(
            smoke.expect, len(_WORD.findall(prompt)), tokens, usage_count(data, "completion_tokens"), answer
        )
        return SmokeResult(tokens, seconds, answer, not why, why)

    def load(self, smoke: Smoke, spec: LoadSpec, model: str | None = None) -> LoadResult:
        """The load check: spec.concurrent chunk-sized prompts and one long one, all at once, streamed."""
        prompts = [long_prompt(smoke, spec.chunk_tokens)] * spec.concurrent + [
            long_prompt(smoke, spec.long_tokens)
        ]
        replies: list[Reply] = [Reply(None, "not sent")] * len(prompts)
        start = time.monotonic()

        def send(i: int) -> None:
            replies[i] = self._stream(prompts[i], model, spec.timeout_s, DECODE_TOKENS)

        threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:  # each request is bounded by spec.timeout_s; this only adds a margin
            t.join(timeout=spec.timeout_s + 30)
        return verdict(replies[:-1], replies[-1], time.monotonic() - start)

    def _stream(self, prompt: str, model: str | None, timeout_s: float, max_tokens: int) -> Reply:
        """One streamed chat request: when its first token came and how it ended."""
        body = {
            "model": model or "default", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        session = requests.Session()  # one per thread: a Session is not shared across threads
        session.trust_env, session.headers = False, self.session.headers
        sent = time.monotonic()
        first: float | None = None
        usage: object = None
        try:
            with session.post(
                f"{self.base}/v1/chat/completions", json=body, stream=True, timeout=timeout_s
            ) as r:
                if r.status_code != 200:
                    return Reply(r.status_code, r.text[:200], total_s=time.monotonic() - sent)
                for line in r.iter_lines(chunk_size=64):  # small reads: each token's line as it comes
                    chunk = _event(line)
                    if chunk is None:
                        continue
                    if isinstance(chunk, dict) and "error" in chunk:
                        return Reply(200, f"error in the stream: {str(chunk['error'])[:200]}")
                    if first is None and _delta(chunk):
                        first = time.monotonic() - sent
                    usage = chunk if isinstance(chunk, dict) and chunk.get("usage") else usage
        except requests.RequestException as exc:
            return Reply(None, f"{type(exc).__name__}: {exc}"[:200], total_s=time.monotonic() - sent)
        return Reply(
            200, None, usage_count(usage), usage_count(usage, "completion_tokens"), first,
            time.monotonic() - sent,
        )  # fmt: skip


_SERVED = re.compile(r"^sglang:num_requests_total(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def served_total(metrics: str) -> int | None:
    """Prometheus text -> sglang:num_requests_total summed over its label sets; None without it."""
    values = _SERVED.findall(metrics)
    try:
        return int(sum(float(v) for v in values)) if values else None
    except ValueError:
        return None


def long_prompt(smoke: Smoke, tokens: int) -> str:
    """About `tokens` tokens of the smoke test's sentence, then its question."""
    words_per_sentence = max(1, len(smoke.sentence.replace(".", " .").split()))
    return smoke.sentence * max(1, tokens // words_per_sentence) + smoke.question


def _event(line: bytes) -> object:
    """One server-sent event line's JSON; None for blank lines, `[DONE]` and anything not JSON."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return None


def _delta(chunk: object) -> bool:
    """A chunk that carries generated text."""
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    return isinstance(delta, dict) and bool(delta.get("content") or delta.get("reasoning_content"))


def read_load(probe: Probe) -> Load | None:
    """The server's load from /v1/loads, else /metrics; None when it does not answer (down, starting).

    Raises NoLoad when it answers but offers neither (an older SGLang without --enable-metrics).
    """
    try:
        r = probe.session.get(f"{probe.base}/v1/loads", params={"include": "core"}, timeout=5)
        if r.status_code == 404:
            m = probe.session.get(f"{probe.base}/metrics", timeout=5)
            if m.status_code != 200:
                raise NoLoad(f"/v1/loads and /metrics answer {r.status_code} and {m.status_code}")
            metrics = parse_metrics(m.text)
            if metrics is None:
                raise NoLoad("/metrics carries no sglang:num_running_reqs and sglang:num_queue_reqs")
            return metrics
        if r.status_code != 200:
            return None
        body: object = r.json()
    except requests.RequestException:
        return None
    except ValueError:
        raise NoLoad("/v1/loads did not answer JSON") from None
    load = parse_loads(body)
    if load is None:
        raise NoLoad("/v1/loads carries no num_running_reqs and num_waiting_reqs")
    return load
