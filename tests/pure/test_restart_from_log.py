"""`plan --from-log` (and `plan --facts`) state the restart's time, from the start the plan reads: that
start's own phases, by its lines' timestamps or SGLang's own startup timings (agent/plan/restart_time.py)."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.output import Output
from agent.plan.restart_time import from_log

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
LOG = (EXAMPLES / "ct200-start.log").read_text().splitlines()
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})")
# Where each part of a start begins in the example log: the line's own words, not its position (the pool:
# the last such line before the graphs).
BEGINS = {"weights": "Load weight begin.", "pool": "Load weight end.", "cuda_graphs": "CUDA graph begin."}
READY = "The server is fired up and ready to roll!"


def stamped(
    gaps_ms: list[int], at: datetime = datetime(2026, 12, 1, 9, 0, 0)
) -> tuple[list[str], dict[str, float]]:
    """The example log with its logger timestamps moved by `gaps_ms` (one per stamped line) from `at`, and
    the seconds each part took as the stamps say: init from the first line to the weights, each part until
    the next one begins, the last until the ready line."""
    out: list[str] = []
    times: list[tuple[str, datetime]] = []
    gaps = iter(gaps_ms)
    for line in LOG:
        m = STAMP.match(line)
        if m is None:
            out.append(line)
            continue
        at += timedelta(milliseconds=next(gaps, 1))
        out.append(f"[{at.strftime('%Y-%m-%d %H:%M:%S')}.{at.microsecond // 1000:03d}{line[m.end() :]}")
        times.append((line, at))
    first = times[0][1]
    begun = {part: next(t for line, t in times if words in line) for part, words in BEGINS.items()}
    # the draft model loads after the target: the pool begins at the last weights end before the graphs
    begun["pool"] = max(t for line, t in times if BEGINS["pool"] in line and t <= begun["cuda_graphs"])
    ready = next(t for line, t in times if READY in line)
    bounds = [("init", first), *begun.items(), ("", ready)]
    want = {part: (end - start).total_seconds() for (part, start), (_, end) in pairwise(bounds)}
    return out, want


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 900_000), min_size=25, max_size=25))
def test_the_estimate_is_the_logged_starts_own_phases(gaps_ms: list[int]) -> None:
    lines, want = stamped(gaps_ms)
    got = from_log(lines)
    assert got.parts.keys() == want.keys()
    for part, seconds in want.items():
        assert abs(got.parts[part] - seconds) < 1e-3, (part, got.parts, want)
    assert got.seconds is not None and abs(got.seconds - sum(want.values())) < 1e-2


def test_sglangs_own_startup_timings_win_over_the_gaps_between_lines() -> None:
    timings = (
        "[2026-12-01 10:10:47.000] Engine startup timings (s): load_weight=41.20, kv_cache_allocation=1.30, "
        "scheduler_e2e=60.00, cuda_graph={prefill=0.00, decode=7.50, target_verify=2.50}, tokenizer_e2e=75.00"
    )
    got = from_log([*LOG[:-1], timings, LOG[-1]])
    assert got.parts == {"init": 75.0 - 41.2 - 1.3 - 10.0, "weights": 41.2, "pool": 1.3, "cuda_graphs": 10.0}


def test_a_start_that_never_became_ready_gives_no_time_and_says_why() -> None:
    failed = [line for line in LOG if READY not in line] + [
        "[2026-12-01 10:10:48.000 TP0] CUDA out of memory."
    ]
    got = from_log(failed, "x.log")
    assert got.seconds is None and "never became ready" in "\n".join(got.lines())


def plan_json(*argv: str) -> dict[str, Any]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    main(["--units", str(ROOT / "units"), "plan", "--context", "200k", "--json", *argv], out)
    assert isinstance(out.stdout, io.StringIO)
    doc: dict[str, Any] = json.loads(out.stdout.getvalue())
    return doc


def test_plan_from_log_states_the_restart_time_whichever_way_the_plan_is_given() -> None:
    parts = stamped([])[1].keys()  # the parts a logged start shows
    logged = from_log(LOG)
    assert logged.seconds is not None
    for argv in (
        ("ct200-sim", "--offline"),  # an inventory
        ("--facts", str(EXAMPLES / "ct200.json")),  # a facts file
    ):
        doc = plan_json(*argv, "--from-log", str(EXAMPLES / "ct200-start.log"))
        assert doc["restart_estimate_s"] == round(logged.seconds, 1), argv
        assert doc["restart_estimate_parts"].keys() == parts


def test_a_log_of_two_starts_times_the_start_the_plan_reads(tmp_path: Path) -> None:
    """Two starts in one journal: the estimate is the evidence start's own phases (the last complete one,
    or the one --start names), never the first start's nor a mix of the two."""
    slow, slow_parts = stamped([600_000] * 25)  # ten minutes between lines
    fast, fast_parts = stamped([1_000] * 25, datetime(2026, 12, 1, 14, 0, 0))  # after the slow one ended
    log = tmp_path / "two.log"
    log.write_text("\n".join([*slow, *fast]) + "\n")
    for extra, want in (((), fast_parts), (("--start", "1"), slow_parts)):
        doc = plan_json("ct200-sim", "--offline", "--from-log", str(log), *extra)
        assert doc["restart_estimate_s"] == round(sum(want.values()), 1), extra


def test_init_is_timed_from_the_launch_not_from_older_lines_before_it() -> None:
    """A restarted compose service's log (or one cut mid-run) puts the old process's last lines ahead of
    the launch, in the same start: an hour-old request line is not an hour of init."""
    lines, want = stamped([1_000] * 25)
    old = [
        '[2026-12-01 08:00:00.000] INFO:     127.0.0.1:51236 - "POST /generate HTTP/1.1" 200 OK',
        "[2026-12-01 08:00:01.000 TP0] Decode batch. #running-req: 1, #token: 100, token usage: 0.00, "
        "cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0",
    ]
    log = [f"sglang-1  | {line}" for line in [*old, *lines]]
    got = from_log(log)
    assert got.parts == want, got.parts


def test_a_launch_line_without_a_stamp_times_init_from_the_next_stamped_line() -> None:
    lines, want = stamped([1_000] * 25)
    command = "python3 -m sglang.launch_server --model-path /models/Kimi-K2.6 --tp-size 8"
    older = "[2026-12-01 08:00:00.000] WARNING: an hour before the launch"
    assert from_log([older, command, *lines]).parts == want


def test_a_draft_loaded_after_the_targets_graphs_is_timed_as_weights_not_graphs() -> None:
    """An EAGLE draft loads after the target's graphs where the draft worker starts then: its load (10:10:42
    to 10:10:47, 5 s) is weights, not part of the graphs' span (which runs until the ready line)."""
    draft = [
        "[2026-12-01 10:10:42.000 TP0] Load weight begin. avail mem=12.50 GB",
        "[2026-12-01 10:10:47.000 TP0] Load weight end. elapsed=5.00 s, type=LlamaForCausalLMEagle3, "
        "avail mem=11.30 GB, mem usage=1.20 GB.",
    ]
    target = [line for line in LOG if "DFlash2DraftModel" not in line and "10:09:30.002" not in line]
    at = next(i for i, line in enumerate(target) if "CUDA graph end" in line) + 1
    got = from_log([*target[:at], *draft, *target[at:]])
    plain = from_log(target)
    assert abs(got.parts["weights"] - plain.parts["weights"] - 5.0) < 1e-3, (got.parts, plain.parts)
    assert abs(plain.parts["cuda_graphs"] - got.parts["cuda_graphs"] - 5.0) < 1e-3, (got.parts, plain.parts)
    assert got.seconds is not None and plain.seconds is not None and abs(got.seconds - plain.seconds) < 1e-3
