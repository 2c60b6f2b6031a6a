"""Pure: what the watcher has seen so far -> keep watching, the pool passed, ready, or roll back."""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol import Timeouts

# systemd states that mean the process is gone or being restarted by systemd itself.
_DEAD_ACTIVE = {"failed", "inactive", "deactivating"}
_DEAD_SUB = {"auto-restart", "failed", "dead", "stop-sigterm", "stop-sigkill", "final-sigterm"}


@dataclass(frozen=True)
class Gate:
    """What a start must show. target None: only a healthy start (verifying the old unit)."""

    target_context: int | None
    planned_pool: int | None
    margin: float
    timeouts: Timeouts

    @property
    def required_pool(self) -> int | None:
        if self.target_context is None:
            return None
        planned = int(self.planned_pool * (1 - self.margin)) if self.planned_pool else 0
        return max(self.target_context, planned)


@dataclass(frozen=True)
class Observation:
    """Everything the decision needs; times are monotonic seconds."""

    now: float
    restarted_at: float
    last_line_at: float
    weights_done_at: float | None
    pool_at: float | None
    kv_tokens: int | None
    failure_kind: str | None
    failure_line: str | None
    ready: bool
    active_state: str
    sub_state: str
    restarts_since: int  # NRestarts grew by this much since our restart: a crash loop


@dataclass(frozen=True)
class Verdict:
    action: str  # "wait" | "pool_ok" | "ready" | "fail"
    reason: str = ""
    kind: str = ""  # for "fail": pool_short | sglang_failure | service_failed | timeout | no_progress


WAIT = Verdict("wait")


def decide(obs: Observation, gate: Gate, pool_passed: bool) -> Verdict:
    """One step of the watch loop; called for every new line and every state poll."""
    if obs.failure_kind is not None:
        return Verdict("fail", f"SGLang failed ({obs.failure_kind}): {obs.failure_line}", "sglang_failure")
    if obs.restarts_since > 0:
        return Verdict(
            "fail", f"the service crashed and systemd restarted it ({obs.restarts_since}x)", "service_failed"
        )
    if obs.active_state in _DEAD_ACTIVE or obs.sub_state in _DEAD_SUB:
        return Verdict("fail", f"the service stopped: {obs.active_state}/{obs.sub_state}", "service_failed")
    if obs.kv_tokens is not None and not pool_passed:
        need = gate.required_pool
        if need is not None and obs.kv_tokens < need:
            return Verdict("fail", _short(obs.kv_tokens, gate), "pool_short")
        return Verdict("pool_ok", f"KV pool {obs.kv_tokens:,} tokens" + (f" >= {need:,}" if need else ""))
    if obs.ready:
        if obs.kv_tokens is None:
            return Verdict("fail", "the server is ready but logged no KV pool size", "sglang_failure")
        return Verdict("ready", "the server is fired up and ready")
    return _timeouts(obs, gate.timeouts)


def _short(pool: int, gate: Gate) -> str:
    assert gate.target_context is not None
    text = f"KV pool {pool:,} tokens < target {gate.target_context:,}"
    if gate.planned_pool and pool >= gate.target_context:
        text = f"KV pool {pool:,} tokens < planned {gate.planned_pool:,} minus the {gate.margin:.0%} margin"
    return text


def _timeouts(obs: Observation, t: Timeouts) -> Verdict:
    if obs.now - obs.last_line_at > t.no_progress_s:
        return Verdict("fail", f"nothing logged for {t.no_progress_s:.0f} s", "no_progress")
    if obs.pool_at is not None:
        if obs.now - obs.pool_at > t.ready_s:
            return Verdict("fail", f"not ready {t.ready_s:.0f} s after the KV pool was sized", "timeout")
    elif obs.weights_done_at is not None:
        if obs.now - obs.weights_done_at > t.pool_s:
            return Verdict("fail", f"no KV pool logged {t.pool_s:.0f} s after the weights loaded", "timeout")
    elif obs.now - obs.restarted_at > t.weights_s:
        return Verdict("fail", f"weights not loaded {t.weights_s:.0f} s after the restart", "timeout")
    return WAIT
