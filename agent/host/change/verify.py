"""The verify step of the host transaction: once the log said ready, the HTTP API answers, runs what was
rendered (/server_info), a long prompt fits (the smoke test) and, with [smoke] load, the load check passes."""

from __future__ import annotations

from agent.host.change.ports import Change, Ports, ProbePort, Run, flags_of, node_rank
from agent.host.roles.pdrouter import checksum_said, is_router, routed_check
from agent.host.roles.routerstep import rejoin_verified
from agent.host.watch import loadcheck, serverinfo
from agent.host.watch.start import WatchResult
from agent.protocol.events import Stage
from agent.protocol.requests import Smoke


def verify(p: Ports, run: Run, started: WatchResult, change: Change) -> str | None:
    """After the log said ready: the HTTP API answers, runs what was rendered, and a long prompt fits.
    A node rank >= 1 has a placeholder that answers 200 to anything: rank 0 is checked instead."""
    if is_router(p):  # a [pd] router: a routed completion is its whole check
        return routed_check(p, change.smoke, started.invocation_id)
    if node_rank(change.new) >= 1:
        return None
    return (
        verify_http(p, run, started, change) or rejoin_verified(p)
        or routed_check(p, change.smoke, started.invocation_id)
        or checksum_said(p, started.invocation_id, flags_of(change.new))
    )  # fmt: skip


def verify_http(p: Ports, run: Run, started: WatchResult, change: Change) -> str | None:
    from agent.host.watch.probe import ProbeError  # requests: only once a start is ready

    probe, smoke, gate = p.http(), change.smoke, change.gate
    try:
        probe.wait_ready(p.req.timeouts.ready_s)
        p.log.emit(Stage.READY, "step", "the server answers /health")
        wrong = serverinfo.verdict(flags_of(change.new), probe.server_info())
        if wrong is not None:
            p.log.emit(Stage.GATE, "warning", wrong)
            return wrong
        p.log.emit(Stage.READY, "step", "/server_info shows the rendered context, fraction and cap")
        if smoke is None or not smoke.enabled:
            return None
        context = started.summary.get("context_len") or gate.target_context or smoke.prompt_tokens
        fitted = Smoke(**{**smoke.__dict__, "prompt_tokens": min(smoke.prompt_tokens, int(context * 0.9))})
        p.log.emit(Stage.SMOKE, "step", f"smoke test: a prompt of ~{fitted.prompt_tokens:,} tokens")
        res = probe.smoke(fitted)
    except ProbeError as exc:
        return str(exc)
    run.smoke_result = res
    p.log.emit(
        Stage.SMOKE,
        "step",
        f"answer {res.answer!r} after {res.seconds:.1f} s ({res.prompt_tokens:,} prompt tokens)",
        prompt_tokens=res.prompt_tokens,
        seconds=round(res.seconds, 3),
        answer=res.answer,
        passed=res.passed,
    )
    if not res.passed:
        return f"smoke test failed: {res.detail or res.answer}"
    if not smoke.load:
        return None
    chunk = flags_of(change.new).get("chunked-prefill-size")
    return load_check(p, run, probe, smoke, (chunk if isinstance(chunk, int) else None, int(context)))


def load_check(
    p: Ports, run: Run, probe: ProbePort, smoke: Smoke, sizes: tuple[int | None, int]
) -> str | None:
    """[smoke] load: chunk-sized prompts and one at the target context at once; a failure rolls back.
    sizes: the unit's --chunked-prefill-size (SGLang's 8192 stands in when the unit leaves it out), and
    the context."""
    chunk, context = sizes
    spec = loadcheck.spec(smoke.load, chunk, context, smoke.timeout_s)
    p.log.emit(Stage.SMOKE, "step", f"load check: {spec.concurrent} prompts of ~{spec.chunk_tokens:,} "
               f"tokens and one of ~{spec.long_tokens:,}, at once")  # fmt: skip
    run.load_result = probe.load(smoke, spec)
    text = run.load_result.describe(spec)
    p.log.emit(Stage.SMOKE, "step" if run.load_result.passed else "warning", f"load check: {text}",
               **run.load_result.to_dict())  # fmt: skip
    return None if run.load_result.passed else f"load check failed: {text}"
