"""The one-start rule over logs built from the 27 real SGLang logs (tests/data/sglang-real-logs.jsonl): 1 to 3
starts in any order, any mix of ok and failed, plain or decorated as a terminal, journalctl or docker leaves
them. The evidence is exactly one start, the latest complete one or the one named; its numbers are that
start's own (the case's `derived` figures); a failed start keeps its own fraction."""

from __future__ import annotations

import io
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.output import Output
from agent.sglang.logs import events as ev
from agent.sglang.logs.decor import split_lines
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.starts import chosen, evidence, plan_figures, split
from agent.sglang.logs.summary import StartSummary, summarize
from tests.pure.test_logs import CASES, NOT_IN_EXCERPT, SUMMARY_FIELDS, _text


def _launches(case: dict[str, Any]) -> bool:
    """Whether the case logs its own launch line (server_args or a pasted command)."""
    return any(
        isinstance(e, ev.ServerArgs) and e.source in ("server_args", "command")
        for line in _text(case).split("\n")
        for e in parse_line(line)
    )


ALONE = {c["id"]: summarize(_text(c).split("\n")) for c in CASES}
LAUNCHES = {c["id"]: _launches(c) for c in CASES}


def _complete(s: StartSummary) -> bool:
    return s.ready or s.failure is not None


PREFIXES = {
    "none": "",
    "short": "Dec 01 10:00:{s:02d} ct200 python3[4821]: ",
    "short-iso": "2026-12-01T10:00:{s:02d}+0000 ct200 python3[4821]: ",
    "short-full": "Tue 2026-12-01 10:00:{s:02d} UTC ct200 python3[4821]: ",
    "short-monotonic": "[ 5123.{s:06d}] ct200 python3[4821]: ",
    "docker": "2026-12-01T10:00:{s:02d}.123456789Z ",
    "compose": "\x1b[36msglang-1  | \x1b[0m2026-12-01T10:00:{s:02d}.123456789Z ",
}


@dataclass(frozen=True)
class Decoration:
    prefix: str
    ansi: bool
    crlf: bool

    def line(self, text: str, n: int, who: str = "sglang") -> str:
        if self.ansi:  # colour the logger's prefix, or the whole line, and erase to its end
            cut = text.find("] ") + 1 if text.startswith("[") else len(text)
            text = f"\x1b[1;32m{text[:cut]}\x1b[0m{text[cut:]}\x1b[K"
        head = PREFIXES[self.prefix].replace(
            "python3[4821]", "systemd[1]" if who == "systemd" else "python3[4821]"
        )
        return head.format(s=n % 60) + text


MARKS = ("started", "boot", "server_args")


def build(cases: list[dict[str, Any]], marks: list[str], deco: Decoration) -> str:
    """One log of these starts in this order, each opened by its mark."""
    lines: list[str] = []
    for case, mark in zip(cases, marks, strict=True):
        if mark == "server_args" and LAUNCHES[case["id"]]:
            mark = "started"  # the case's own launch line opens it
        if mark == "started":
            lines.append(deco.line("Started sglang.service - SGLang.", 0, "systemd"))
        elif mark == "boot":
            lines.append("-- Boot 5e1c4b0f1a2d4c7e9b3a8f6d2c1e0b9a --")
        else:
            lines.append(deco.line("[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/m')", 0))
        # tqdm's redraws (\r) are lines of their own, each with the journal's prefix
        lines += [deco.line(p, i) for i, p in enumerate(_text(case).replace("\r", "\n").split("\n"))]
    return ("\r\n" if deco.crlf else "\n").join(lines)


LOGS = st.integers(1, 3).flatmap(
    lambda k: st.tuples(
        st.lists(st.sampled_from(CASES), min_size=k, max_size=k),
        st.lists(st.sampled_from(MARKS), min_size=k, max_size=k),
        st.builds(Decoration, st.sampled_from(sorted(PREFIXES)), st.booleans(), st.booleans()),
        st.integers(1, k),
    )
)


_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")


def _measured(s: StartSummary) -> bool:
    post = s.avail_mem_before_pool_gb or s.avail_mem_after_weights_gb
    return bool(s.kv_tokens or s.max_total_num_tokens or (s.avail_mem_before_weights_gb and post))


def _latest(indices: list[int], cases: list[dict[str, Any]], marks: list[str]) -> int:
    """The latest start by the first SGLang timestamp it logged (build's server_args mark first), where each
    has one; else the last."""
    stamps = []
    for i in indices:
        own = "server_args" if marks[i] == "server_args" and not LAUNCHES[cases[i]["id"]] else ""
        lines = ["[2026-12-01 10:00:00]"] if own else _text(cases[i]).replace("\r", "\n").split("\n")
        stamps.append(next((m[1] for line in lines if (m := _STAMP.match(line))), None))
    if None in stamps:
        return indices[-1]
    return max(zip(stamps, indices, strict=True))[1]


def _derived_hold(case: dict[str, Any], summary: StartSummary) -> None:
    """The figures the case's own thread gives are the start's (test_logs.test_real_log_numbers's rule)."""
    for key, want in case["derived"].items():
        if key in SUMMARY_FIELDS and want is not None:
            got = getattr(summary, key)
            assert got == (None if (case["id"], key) in NOT_IN_EXCERPT else want), (case["id"], key, got)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LOGS)
def test_the_evidence_is_one_start_its_own(
    log: tuple[list[dict[str, Any]], list[str], Decoration, int],
) -> None:
    cases, marks, deco, named = log
    starts = split(split_lines(build(cases, marks, deco)))
    # each start of the log is found, alone, with what it said alone (a failure keeps its own fraction)
    assert len(starts) == len(cases), [s.first_line for s in starts]
    for start, case in zip(starts, cases, strict=True):
        assert start.summary == ALONE[case["id"]], case["id"]
    # the evidence: the latest complete start (by its timestamps where each has one) that logged its memory
    # (a failure that logged none says nothing about it), else the latest complete one, else the last
    complete = [i for i, c in enumerate(cases) if _complete(ALONE[c["id"]])]
    usable = [
        i for i in complete if ALONE[cases[i]["id"]].failure is None or _measured(ALONE[cases[i]["id"]])
    ]
    want = _latest(usable or complete, cases, marks) if complete else len(cases) - 1
    chosen_start = evidence(starts)
    assert chosen_start is starts[want]
    _derived_hold(cases[want], chosen_start.summary)
    # what a plan reads: that start's figures, and each other failed start with its own fraction and failure
    figures = plan_figures(starts, chosen_start)
    assert figures["mem_fraction_static"] == ALONE[cases[want]["id"]].mem_fraction_static
    others = [ALONE[c["id"]] for i, c in enumerate(cases) if i != want and ALONE[c["id"]].failure is not None]
    assert [
        (f["mem_fraction_static"], (f["failure"] or {}).get("kind"))
        for f in figures.get("other_failures", [])
    ] == [(a.mem_fraction_static, a.failure and a.failure.failure_kind) for a in others]
    # or the one named
    named_start = chosen(starts, named)
    assert named_start is not None and named_start.number == named
    _derived_hold(cases[named - 1], named_start.summary)


@settings(max_examples=25, deadline=None)
@given(LOGS)
def test_parse_log_reports_the_evidence_start(
    log: tuple[list[dict[str, Any]], list[str], Decoration, int],
) -> None:
    """The command, as a person runs it on the file: its figures are the evidence start's alone."""
    cases, marks, deco, _ = log
    complete = [c for c in cases if _complete(ALONE[c["id"]])]
    alone = ALONE[(complete or cases)[-1]["id"]]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "journal.log"
        path.write_bytes(build(cases, marks, deco).encode())
        out = Output(stdout=io.StringIO(), stderr=io.StringIO())
        assert main(["parse-log", str(path), "--json"], out) == 0
    assert isinstance(out.stdout, io.StringIO)
    d = json.loads(out.stdout.getvalue())
    for key in ("mem_fraction_static", "kv_tokens", "draft_kv_tokens", "context_len", "ready"):
        assert d[key] == getattr(alone, key), key
    assert (d["failure"] or {}).get("kind") == (alone.failure and alone.failure.failure_kind)
