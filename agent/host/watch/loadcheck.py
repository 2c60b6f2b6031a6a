"""Pure: the load check before a commit -- what to send, and what the replies say.

`[smoke] load = N` sends, at once, N prompts of the start's chunked-prefill size (the largest piece SGLang
prefills in one step: managers/scheduler.py chunks longer prompts into it) and one prompt at the target
context, streamed. A new fraction that leaves too little memory for activations fails here (SGLang answers
an error, or the connection ends) rather than on the first busy hour; any such reply rolls the change back.
The long prompt's stream gives the two figures the trade-off is about: prefill tokens per second (its
prompt over the time to its first token) and decode milliseconds per token at that context.

The HTTP side is `agent/host/watch/probe.py` (Probe.load); these functions only decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol.events import LoadData

DECODE_TOKENS = 32  # the long prompt's answer: enough steps for a decode time per token


@dataclass(frozen=True)
class LoadSpec:
    concurrent: int  # prompts of chunk_tokens
    chunk_tokens: int
    long_tokens: int  # the one prompt at the target context
    timeout_s: float


def spec(concurrent: int, chunked_prefill: int | None, context: int, timeout_s: float) -> LoadSpec:
    """The prompts' sizes: the start's chunked-prefill size (SGLang's 8192 when it logged none), capped at
    the context; the long one at 90 % of the context, as the smoke test, to leave room for the answer."""
    chunk = min(chunked_prefill if chunked_prefill and chunked_prefill > 0 else 8192, context)
    return LoadSpec(concurrent, max(1, int(chunk * 0.9)), max(1, int(context * 0.9)), timeout_s)


@dataclass(frozen=True)
class Reply:
    """One request of the load check, as it ended."""

    status: int | None  # HTTP status; None: no reply (refused, reset, timed out)
    error: str | None  # what went wrong, in the server's or the client's words
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token_s: float | None = None  # from the send to the first streamed token
    total_s: float = 0.0


@dataclass(frozen=True)
class LoadResult:
    requests: int
    failed: int
    detail: str | None  # the first failure
    prefill_tokens_per_s: float | None
    decode_ms_per_token: float | None
    long_prompt_tokens: int | None
    seconds: float

    def to_dict(self) -> LoadData:
        return LoadData(
            requests=self.requests, failed=self.failed, detail=self.detail,
            prefill_tokens_per_s=self.prefill_tokens_per_s, decode_ms_per_token=self.decode_ms_per_token,
            long_prompt_tokens=self.long_prompt_tokens, seconds=self.seconds,
        )  # fmt: skip

    @property
    def passed(self) -> bool:
        return self.failed == 0

    def describe(self, load: LoadSpec) -> str:
        sent = (
            f"{load.concurrent} × {load.chunk_tokens:,}-token prompts and one of {load.long_tokens:,} at once"
        )
        if not self.passed:
            return f"{sent}: {self.failed} of {self.requests} failed ({self.detail})"
        figures = []
        if self.prefill_tokens_per_s is not None:
            figures.append(f"prefill {self.prefill_tokens_per_s:,.0f} tokens/s")
        if self.decode_ms_per_token is not None:
            figures.append(
                f"decode {self.decode_ms_per_token:,.1f} ms/token at {self.long_prompt_tokens:,} tokens"
            )
        return f"{sent}: all answered in {self.seconds:.1f} s" + (
            f"; {', '.join(figures)}" if figures else ""
        )


def _failure(reply: Reply) -> str | None:
    if reply.status is None:
        return reply.error or "no reply"
    if reply.status != 200:
        return f"HTTP {reply.status}: {reply.error or ''}".rstrip(": ")
    if reply.error:
        return reply.error
    if not reply.completion_tokens:
        return "a reply with no token"
    return None


def verdict(chunks: list[Reply], long: Reply, seconds: float) -> LoadResult:
    """The load check's verdict and figures from its replies (the long prompt's last)."""
    replies = [*chunks, long]
    failures = [f for f in map(_failure, replies) if f is not None]
    prefill = decode = None
    if _failure(long) is None and long.first_token_s and long.prompt_tokens:
        prefill = round(long.prompt_tokens / long.first_token_s, 1)
        steps = (long.completion_tokens or 0) - 1
        if steps > 0 and long.total_s > long.first_token_s:
            decode = round((long.total_s - long.first_token_s) / steps * 1000, 2)
    return LoadResult(
        len(replies), len(failures), failures[0] if failures else None, prefill, decode, long.prompt_tokens,
        round(seconds, 3),
    )  # fmt: skip
