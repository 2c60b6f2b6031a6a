"""SGLang's own `Engine startup timings (s)` line: parsed typed, and fed into the restart's downtime phases."""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

from typing import Any

import pytest

from agent.host.watch.timeline import downtime
from agent.protocol.events import Event
from agent.sglang.logs import events as ev
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.summary import summarize

# Verbatim from the PyPI release on CPU (../shared/sglang/REAL-ON-CPU.md), and a GPU-shaped one with graphs.
REAL = "[2026-12-03 18:46:03] Engine startup timings (s): load_weight=0.06, kv_cache_allocation=0.42, scheduler_e2e=2.01, cuda_graph={prefill=0.00, decode=0.00, target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, tokenizer_e2e=14.92"
GPU = "[2026-12-03 18:46:03] Engine startup timings (s): load_weight=41.20, kv_cache_allocation=1.30, scheduler_e2e=60.00, cuda_graph={prefill=0.00, decode=7.50, target_verify=2.50, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, tokenizer_e2e=75.00"


def test_the_real_line_is_parsed_typed() -> None:
    (e,) = parse_line(REAL)
    assert isinstance(e, ev.EngineTimings)
    assert (e.load_weight_s, e.kv_cache_allocation_s, e.scheduler_e2e_s, e.tokenizer_e2e_s) == (
        0.06,
        0.42,
        2.01,
        14.92,
    )
    assert dict(e.cuda_graph_s) == dict.fromkeys(
        ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0
    )
    assert e.cuda_graphs_total_s == 0.0
    s = summarize([REAL])
    assert s.startup_timings == e
    assert s.to_dict()["startup_timings"] == {
        "load_weight": 0.06, "kv_cache_allocation": 0.42, "scheduler_e2e": 2.01, "cuda_graph": 0.0, "tokenizer_e2e": 14.92
    }  # fmt: skip


def test_a_forged_timings_line_in_a_request_gives_no_event() -> None:
    line = f"[2026-12-03 18:47:10] Receive: obj=GenerateReqInput(text={REAL[22:]!r}, rid='ab12')"
    assert parse_line(line) == []


def _ev(second: float, stage: str, kind: str = "step", **data: Any) -> Event:
    ts = f"2026-12-03T10:{int(second) // 60:02d}:{int(second) % 60:02d}.{round(second % 1 * 1000):03d}Z"
    return Event("t", 0, ts, stage, kind, stage, data)


def _start(timings_line: str | None) -> list[Event]:
    """A restart whose journal said weights at +20 s, pool at +21 s, the scheduler line at +22 s."""
    events = [
        _ev(2, "restart", stopping_at="2026-12-03T10:00:01.000Z"),
        _ev(22, "watch", "progress", phase="loading_weights"),
        _ev(22.2, "watch", "progress", phase="kv_pool"),
        _ev(22.8, "watch", "progress", phase="cuda_graphs"),
    ]
    if timings_line is not None:
        (t,) = parse_line(timings_line)
        assert isinstance(t, ev.EngineTimings)
        events.append(_ev(23, "watch", "progress", phase="cuda_graphs", startup_timings=t.to_dict()))
    return [
        *events,
        _ev(26, "watch", "progress", phase="ready"),
        _ev(27, "ready"),
        _ev(29, "smoke", passed=True),
    ]


def test_without_the_line_the_journal_gaps_are_the_phases() -> None:
    d = downtime(_start(None))
    assert d.seconds == 28.0
    assert d.phases == {
        "stop": 1.0,
        "init": 20.0,
        "weights": 0.2,
        "pool": 0.6,
        "cuda_graphs": 3.2,
        "ready": 1.0,
        "smoke": 2.0,
    }


def test_the_real_cpu_line_names_no_graph_phase_and_gives_the_engine_seconds() -> None:
    d = downtime(_start(REAL))
    assert d.seconds == 28.0  # the wall-clock total never changes
    assert d.phases == {"stop": 1.0, "init": 20.52, "weights": 0.06, "pool": 0.42, "ready": 4.0, "smoke": 2.0}
    assert sum(d.phases.values()) == pytest.approx(d.seconds)


def test_graph_seconds_are_the_sum_over_capture_phases() -> None:
    events = _start(GPU)
    d = downtime(events)
    # 51.2 s of engine phases end at the timings line (+23 s): more than the journal saw since the
    # restart, so they are clamped at the restart and init is 0
    assert d.seconds == 28.0 and d.phases["init"] == 0.0 and d.phases["ready"] == 4.0
    assert sum(d.phases.values()) == pytest.approx(d.seconds)


def test_a_rejected_start_keeps_its_rollback_phase() -> None:
    events = [
        *_start(REAL)[:-1],
        _ev(28, "smoke", passed=False),
        _ev(28, "rollback"),
        _ev(33, "verify_old", kv_tokens=1),
    ]
    d = downtime(events)
    assert d.seconds == 32.0 and d.phases["rollback"] == 5.0


# --- the watcher passes SGLang's timings on as an event the timeline reads ----------------------------


class _Journal:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def cursor(self) -> str | None:
        return None

    def follow(
        self, unit: str, after_cursor: str | None, invocation_id: str | None, deadline_s: float
    ) -> Any:
        for line in self.lines:
            yield type("Line", (), {"message": line})()

    def last_invocation_lines(self, unit: str, max_lines: int) -> list[str]:
        return self.lines


class _Systemd:
    def unit_state(self, unit: str) -> Any:
        return type("State", (), {"active_state": "active", "sub_state": "running", "n_restarts": 0})()


def test_the_watcher_emits_the_timings_for_the_timeline() -> None:
    from agent.host.change.decide import Action, Gate
    from agent.host.events import EventLog
    from agent.host.watch.start import WatchedStart, watch_start
    from agent.protocol.requests import Timeouts

    lines = [
        "[2026-12-03 18:46:02] Load weight begin. avail mem=21.63 GB",
        "[2026-12-03 18:46:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 16384, K size: 0.00 GB, V size: 0.00 GB",
        REAL,
        "[2026-12-03 18:46:04] The server is fired up and ready to roll!",
    ]
    log = EventLog("t", None)
    seen: list[Event] = []
    log.listeners.append(seen.append)
    start = WatchedStart(
        "sglang.service", _Journal(lines), _Systemd(), Gate(None, None, 0.0, Timeouts()), None, "i", 0
    )
    result = watch_start(start, log)
    assert result.verdict.action is Action.READY
    (timed,) = [e for e in seen if "startup_timings" in e.data]
    assert timed.data["startup_timings"]["load_weight"] == 0.06
    assert result.summary["startup_timings"]["kv_cache_allocation"] == 0.42
