"""The metrics textfile: phase times from events, Prometheus' text format, counters kept between runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.host.metrics import Run, prom_text, record_run, run_from, timings
from agent.protocol.events import Event, Outcome
from agent.protocol.requests import Request


def event(stage: str, second: int) -> Event:
    return Event("t", second, f"2026-12-03T10:00:{second:02d}.000Z", stage, "step", stage, {})


def test_phase_times_and_downtime_from_the_events() -> None:
    events = [
        event(s, t) for s, t in [("lock", 0), ("backup", 1), ("write", 2), ("reload", 3), ("restart", 5)]
    ]
    events += [event("watch", 6), event("ready", 16), event("smoke", 17), event("commit", 20)]
    downtime, phases = timings(events)
    assert downtime == 11.0  # restart (the old server stops) -> ready
    assert phases == {
        "backup": 1.0, "write": 1.0, "reload": 2.0, "restart": 1.0, "watch": 10.0, "ready": 1.0, "smoke": 3.0
    }  # fmt: skip


def test_a_run_that_changed_nothing_has_no_phases() -> None:
    assert timings([event("lock", 0), event("compare", 1), event("done", 2)]) == (None, {})


def test_the_text_format_groups_each_metric_once_with_its_help() -> None:
    run = Run('ct"200', "sglang.service", Outcome.APPLIED, 1796293015.25, 200000, 204146, 204141, "ab" * 32)
    text = prom_text(run, 3, 1796293015.25)
    helps = [line for line in text.splitlines() if line.startswith("# HELP deployctl_last_run_outcome ")]
    assert len(helps) == 1
    assert 'deployctl_last_run_outcome{host="ct\\"200",unit="sglang.service",outcome="applied"} 1' in text
    assert "deployctl_last_success_timestamp_seconds" in text and "1796293015.25" in text
    assert 'deployctl_rollbacks_total{host="ct\\"200",unit="sglang.service"} 3' in text
    assert "deployctl_restart_downtime_seconds" not in text  # unknown: left out, not 0


def test_counters_survive_between_runs_and_a_failure_keeps_the_last_success(tmp_path: Path) -> None:
    state, prom = tmp_path / "state" / "metrics.json", tmp_path / "prom" / "deployctl_x.prom"
    record_run(state, prom, Run("h", "u", Outcome.APPLIED, 100.0, pool_tokens=5))
    record_run(state, prom, Run("h", "u", Outcome.ROLLED_BACK, 200.0))
    record_run(state, prom, Run("h", "u", Outcome.ROLLED_BACK, 300.0))
    text = prom.read_text()
    assert 'deployctl_rollbacks_total{host="h",unit="u"} 2' in text
    assert 'deployctl_last_success_timestamp_seconds{host="h",unit="u"} 100' in text
    assert 'deployctl_kv_pool_tokens{host="h",unit="u"} 5' in text
    assert oct(prom.stat().st_mode & 0o777) == "0o644" and oct(state.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in prom.parent.iterdir()] == ["deployctl_x.prom"]  # no temp file left


def test_a_link_planted_at_the_temp_name_is_never_followed(tmp_path: Path) -> None:
    """The textfile folder's other writers (Debian's `prometheus`) could plant links: root never follows."""
    folder, victim = tmp_path / "textfiles", tmp_path / "shadow"
    folder.mkdir()
    victim.write_text("root:secret\n")
    victim.chmod(0o600)
    for name in (f".deployctl_x.prom.tmp.{os.getpid()}", "deployctl_x.prom"):
        (folder / name).symlink_to(victim)
    record_run(
        tmp_path / "state" / "metrics.json", folder / "deployctl_x.prom", Run("h", "u", Outcome.APPLIED, 1.0)
    )
    assert victim.read_text() == "root:secret\n" and oct(victim.stat().st_mode & 0o777) == "0o600"
    prom = folder / "deployctl_x.prom"
    assert not prom.is_symlink() and "deployctl_last_run_outcome" in prom.read_text()


def test_a_textfile_folder_another_user_owns_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "textfiles"
    folder.mkdir()
    os.chown(folder, 65534, 65534)  # nobody: it could swap what is in there between root's steps
    with pytest.raises(OSError, match="not owned by root"):
        record_run(
            tmp_path / "state" / "metrics.json",
            folder / "deployctl_x.prom",
            Run("h", "u", Outcome.APPLIED, 1.0),
        )
    assert list(folder.iterdir()) == []


def test_a_textfile_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "textfiles").symlink_to(real)
    with pytest.raises(OSError):
        record_run(
            tmp_path / "state" / "metrics.json",
            tmp_path / "textfiles" / "x.prom",
            Run("h", "u", Outcome.APPLIED, 1.0),
        )
    assert list(real.iterdir()) == []


def test_the_textfile_carries_each_phase_of_the_restart_s_downtime() -> None:
    def at(second: float, stage: str, kind: str = "step", **data: object) -> Event:
        return Event("t", 0, f"2026-12-03T10:00:{second:02.0f}.000Z", stage, kind, stage, dict(data))

    events = [
        at(1, "drain", end="timeout", waited_s=1.0, seconds=4.0, in_flight=1, finished=1, cut=0),
        at(5, "restart", stopping_at="2026-12-03T10:00:02.000Z"),
        at(6, "watch", "progress", phase="loading_weights"),
        at(16, "watch", "progress", phase="kv_pool"),
        at(17, "watch", "progress", phase="ready"),
        at(18, "ready"),
        at(18, "smoke"),
        at(20, "smoke", passed=True),
    ]
    req = Request("apply", host_name="ct200", unit="sglang.service")
    run = run_from(req, Outcome.APPLIED, 100.0, {"drain": events[0].data}, events)
    assert run.downtime_phases == {
        "drain": 3.0, "stop": 0.0, "init": 1.0, "weights": 10.0, "pool": 1.0, "ready": 1.0, "smoke": 2.0
    }  # fmt: skip
    text = prom_text(run, 0, None)
    assert 'deployctl_downtime_phase_seconds{host="ct200",unit="sglang.service",phase="weights"} 10' in text
    assert 'deployctl_downtime_phase_seconds{host="ct200",unit="sglang.service",phase="drain"} 3' in text
    assert text.count("# HELP deployctl_downtime_phase_seconds ") == 1
