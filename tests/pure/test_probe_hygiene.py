"""What a starting server receives from deployctl's readiness probe: one /health at a time, none given up
before SGLang's own answer (an abandoned probe keeps generating in the engine: sglang#35884), none sooner
than the last one took.

The fake server answers as SGLang 0.5.23's `health_generate` does (srt/entrypoints/http_server.py): 503 at
once while it starts; then one generated token, answered after 1 s steps, up to its own 20 s bound. Time is
a fake clock that moves by the answers' durations and deployctl's sleeps.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, field

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.host.watch.probe import Probe, ProbeError

SERVER_BOUND_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT's default


@dataclass
class Answer:
    status_code: int


@dataclass
class StartingServer:
    starting_s: float  # 503 at once until then
    generate_s: float  # then each /health takes this long (its generation and 1 s sleeps), at most 20 s
    now: float = 0.0
    probes: list[tuple[float, float]] = field(default_factory=list)  # (began, ended) as the server saw it
    orphans: int = 0  # generations the client gave up on: they keep running in the engine
    busy_until: float = 0.0  # the engine still runs an abandoned generation until then

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.now += s

    def get(self, url: str, timeout: float) -> Answer:
        assert url.endswith("/health")
        assert not self.probes or self.now >= self.probes[-1][1], "two probes overlap"
        began = self.now
        if began < self.starting_s:
            self.probes.append((began, began))
            return Answer(503)
        took = math.ceil(min(self.generate_s, SERVER_BOUND_S))  # it answers after whole 1 s sleeps
        if timeout < took:  # the client gives up first: the generation stays in the engine
            self.orphans += 1
            self.now += timeout
            self.probes.append((began, self.now))
            raise requests.Timeout("read timed out")
        self.now += took
        self.probes.append((began, self.now))
        return Answer(200 if self.generate_s <= SERVER_BOUND_S else 503)


def probe_of(server: StartingServer) -> Probe:
    probe = Probe("127.0.0.1", 30000)
    probe.session = server  # type: ignore[assignment]
    probe.clock, probe.sleep = (lambda: server.now), server.sleep
    return probe


def assert_clean(server: StartingServer) -> None:
    assert server.orphans == 0
    for (began, ended), (nxt, _) in itertools.pairwise(server.probes):
        assert nxt - began >= max(1.0, ended - began)  # never faster than its own answer, nor than 1 s


def test_a_server_whose_journal_said_ready_gets_one_probe() -> None:
    server = StartingServer(starting_s=0.0, generate_s=1.0)
    probe_of(server).wait_ready(600)
    assert len(server.probes) == 1


def test_a_busy_server_answering_slowly_is_waited_for_not_abandoned() -> None:
    server = StartingServer(starting_s=3.0, generate_s=8.0)  # slower than a 5 s client timeout
    probe_of(server).wait_ready(20)
    assert_clean(server)
    assert len(server.probes) <= 5


@settings(max_examples=200, deadline=None)
@given(
    starting_s=st.floats(0, 120),
    generate_s=st.floats(0.5, 30),
    timeout_s=st.floats(1, 300),
)
def test_no_starting_server_ever_gets_an_overlapping_or_orphaned_probe(
    starting_s: float, generate_s: float, timeout_s: float
) -> None:
    server = StartingServer(starting_s, generate_s)
    with contextlib.suppress(ProbeError):
        probe_of(server).wait_ready(timeout_s)
    assert_clean(server)
    assert server.now <= timeout_s + 25.0 + 1.0  # bounded: the last probe ends within one probe's bound


def test_a_server_that_never_gets_healthy_is_a_probe_error_within_the_bound() -> None:
    server = StartingServer(starting_s=1e9, generate_s=1.0)
    with pytest.raises(ProbeError, match="not healthy"):
        probe_of(server).wait_ready(30)
    assert_clean(server)
    assert len(server.probes) <= 31
