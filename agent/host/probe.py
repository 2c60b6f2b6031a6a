"""HTTP checks of a started server: readiness, the pool it reports, and the long-prompt smoke test."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

with warnings.catch_warnings():  # the bundle ships requests without a charset detector; we never need one
    warnings.simplefilter("ignore")
    import requests
from tenacity import Retrying, retry_if_exception_type, retry_if_result, stop_after_delay, wait_fixed

from agent.protocol import Smoke


class ProbeError(Exception):
    """The server did not answer as a healthy SGLang does; the text says how."""


@dataclass(frozen=True)
class SmokeResult:
    prompt_tokens: int
    seconds: float
    answer: str
    passed: bool
    detail: str = ""


class Probe:
    def __init__(self, host: str, port: int) -> None:
        self.base = f"http://{host}:{port}"
        self.session = requests.Session()

    def wait_ready(self, timeout_s: float) -> None:
        """Poll /health until 200 (SGLang answers 503 while it warms up); only this step retries."""
        retrying = Retrying(
            retry=retry_if_exception_type(requests.RequestException) | retry_if_result(lambda ok: not ok),
            stop=stop_after_delay(timeout_s),
            wait=wait_fixed(0.1),
            reraise=True,
        )
        try:
            retrying(self._healthy)
        except requests.RequestException as exc:
            raise ProbeError(f"{self.base}/health did not answer within {timeout_s:.0f} s: {exc}") from None
        except Exception as exc:  # tenacity's RetryError when it gave up on 503s
            raise ProbeError(f"{self.base}/health not healthy within {timeout_s:.0f} s") from exc

    def _healthy(self) -> bool:
        return self.session.get(f"{self.base}/health", timeout=5).status_code == 200

    def server_info(self) -> dict[str, Any]:
        for path in ("/server_info", "/get_server_info"):  # /server_info exists from 0.5.10 on
            r = self.session.get(self.base + path, timeout=10)
            if r.status_code == 200:
                data = r.json()
                return data if isinstance(data, dict) else {}
        return {}

    def smoke(self, smoke: Smoke, model: str | None = None) -> SmokeResult:
        """A long prompt with a known answer: proves a request that needs the new context really fits."""
        words_per_sentence = max(1, len(smoke.sentence.replace(".", " .").split()))
        prompt = smoke.sentence * max(1, smoke.prompt_tokens // words_per_sentence) + smoke.question
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
        data = r.json()
        answer = str(data["choices"][0]["message"]["content"]).strip()
        tokens = int(data.get("usage", {}).get("prompt_tokens", 0))
        passed = smoke.expect.lower() in answer.lower()
        return SmokeResult(tokens, seconds, answer, passed, "" if passed else f"expected {smoke.expect!r}")
