"""The restart's downtime and its phases, read off a transaction's events."""

from __future__ import annotations

from typing import Any

from agent.host.watch.timeline import downtime
from agent.protocol.events import Event


def ev(second: float, stage: str, kind: str = "step", **data: Any) -> Event:
    ts = f"2026-12-03T10:00:{int(second):02d}.{int(second % 1 * 1000):03d}Z"
    return Event("t", 0, ts, stage, kind, stage, data)


def start(restart_at: float) -> list[Event]:
    return [
        ev(1, "prewarm"),  # before the stop: not downtime
        ev(restart_at, "restart", stopping_at="2026-12-03T10:00:02.000Z"),
        ev(restart_at + 1, "watch", "progress", phase="loading_weights"),
        ev(restart_at + 6, "watch", "progress", phase="kv_pool"),
        ev(restart_at + 7, "watch", "progress", phase="cuda_graphs"),
        ev(restart_at + 9, "watch", "progress", phase="ready"),
        ev(restart_at + 10, "ready"),
        ev(restart_at + 10, "smoke"),
    ]


def test_from_the_stop_to_the_smoke_answer_by_phase() -> None:
    d = downtime([*start(3), ev(16, "smoke", passed=True, seconds=3.0), ev(17, "commit")])
    assert d.seconds == 14.0  # 10:00:02 (restart job sent) -> 10:00:16 (the smoke test's answer)
    assert d.phases == {
        "stop": 1.0, "init": 1.0, "weights": 5.0, "pool": 1.0, "cuda_graphs": 2.0, "ready": 1.0, "smoke": 3.0
    }  # fmt: skip


def test_a_rejected_start_runs_on_until_the_old_server_is_back() -> None:
    events = [*start(3), ev(16, "smoke", passed=False), ev(16, "rollback"), ev(17, "restore")]
    events += [ev(18, "restart"), ev(25, "verify_old", kv_tokens=204141)]
    d = downtime(events)
    assert d.seconds == 23.0 and d.phases["rollback"] == 9.0


def test_without_a_smoke_test_health_is_the_answer() -> None:
    d = downtime([*start(3)[:-1], ev(14, "commit")])
    assert d.seconds == 11.0 and "smoke" not in d.phases and d.phases["ready"] == 1.0


def test_no_answer_no_figure() -> None:
    assert downtime(start(3)[:4]).seconds is None
    assert downtime([ev(0, "lock"), ev(1, "compare"), ev(2, "done", "outcome")]).seconds is None


def test_sglang_own_drain_is_the_first_phase_of_the_downtime() -> None:
    # deployctl waited 4 s (the server served meanwhile: not downtime); the old server then answered for 5 s
    # after its SIGTERM (SGLang's own drain) before it went away
    drained = ev(1.5, "drain", end="timeout", waited_s=4.0, seconds=9.0, in_flight=1, finished=1, cut=0)
    events = start(10)
    events[1] = ev(10, "restart", stopping_at="2026-12-03T10:00:03.000Z")
    d = downtime([drained, *events, ev(23, "smoke", passed=True, seconds=3.0)])
    assert d.seconds == 20.0  # from the restart job (10:00:03) to the smoke answer (10:00:23)
    assert d.phases["drain"] == 5.0 and d.phases["stop"] == 2.0 and d.phases["init"] == 1.0


def test_after_an_idle_wait_there_is_no_drain_phase() -> None:
    drained = ev(1.5, "drain", end="idle", waited_s=0.0, seconds=0.5, in_flight=0, finished=0, cut=0)
    d = downtime([drained, *start(3), ev(16, "smoke", passed=True, seconds=3.0)])
    assert "drain" not in d.phases and d.phases["stop"] == 1.0
