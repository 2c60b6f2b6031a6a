"""--max-running-requests left unset, as SGLang 0.5.23 resolves it for the pool it sizes.

mem_cache/kv_cache_configurator.py resolve_max_num_reqs (the per-worker estimate pool_configurator.py
_resolve_max_running_requests_per_worker approximates): an unset cap is min(clamp(pool / context x 512,
2048, 4096), pool // 2) per DP worker, and, for a hybrid linear-attention model, at most its state cache's
slots // slots per request (l. 3134-3151); the req_to_token table is sized for that many rows. A draft
model (EAGLE, DFLASH, DSPARK) resets an unset cap to 48 first (plan/model.py SPEC_DEFAULT_REQUESTS).
"""

from __future__ import annotations

from agent.plan.model import PoolModel

LOW, HIGH, PER_CONTEXT = 2048, 4096, 512


def sglang_requests(model: PoolModel, fraction: float, context: int) -> int:
    """The cap SGLang resolves for an unset --max-running-requests at this fraction: per DP worker from
    its own pool, times the workers (the planner's request counts are the unit's, split over DP)."""
    pool = model.pool(fraction)
    estimated = max(min(int(pool / max(1, context) * PER_CONTEXT), HIGH), LOW)
    per_worker = min(estimated, pool // 2)
    state = model.state_cap(fraction)  # a hybrid model's state cache bounds it too
    if state is not None:
        per_worker = min(per_worker, state)
    return max(1, per_worker) * max(1, model.dp)
