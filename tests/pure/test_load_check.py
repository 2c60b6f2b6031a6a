"""The load check before a commit ([smoke] load = N): what it sends, what fails it, the figures it reports."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.host.watch import loadcheck
from agent.host.watch.loadcheck import Reply, verdict
from agent.protocol.common import ProtocolError
from agent.protocol.events import Outcome
from agent.protocol.requests import Smoke
from agent.report import ApplyReport, render_report
from tests.pure.txnfakes import Host, Script, unit_text

OLD, NEW = 100_000, 200_000


def test_prompts_are_the_chunked_prefill_size_and_the_target_context() -> None:
    spec = loadcheck.spec(4, 8192, 200_000, 900.0)
    assert (spec.concurrent, spec.chunk_tokens, spec.long_tokens) == (4, 7372, 180_000)
    assert loadcheck.spec(2, None, 4096, 60.0).chunk_tokens == 3686  # SGLang's 8192, capped at the context


def test_the_long_prompt_s_stream_gives_prefill_rate_and_decode_time() -> None:
    chunk = Reply(200, None, 7372, 32, 0.4, 1.0)
    long = Reply(200, None, 180_000, 32, 12.0, 15.1)  # first token after 12 s, then 31 steps in 3.1 s
    r = verdict([chunk] * 4, long, 15.2)
    assert r.passed and (r.requests, r.failed) == (5, 0)
    assert r.prefill_tokens_per_s == 15_000.0 and r.decode_ms_per_token == 100.0


@pytest.mark.parametrize(
    ("bad", "detail"),
    [
        (Reply(500, "CUDA out of memory. Tried to allocate 2.00 GiB"), "HTTP 500: CUDA out of memory"),
        (Reply(None, "ConnectionError: ('Connection aborted.', RemoteDisconnected())"), "ConnectionError"),
        (Reply(200, "error in the stream: {'message': 'out of memory'}"), "error in the stream"),
        (Reply(200, None, 7372, 0, None, 1.0), "a reply with no token"),
    ],
)
def test_any_error_or_cut_reply_fails_the_check(bad: Reply, detail: str) -> None:
    ok = Reply(200, None, 7372, 32, 0.4, 1.0)
    r = verdict([ok, bad, ok], ok, 3.0)
    assert not r.passed and r.failed == 1 and r.detail is not None and r.detail.startswith(detail)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))
    h.install(h.etc, unit_text(OLD))
    return h


def _apply(host: Host, load: int) -> tuple[Outcome, dict[str, object]]:
    smoke = Smoke(prompt_tokens=1000, load=load)
    result = host.transaction(host.request(NEW, smoke=smoke)).apply()
    return result.outcome, result.data


def test_a_load_check_that_passes_commits_and_its_figures_reach_the_report(host: Host) -> None:
    outcome, data = _apply(host, 3)
    assert outcome is Outcome.APPLIED
    assert host.probe.asked[-2:] == ["smoke", "load"] and host.probe.load_spec is not None
    assert host.probe.load_spec.concurrent == 3
    report = render_report(ApplyReport("ct200", "sglang.service", NEW, None, {}, {}, "applied", "ok", data))
    assert "load check:            4 requests at once, all answered in 5.2 s; prefill" in report
    assert "ms/token at" in report


def test_a_load_check_that_fails_rolls_back(host: Host) -> None:
    host.probe.load_fails = "CUDA out of memory. Tried to allocate 20.00 GiB"
    outcome, data = _apply(host, 2)
    assert outcome is Outcome.ROLLED_BACK
    assert host.systemd.loaded == unit_text(OLD)
    assert "load check failed" in str(data.get("reason", "")) + str(data)


def test_without_load_no_load_check(host: Host) -> None:
    assert _apply(host, 0)[0] is Outcome.APPLIED and "load" not in host.probe.asked


def test_a_load_out_of_range_is_refused_on_the_wire(host: Host) -> None:
    with pytest.raises(ProtocolError):
        replace(host.request(NEW), smoke=Smoke(load=10_000)).validate()
