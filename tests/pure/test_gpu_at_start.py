"""What each GPU process held at the service's start (issue 30 item 8): the transaction records nvidia-smi's
processes once the start it watches logs its pool, keyed by the unit's InvocationID, and the facts fill
each process's at_start_mib from that record while the unit still runs that invocation."""

from __future__ import annotations

import copy
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host import model_facts
from agent.host.watch import gpu_at_start
from agent.host.watch.gpu_at_start import AtStart, fill, parse_snapshot, snapshot_doc
from agent.plan.facts import parse_facts
from agent.plan.predict import pool_model
from agent.protocol.answers import GpuCard, GpuProcess
from agent.protocol.events import Outcome
from agent.sglang.kvpool import GIB
from tests.pure.test_facts_plan import ct200
from tests.pure.txnfakes import UNIT, Host, Script, unit_text

INV = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


def proc(pid: int, name: str, mib: float, service: bool = False) -> GpuProcess:
    unit = "sglang.service" if service else "notebook.service"
    return {"pid": pid, "name": name, "used_mib": mib, "unit": unit, "service": service}


NOTEBOOK = proc(4242, "python", 4096.0)
OWN = proc(77, "sglang::scheduler_TP0", 70_000.0, service=True)


def cards(*per_card: list[GpuProcess]) -> list[GpuCard]:
    return [
        {"name": "H100", "memory_total_mib": 81559.0, "memory_free_mib": 1000.0, "index": i,
         "processes": copy.deepcopy(procs)}
        for i, procs in enumerate(per_card)
    ]  # fmt: skip


def at_start(doc: dict[str, object], invocation: str) -> AtStart | None:
    return parse_snapshot(json.loads(json.dumps(doc)), invocation)  # as written to disk and read back


def figures(filled: list[GpuCard]) -> list[list[float | None]]:
    return [[p.get("at_start_mib") for p in c.get("processes", [])] for c in filled]


# -- the record and the match (pure) --------------------------------------------------------------
def test_each_process_gets_what_it_held_at_the_start_and_a_newcomer_gets_zero() -> None:
    then = snapshot_doc(INV, {0: [OWN, NOTEBOOK]})
    now = cards([OWN, {**NOTEBOOK, "used_mib": 6144.0}, proc(5000, "python", 2048.0)])
    fill(now, at_start(then, INV))
    # the service's own pid gets its figure too (harmless: the plan never subtracts the service)
    assert figures(now) == [[70_000.0, 4096.0, 0.0]]


def test_a_record_of_another_invocation_is_ignored_and_at_start_stays_absent() -> None:
    then = snapshot_doc(OTHER, {0: [NOTEBOOK]})
    assert at_start(then, INV) is None
    now = cards([NOTEBOOK])
    fill(now, at_start(then, INV))
    assert "at_start_mib" not in now[0]["processes"][0]
    assert at_start(snapshot_doc("", {0: [NOTEBOOK]}), "") is None  # a unit that never started: no match


def test_a_pid_on_another_card_then_or_reused_by_another_process_counts_as_new() -> None:
    then = snapshot_doc(INV, {1: [NOTEBOOK]})
    now = cards([NOTEBOOK], [proc(4242, "jupyter", 100.0)])
    fill(now, at_start(then, INV))
    assert figures(now) == [[0.0], [0.0]]


def doc_of(cards: object, fmt: str = gpu_at_start.FORMAT) -> dict[str, object]:
    return {"format": fmt, "invocation": INV, "cards": cards}


@pytest.mark.parametrize(
    "doc",
    [
        None, [], "x", {}, {"format": gpu_at_start.FORMAT, "invocation": INV},
        doc_of({}, "deployctl-gpu-at-start/2"), doc_of([]), doc_of({"a": []}), doc_of({"0": {}}),
        doc_of({"0": [7]}), doc_of({"0": [{"pid": "1", "name": "p", "used_mib": 1}]}),
        doc_of({"0": [{"pid": 1, "name": 2, "used_mib": 1}]}),
        doc_of({"0": [{"pid": 1, "name": "p", "used_mib": -1}]}),
        doc_of({"0": [{"pid": 1, "name": "p", "used_mib": True}]}),
        doc_of({"0": [{"pid": 1, "name": "p", "used_mib": float("nan")}]}),
        doc_of({"0": [{"pid": 1, "name": "p"}]}),
    ],
)  # fmt: skip
def test_a_record_the_agent_never_writes_is_no_record(doc: object) -> None:
    assert parse_snapshot(doc, INV) is None


_procs = st.lists(
    st.builds(
        proc, st.integers(1, 50), st.sampled_from(["python", "sglang"]), st.floats(0, 80_000), st.booleans()
    ),
    max_size=6,
    unique_by=lambda p: p["pid"],
)


@given(st.lists(_procs, min_size=1, max_size=3), st.lists(_procs, min_size=1, max_size=3))
def test_at_start_is_what_the_same_process_on_the_same_card_held_else_zero(
    then: list[list[GpuProcess]], now_procs: list[list[GpuProcess]]
) -> None:
    now = cards(*now_procs)
    fill(now, at_start(snapshot_doc(INV, dict(enumerate(then))), INV))
    for index, card in enumerate(now):
        for p in card.get("processes", []):
            same = [
                q
                for q in (then[index] if index < len(then) else [])
                if (q["pid"], q["name"]) == (p["pid"], p["name"])
            ]
            assert p.get("at_start_mib") == (same[0]["used_mib"] if same else 0.0)


def test_a_calibrated_plan_takes_off_only_what_a_recorded_process_grew_by() -> None:
    python = {
        "pid": 4242,
        "name": "python",
        "used_mib": 6 * 1024.0,
        "unit": "notebook.service",
        "service": False,
    }
    doc: dict[str, Any] = ct200()
    doc["gpus"] = [{**copy.deepcopy(card), "index": i} for i, card in enumerate(doc["gpus"])]  # as the host
    doc["gpus"][3]["processes"] = [dict(python)]
    fill(doc["gpus"], at_start(snapshot_doc(INV, {3: [{**python, "used_mib": 4 * 1024.0}]}), INV))  # type: ignore[dict-item]
    clean, busy = pool_model(parse_facts(ct200()), 200_000), pool_model(parse_facts(doc), 200_000)
    cell = busy.pool.sizer.effective_cell() if busy.pool.sizer is not None else busy.pool.cell_bytes
    assert clean.pool.pool(0.92) - busy.pool.pool(0.92) == pytest.approx(2 * GIB * 0.92 / cell, abs=3)
    assert not any("not known" in n for n in busy.notes), busy.notes


# -- on disk, and in the facts --------------------------------------------------------------------
def test_the_record_is_written_for_its_invocation_and_read_back_only_for_it(tmp_path: Path) -> None:
    assert gpu_at_start.record(tmp_path, INV, None) is False  # no nvidia-smi: no record
    assert gpu_at_start.record(tmp_path, "", {0: [NOTEBOOK]}) is False
    assert not (tmp_path / gpu_at_start.FILE_NAME).exists()
    assert gpu_at_start.record(tmp_path, INV, {0: [NOTEBOOK]}) is True
    assert stat.S_IMODE((tmp_path / gpu_at_start.FILE_NAME).stat().st_mode) == 0o600
    got = gpu_at_start.load(tmp_path, INV)
    assert got is not None and got.mib(0, 4242, "python") == 4096.0
    assert gpu_at_start.load(tmp_path, OTHER) is None
    (tmp_path / gpu_at_start.FILE_NAME).write_text("{not json")
    assert gpu_at_start.load(tmp_path, INV) is None
    assert gpu_at_start.load(tmp_path / "nowhere", INV) is None


FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=uuid,index) echo "GPU-a, 0" ;;
  --query-compute-apps=*) printf 'GPU-a, 4242, python, 6144\\nGPU-a, 5000, python, 1024\\n' ;;
  *) echo "NVIDIA H100 80GB HBM3, 81559, 10000, 9.0, 0" ;;
esac
"""


def test_the_facts_fill_at_start_from_the_record_of_the_running_invocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    gpu_at_start.record(tmp_path, INV, {0: [NOTEBOOK]})
    filled = model_facts.gpus(UNIT, gpu_at_start.load(tmp_path, INV))
    assert [(p["pid"], p.get("at_start_mib")) for p in filled[0]["processes"]] == [
        (4242, 4096.0),
        (5000, 0.0),
    ]
    unknown = model_facts.gpus(UNIT, gpu_at_start.load(tmp_path, OTHER))
    assert [p.get("at_start_mib") for p in unknown[0]["processes"]] == [None, None]


# -- the transaction records it when the start logs its pool --------------------------------------
@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}))


def test_a_watched_start_records_the_gpu_processes_under_its_invocation(host: Host) -> None:
    host.install(host.etc, unit_text(100_000))
    t = host.transaction(host.request(200_000))
    asked: list[str | None] = []
    t.ports.gpu_procs = lambda unit: asked.append(unit) or {0: [OWN, NOTEBOOK]}
    assert t.apply().outcome is Outcome.APPLIED
    assert asked == [UNIT]  # once, at the pool line
    folder = t.state.unit_dir(UNIT)
    got = gpu_at_start.load(folder, host.systemd.invocation)
    assert (
        got is not None and got.mib(0, 4242, "python") == 4096.0 and got.mib(0, 77, OWN["name"]) == 70_000.0
    )


def test_no_nvidia_smi_no_record_and_a_failed_record_never_fails_the_change(host: Host) -> None:
    host.install(host.etc, unit_text(100_000))
    t = host.transaction(host.request(200_000))
    t.ports.gpu_procs = lambda unit: None
    assert t.apply().outcome is Outcome.APPLIED
    assert not (t.state.unit_dir(UNIT) / gpu_at_start.FILE_NAME).exists()

    def broken(unit: str | None) -> dict[int, list[GpuProcess]]:
        raise OSError("No space left on device")

    t = host.transaction(host.request(100_000), txn="20261203T120100Z-abcdef")
    t.ports.gpu_procs = broken
    assert t.apply().outcome is Outcome.APPLIED
    assert any(e.kind == "warning" and "No space left" in e.message for e in t.events)


def test_the_watch_never_waits_on_nvidia_smi_and_a_hung_one_is_a_warning(tmp_path: Path) -> None:
    release, warned = threading.Event(), []

    def hung() -> dict[int, list[GpuProcess]]:
        release.wait(30)
        return {0: [NOTEBOOK]}

    held = gpu_at_start.Recorder(tmp_path, INV, hung)
    held.begin()  # returns at once: the watch goes on deciding
    held.finish(warned.append, timeout_s=0.01)
    assert len(warned) == 1 and "had not answered" in warned[0]
    release.set()
    gpu_at_start.Recorder(tmp_path, INV, lambda: None).finish(warned.append)  # never begun: nothing
    assert len(warned) == 1
