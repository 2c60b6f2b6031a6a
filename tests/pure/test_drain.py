"""The drain before a restart: reading SGLang's load, the bounded wait, what was cut; the unit it renders."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.host.metrics import prom_text, run_from
from agent.host.watch import drain
from agent.host.watch.drain import End, Load, NoLoad
from agent.inventory import HostConfig, load_host
from agent.protocol.events import Outcome
from agent.protocol.requests import Request
from agent.render import render_unit, template_dir
from agent.report import ApplyReport, render_report
from agent.sglang.unitfile import unit_lines
from tests.pure.test_render import ROOT

# What SGLang 0.5.23 answers to GET /v1/loads?include=core (v1_loads.py; load_snapshot.py _CORE_KEYS).
LOADS = {
    "timestamp": "2026-12-03T18:47:00+00:00",
    "version": "0.5.23",
    "accelerator": "NVIDIA H200",
    "num_accelerators": 8,
    "loads": [
        {"timestamp": 1.0, "dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "num_used_tokens": 9},
        {"timestamp": 1.0, "dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 0, "num_used_tokens": 4},
    ],
}


def test_loads_sum_running_and_waiting_over_dp_ranks() -> None:
    assert drain.parse_loads(LOADS) == Load(5, 1)
    assert drain.parse_loads(LOADS).total == 6  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"loads": []},
        {"loads": [{"num_running_reqs": 1}]},
        {"loads": [{"num_running_reqs": True, "num_waiting_reqs": 0}]},
        {"loads": [{"num_running_reqs": -1, "num_waiting_reqs": 0}]},
        {"loads": ["x"]},
    ],
)
def test_a_body_sglang_would_not_send_is_no_load(body: object) -> None:
    assert drain.parse_loads(body) is None


def test_metrics_give_the_same_two_gauges() -> None:
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="k",dp_rank="0"} 2.0\n'
        'sglang:num_running_reqs{model_name="k",dp_rank="1"} 1.0\n'
        'sglang:num_queue_reqs{model_name="k"} 4.0\n'
        'sglang:num_running_reqs_offline_batch{model_name="k"} 7.0\n'
    )
    assert drain.parse_metrics(text) == Load(3, 4)
    assert drain.parse_metrics('sglang:num_running_reqs{model_name="k"} 2.0\n') is None


class FakeServer:
    """A server whose in-flight count follows a script, one entry per read; None: it stopped answering."""

    def __init__(self, script: list[int | str | None], clock: FakeClock) -> None:
        self.script: Iterator[int | str | None] = iter(script)
        self.last: int | str | None = None
        self.reads = 0
        self.clock = clock

    def read(self) -> Load | None:
        self.reads += 1
        self.last = next(self.script, self.last)
        if self.last == "no-load":
            raise NoLoad("404")
        return None if self.last is None else Load(int(self.last), 0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def waited(script: list[int | str | None], timeout_s: float = 10.0) -> drain.Waited:
    clock = FakeClock()
    server = FakeServer(script, clock)
    return drain.wait_idle(server.read, timeout_s, clock, clock.sleep, poll_s=1.0)


def test_an_idle_server_is_restarted_at_once() -> None:
    assert waited([0]) == drain.Waited(End.IDLE, 0, 0, 0.0)


def test_the_wait_ends_when_nothing_is_running_or_waiting() -> None:
    assert waited([3, 2, 2, 1, 0]) == drain.Waited(End.IDLE, 3, 0, 4.0)


def test_the_wait_is_bounded_by_the_timeout() -> None:
    assert waited([2, 2, 2, 2, 2, 1], timeout_s=3.5) == drain.Waited(End.TIMEOUT, 2, 2, 3.5)


def test_a_server_that_does_not_answer_is_not_waited_for() -> None:
    assert waited([None]) == drain.Waited(End.NO_ANSWER, 0, 0, 0.0)  # a failed new server: rollback
    assert waited(["no-load"]) == drain.Waited(End.NO_LOAD, 0, 0, 0.0)


def test_a_server_that_dies_during_the_wait_lost_what_it_had() -> None:
    w = waited([2, 1, None])
    assert w == drain.Waited(End.NO_ANSWER, 2, 1, 2.0)
    d = drain.result(w, None, 10.0)
    assert (d.in_flight, d.finished, d.cut) == (2, 1, 1)


def test_the_stop_watch_reports_the_last_count_before_the_old_server_went_away() -> None:
    clock = FakeClock()
    server = FakeServer([1, 1, 1, 0, None], clock)
    assert drain.watch_stop(server.read, lambda: False, clock, clock.sleep, poll_s=0.5) == (0, 1.5)
    cut = FakeServer([2, 2, None], clock)  # a control-group stop: killed with two in flight
    assert drain.watch_stop(cut.read, lambda: False, clock, clock.sleep, poll_s=0.5) == (2, 0.5)


def test_requests_sglang_finished_in_its_own_drain_are_not_cut() -> None:
    timed_out = drain.Waited(End.TIMEOUT, 1, 1, 5.0)
    finished = drain.result(timed_out, drain.StopWatch(0, 12.0), 5.0)
    assert (finished.in_flight, finished.finished, finished.cut, finished.seconds) == (1, 1, 0, 17.0)
    cut = drain.result(timed_out, drain.StopWatch(1, 3.0), 5.0)
    assert (cut.finished, cut.cut) == (0, 1)
    assert "1 in flight, 0 finished, 1 cut, 8.0 s" in cut.describe()
    assert "timed out after 5 s" in cut.describe()


def test_arrivals_during_the_drain_count_when_they_are_cut() -> None:
    d = drain.result(drain.Waited(End.IDLE, 1, 0, 2.0), drain.StopWatch(3, 1.0), 900.0)
    assert (d.in_flight, d.finished, d.cut) == (3, 0, 3)


def ct200(**drain_settings: float) -> HostConfig:
    host = load_host("ct200", ROOT / "units")
    return host.model_copy(update={"drain": host.drain.model_copy(update=drain_settings)})


def service(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for section, key, value in unit_lines(text):
        if section == "Service":
            out.setdefault(key, []).append(value)
    return out


def test_the_unit_stops_the_main_process_only_and_gives_sglang_the_drain_time() -> None:
    assert load_host("ct200", ROOT / "units").drain.timeout_s == 900.0
    lines = service(render_unit(ct200(), {}, template_dir()))
    assert (lines["KillMode"], lines["TimeoutStopSec"]) == (["mixed"], ["1020"])
    lines = service(render_unit(ct200(timeout_s=60.5, stop_allowance_s=30), {}, template_dir()))
    assert lines["TimeoutStopSec"] == ["91"]


def test_the_caches_live_in_a_persistent_folder_of_the_service_user() -> None:
    lines = service(render_unit(ct200(), {}, template_dir()))
    assert lines["CacheDirectory"] == ["sglang"]
    assert '"SGLANG_CACHE_DIR=/var/cache/sglang"' in lines["Environment"]
    assert '"SGLANG_JIT_CACHE_DIR=/var/cache/sglang/jit"' in lines["Environment"]


def test_an_inventory_that_points_the_cache_elsewhere_is_kept() -> None:
    host = ct200()
    env = {**host.unit.environment, "SGLANG_CACHE_DIR": "/data/sglang-cache"}
    host = host.model_copy(update={"unit": host.unit.model_copy(update={"environment": env})})
    lines = service(render_unit(host, {}, template_dir()))
    assert "CacheDirectory" not in lines
    assert '"SGLANG_CACHE_DIR=/data/sglang-cache"' in lines["Environment"]
    assert not any("SGLANG_JIT_CACHE_DIR" in e for e in lines["Environment"])


@pytest.mark.parametrize("bad", ["../etc", "/var/cache/x", "a/../b", "a b", ".hidden"])
def test_a_cache_folder_outside_var_cache_is_refused(bad: str) -> None:
    from agent.errors import RenderError

    host = ct200()
    host = host.model_copy(update={"unit": host.unit.model_copy(update={"cache_directory": bad})})
    with pytest.raises(RenderError, match=r"unit\.cache_directory"):
        render_unit(host, {}, template_dir())


DRAIN = {"end": "timeout", "in_flight": 1, "finished": 0, "cut": 1, "seconds": 8.0, "waited_s": 5.0,
         "timeout_s": 5.0}  # fmt: skip


def test_the_report_says_what_the_drain_did() -> None:
    report = ApplyReport("ct200", "sglang.service", 200000, None, {}, {}, "applied", "ok", {"drain": DRAIN})
    text = render_report(report)
    assert "drain:                 1 in flight, 0 finished, 1 cut, 8.0 s" in text
    assert "the wait timed out after 5 s" in text


def test_the_metrics_carry_the_drain() -> None:
    run = run_from(Request("apply", host_name="ct200"), Outcome.APPLIED, 1.0, {"drain": DRAIN}, [])
    text = prom_text(run, 0, None)
    assert 'deployctl_drain_requests{host="ct200",unit="sglang.service",state="cut"} 1' in text
    assert 'deployctl_drain_requests{host="ct200",unit="sglang.service",state="in_flight"} 1' in text
    assert 'deployctl_drain_seconds{host="ct200",unit="sglang.service"} 8' in text


OLD_SERVER = [
    "[2026-12-04 01:12:21] SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
    "[2026-12-04 01:12:21] Gracefully exiting... Remaining number of requests 1. "
    "Remaining requests remaining_rids=['9f2c'].",
    '[2026-12-04 01:12:41] INFO:     127.0.0.1:51234 - "POST /generate HTTP/1.1" 200 OK',
    "[2026-12-04 01:12:46] Gracefully exiting... Remaining number of requests 0. "
    "Remaining requests remaining_rids=[].",
]


def test_sglang_s_own_last_drain_line_is_read_from_the_old_server_s_log() -> None:
    assert drain.logged_left(OLD_SERVER) == 0
    assert drain.logged_left(OLD_SERVER[:3]) == 1  # killed before its drain was done
    assert drain.logged_left(OLD_SERVER[:1]) is None
    # a user's prompt in the request log is not SGLang's drain line
    prompt = "[2026-12-04 01:12:40] Receive: obj=Gracefully exiting... Remaining number of requests 0."
    assert drain.logged_left([prompt]) is None


def test_a_request_that_finished_between_the_last_poll_and_the_exit_is_not_cut() -> None:
    # CI, on a loaded machine: the watch last saw the request, SGLang's drain finished it and exited before
    # the next poll; the report said "1 cut" for a request that got its 200.
    timed_out = drain.Waited(End.TIMEOUT, 1, 1, 2.0)
    d = drain.result(timed_out, drain.StopWatch(1, 24.6), 2.0, logged=drain.logged_left(OLD_SERVER))
    assert (d.in_flight, d.finished, d.cut) == (1, 1, 0)
    # killed mid-drain: its own last line says one was left, and so does the watch
    killed = drain.result(timed_out, drain.StopWatch(1, 3.0), 2.0, logged=drain.logged_left(OLD_SERVER[:3]))
    assert (killed.finished, killed.cut) == (0, 1)
    # the watch never got an answer in: the log's count stands over the wait's
    unseen = drain.result(drain.Waited(End.TIMEOUT, 3, 3, 2.0), None, 2.0, logged=1)
    assert (unseen.finished, unseen.cut) == (2, 1)


def test_the_stop_watch_keeps_what_it_saw_while_its_last_poll_still_hangs() -> None:
    clock = FakeClock()
    watch = drain.StopWatch()
    reads = iter([1, 1])

    def read() -> drain.Load | None:
        n = next(reads, None)
        if n is None:
            # the joiner reads the watch now, while this poll has not returned
            assert (watch.last, watch.answered_s) == (1, 0.5)
            return None
        return drain.Load(n, 0)

    assert watch.run(read, lambda: False, clock, clock.sleep, poll_s=0.5) == (1, 0.5)


def test_a_request_that_arrived_after_the_first_look_and_finished_in_sglangs_drain_is_counted() -> None:
    """deployctl's first look saw nothing; a request came before the stop and SGLang's drain finished it:
    the report said "0 in flight" for a request the restart did carry through."""
    idle = drain.Waited(End.IDLE, 0, 0, 0.0)
    clock = FakeClock()
    watch = drain.StopWatch()
    watch.run(FakeServer([0, 1, 1, None], clock).read, lambda: False, clock, clock.sleep, poll_s=0.5)
    d = drain.result(idle, watch, 2.0, logged=0)
    assert (d.in_flight, d.finished, d.cut) == (1, 1, 0)
