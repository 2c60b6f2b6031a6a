"""The record's unit jobs (agent/host/change/jobs.py): read back as written, an older agent's record still
read, a hand-edited list refused, and what `touched` makes of them."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.change.jobs import Job, JobLog, Unrecorded, touched
from agent.host.change.record import PHASE_RESTARTED, CorruptRecord, Record
from agent.host.state import StateDir

ENGINE, DAEMON = "sglang.service", "sglang-weight-cache.service"
INV = "a" * 32
jobs_st = st.lists(
    st.builds(
        Job,
        st.sampled_from([ENGINE, DAEMON]),
        st.sampled_from(["stop", "start", "restart"]),
        st.one_of(st.none(), st.just("f" * 64)),
    ),
    max_size=4,
)


def record(jobs: tuple[Job, ...] = (), done: int = 0, invocation: str = INV) -> Record:
    return Record("t", ENGINE, PHASE_RESTARTED, None, "0" * 64, invocation=invocation, jobs=jobs, done=done)


@given(jobs_st, st.integers(0, 4))
def test_a_record_reads_back_its_jobs(tmp_path_factory: pytest.TempPathFactory, jobs, done) -> None:
    state = StateDir(tmp_path_factory.mktemp("s"))
    saved = record(tuple(jobs), min(done, len(jobs)))
    state.save_record(saved)
    assert state.load_record(ENGINE) == saved


def test_an_older_agents_record_without_jobs_is_read(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    raw = asdict(record())
    del raw["jobs"], raw["done"]
    state.record_path(ENGINE).parent.mkdir(parents=True)
    state.record_path(ENGINE).write_text(json.dumps(raw))
    assert state.load_record(ENGINE) == record()


@pytest.mark.parametrize(
    "jobs",
    [[{"unit": ENGINE, "action": "kill", "sha256": None}], [{"unit": ENGINE}], "restart", [["x"]]],
)
def test_a_job_list_deployctl_never_writes_is_refused(tmp_path: Path, jobs: object) -> None:
    state = StateDir(tmp_path)
    raw = {**asdict(record()), "jobs": jobs}
    state.record_path(ENGINE).parent.mkdir(parents=True)
    state.record_path(ENGINE).write_text(json.dumps(raw))
    with pytest.raises(CorruptRecord):
        state.load_record(ENGINE)


@given(jobs_st, st.integers(0, 4), st.sampled_from(["active", "inactive", "failed", "activating"]),
       st.sampled_from([INV, "b" * 32, ""]))  # fmt: skip
def test_an_inactive_engine_or_a_begun_daemon_job_is_never_untouched(jobs, done, state, invocation) -> None:
    r = record(tuple(jobs), min(done, len(jobs)))
    daemon_begun = any(j.unit == DAEMON for j in jobs[: r.done + 1])
    if state in ("inactive", "failed") or invocation != INV or daemon_begun:
        assert touched(r, ENGINE, state, invocation)
    else:
        assert not touched(r, ENGINE, state, invocation)


@given(jobs_st, st.integers(0, 3), st.booleans())
def test_an_in_flight_job_whose_unit_is_as_seen_has_not_run(jobs, done, same) -> None:
    """The next job carries its unit's snapshot from before it: still so at recovery, it never ran."""
    jobs = jobs or [Job(DAEMON, "stop", None)]
    done = min(done, len(jobs) - 1)
    marked = (*jobs[:done], replace(jobs[done], seen="x/active"), *jobs[done + 1 :])
    r = record(marked, done)
    look = (lambda unit: "x/active") if same else (lambda unit: "y/inactive")
    ran = jobs[: done + (0 if same else 1)]
    assert touched(r, ENGINE, "active", INV, look) is any(j.unit == DAEMON for j in ran)


def test_a_recoverys_jobs_follow_the_ones_earlier_runs_began(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    first = (Job(DAEMON, "stop", None), Job(ENGINE, "restart", "f" * 64), Job(ENGINE, "start", None))
    state.save_record(record(first, 1))  # the daemon's stop done, the engine's restart maybe in flight
    log = JobLog(state, ENGINE)
    log.plan([Job(ENGINE, "stop", None), Job(DAEMON, "start", None)])
    saved = state.load_record(ENGINE)
    assert saved is not None and saved.jobs[:2] == first[:2] and saved.done == 2 and len(saved.jobs) == 4
    log.finished(1)
    saved = state.load_record(ENGINE)
    assert saved is not None and saved.done == 3
    assert touched(saved, ENGINE, "active", INV)  # the earlier run's daemon stop still counts


def test_no_job_runs_without_a_record(tmp_path: Path) -> None:
    with pytest.raises(Unrecorded):
        JobLog(StateDir(tmp_path), ENGINE).plan([Job(ENGINE, "restart", None)])
