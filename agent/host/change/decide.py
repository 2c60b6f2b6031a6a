"""Pure: what the watcher has seen so far -> keep watching, the pool passed, ready, or roll back."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

from agent.protocol.requests import Timeouts

# A calibrated prediction lands within CELL_AGREEMENT (1.5 %) of the logged pool (agent/plan/model.py): the
# interval the gate knows is planned x (1 +- margin). A logged pool off the plan by more than this share is
# far outside it: no fraction step explains it, only memory SGLang took or left unused against its own
# sizing (PR#36583: 1,741 tokens logged where 349,377 were due; PR#34053: weights held by the weight-cache
# daemon sized into the pool twice).
ANOMALY_SHARE = 0.25
ANOMALY_WORDS = "the pool SGLang logged is not what these flags give on this host: an SGLang anomaly"

# systemd states that mean the process is gone or being restarted by systemd itself.
_DEAD_ACTIVE = {"failed", "inactive", "deactivating"}
_DEAD_SUB = {"auto-restart", "failed", "dead", "stop-sigterm", "stop-sigkill", "final-sigterm"}


# systemd's own exit codes (systemd.exec(5), "Process Exit Codes"): the process never ran SGLang, it failed
# while systemd set it up, so no log line of SGLang's can say why.
_SETUP_EXITS = {
    200: "CHDIR", 203: "EXEC", 204: "MEMORY", 205: "LIMITS", 209: "STDOUT", 216: "GROUP", 217: "USER",
    219: "CGROUP", 226: "NAMESPACE", 233: "RUNTIME_DIRECTORY", 238: "STATE_DIRECTORY",
    239: "CACHE_DIRECTORY", 243: "CREDENTIALS",
}  # fmt: skip
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3  # ExecMainCode: waitid(2)'s si_code


def exit_words(code: int, status: int) -> str:
    """How a service's main process ended, from systemd's ExecMainCode and ExecMainStatus ("" if unknown)."""
    if code == _CLD_EXITED:
        if 200 <= status <= 245:
            name = _SETUP_EXITS.get(status, "SETUP")
            return f"exit status {status}/{name}: systemd failed to set the process up, SGLang never ran"
        return f"exit status {status}"
    if code in (_CLD_KILLED, _CLD_DUMPED):
        try:
            name = signal.Signals(status).name
        except ValueError:
            name = f"signal {status}"
        return f"killed by {name}" + (", core dumped" if code == _CLD_DUMPED else "")
    return ""


@dataclass(frozen=True)
class Gate:
    """What a start must show. target None: only a healthy start (verifying the old unit)."""

    target_context: int | None
    planned_pool: int | None
    margin: float
    timeouts: Timeouts
    # A multi-node service's node rank >= 1: it serves no HTTP and never logs "fired up" (SGLang
    # entrypoints/engine.py, node_rank >= 1): its own pool line on a running unit is its readiness.
    follower: bool = False
    # planned_pool comes from a plan calibrated on this host's own earlier starts: a pool far from it is
    # an anomaly of SGLang's, not a fraction to correct.
    calibrated: bool = False
    # HiCache: the host pool per rank the plan sized from an explicit --hicache-size (plan/hostplan.py):
    # SGLang's own line must say the very same tokens, or the unit is not what was planned.
    planned_host_pool: int | None = None

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
    exit: str = ""  # how its main process last ended, as exit_words() says it ("" while it runs)
    host_pool_tokens: int | None = None  # the smallest rank's HiCache host pool, once logged


class Action(str, Enum):
    """What the watcher does next."""

    WAIT = "wait"
    POOL_OK = "pool_ok"  # the pool passed the gate; wait for ready
    READY = "ready"
    FAIL = "fail"


class Failure(str, Enum):
    """Why a start failed: the words the outcome carries on the wire."""

    POOL_SHORT = "pool_short"
    SGLANG_FAILURE = "sglang_failure"
    SERVICE_FAILED = "service_failed"
    TIMEOUT = "timeout"
    NO_PROGRESS = "no_progress"
    POOL_ANOMALY = "pool_anomaly"
    HOST_POOL_MISMATCH = "host_pool_mismatch"
    ABANDONED = "abandoned"  # a multi-node start the group rolled back meanwhile: no failure of its own


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str = ""
    kind: Failure | None = None  # set when action is FAIL


def fail(reason: str, kind: Failure) -> Verdict:
    return Verdict(Action.FAIL, reason, kind)


WAIT = Verdict(Action.WAIT)


def decide(obs: Observation, gate: Gate, pool_passed: bool) -> Verdict:
    """One step of the watch loop; called for every new line and every state poll."""
    early = _failed(obs, gate)
    if early is not None:
        return early
    if obs.kv_tokens is not None and not pool_passed:
        odd = pool_anomaly(obs.kv_tokens, gate)
        if odd is not None:
            return fail(odd, Failure.POOL_ANOMALY)
        need = gate.required_pool
        if need is not None and obs.kv_tokens < need:
            return fail(_short(obs.kv_tokens, gate), Failure.POOL_SHORT)
        return Verdict(
            Action.POOL_OK, f"KV pool {obs.kv_tokens:,} tokens" + (f" >= {need:,}" if need else "")
        )
    if pool_passed and gate.follower:
        return Verdict(Action.READY, "its KV pool is logged and it runs (node ranks >= 1 serve no HTTP)")
    if obs.ready:
        if obs.kv_tokens is None:
            return fail("the server is ready but logged no KV pool size", Failure.SGLANG_FAILURE)
        return Verdict(Action.READY, "the server is fired up and ready")
    return _timeouts(obs, gate.timeouts)


def _failed(obs: Observation, gate: Gate) -> Verdict | None:
    """A failure whatever the pool: SGLang's own, systemd's, or a host pool that is not the planned one."""
    if obs.failure_kind is not None:
        return fail(f"SGLang failed ({obs.failure_kind}): {obs.failure_line}", Failure.SGLANG_FAILURE)
    if obs.restarts_since > 0:
        return fail(
            f"the service crashed and systemd restarted it ({obs.restarts_since}x)", Failure.SERVICE_FAILED
        )
    if obs.active_state in _DEAD_ACTIVE or obs.sub_state in _DEAD_SUB:
        how = f" ({obs.exit})" if obs.exit else ""
        return fail(f"the service stopped: {obs.active_state}/{obs.sub_state}{how}", Failure.SERVICE_FAILED)
    host = host_pool_mismatch(obs.host_pool_tokens, gate)
    if host is not None:
        return fail(host, Failure.HOST_POOL_MISMATCH)
    return None


def host_pool_mismatch(tokens: int | None, gate: Gate) -> str | None:
    """A host pool SGLang logged that is not the planned one (an explicit size gives it to the token)."""
    planned = gate.planned_host_pool
    if tokens is None or not planned or tokens == planned:
        return None
    return (
        f"HiCache host pool {tokens:,} tokens per rank logged, {planned:,} planned: "
        "the unit's --hicache-size is not what the plan sized"
    )


def pool_anomaly(pool: int, gate: Gate) -> str | None:
    """The anomaly verdict with its evidence, when a calibrated plan's pool is far from the logged one."""
    planned = gate.planned_pool
    if not gate.calibrated or not planned or abs(pool - planned) <= ANOMALY_SHARE * planned:
        return None
    low, high = int(planned * (1 - gate.margin)), int(planned * (1 + gate.margin))
    return (
        f"{ANOMALY_WORDS}: KV pool {pool:,} tokens logged, {pool / planned:.1%} of the {planned:,} "
        f"calibrated on this host's own starts (interval {low:,}-{high:,})"
    )


def _short(pool: int, gate: Gate) -> str:
    assert gate.target_context is not None
    text = f"KV pool {pool:,} tokens < target {gate.target_context:,}"
    if gate.planned_pool and pool >= gate.target_context:
        text = f"KV pool {pool:,} tokens < planned {gate.planned_pool:,} minus the {gate.margin:.0%} margin"
    return text


def _timeouts(obs: Observation, t: Timeouts) -> Verdict:
    if obs.now - obs.last_line_at > t.no_progress_s:
        return fail(f"nothing logged for {t.no_progress_s:.0f} s", Failure.NO_PROGRESS)
    if obs.pool_at is not None:
        if obs.now - obs.pool_at > t.ready_s:
            return fail(f"not ready {t.ready_s:.0f} s after the KV pool was sized", Failure.TIMEOUT)
    elif obs.weights_done_at is not None:
        if obs.now - obs.weights_done_at > t.pool_s:
            return fail(f"no KV pool logged {t.pool_s:.0f} s after the weights loaded", Failure.TIMEOUT)
    elif obs.now - obs.restarted_at > t.weights_s:
        return fail(f"weights not loaded {t.weights_s:.0f} s after the restart", Failure.TIMEOUT)
    return WAIT
