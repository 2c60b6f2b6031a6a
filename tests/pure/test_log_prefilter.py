"""The log parser's prefilter (may_have_events) never drops a line that any guard or pattern would match."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.sglang.logs import failures as log_failures
from agent.sglang.logs import lines as log_lines
from agent.sglang.logs.lines import may_have_events, parse_line, parse_line_unfiltered
from tests.bench import parse_bench

ROOT = Path(__file__).resolve().parents[2]
PARSER_FILES = [ROOT / "agent/sglang/logs/lines.py", ROOT / "agent/sglang/logs/failures.py"]

# Literals the parser tests that need no key of their own: each is consulted only on a line that
# already passed a guard holding a key, or it excludes lines rather than admitting them.
SECONDARY_LITERALS = {
    "\n": "line splitting, not a guard",
    "\r": "line splitting, not a guard",
    "Load weight begin": "read only after 'avail mem'",
    "Load weight end": "read only after 'avail mem'",
    "Capture ": "read only after 'avail mem'",
    "raph begin": "read only after 'avail mem'",
    "raph end": "read only after 'avail mem'",
    " --": "and-ed with launch_server / sglang serve",
}
# Patterns that match ordinary lines by design: the line prefix, and fields read off a line that an
# earlier guard (holding a key) already admitted. Every other pattern must hold a key in each match.
FIELD_PATTERNS = {
    "_PREFIX": "prefix",
    "_OLD_PREFIX": "prefix",
    "_GLUED": "prefix",
    "_LEAD": "the exception names before a failure's cause (matches the empty string)",
    "_USAGE": "after 'avail mem'",
    "_TYPE": "after 'avail mem'",
    "_DRAFT_TYPE": "after 'avail mem', on the model type",
    "_TOKENS": "after the KV guard",
    "_K_SIZE": "after the KV guard",
    "_SWA_FULL": "after the SWA guard",
    "_SWA_SWA": "after the SWA guard",
    "_PAIR": "after max_total_num_tokens=",
    "_ARG_NODES": "inside a server_args line",
    "_ARG_DPA": "inside a server_args line",
    "_MIN_VIABLE": "after 'Loaded weights leave no GPU memory'",
    "_RAISE_ABOVE": "after 'Loaded weights leave no GPU memory'",
}


def _guard_literals() -> set[str]:
    """Every string the parser tests with `in`/`not in` or startswith, and every failure needle."""
    found: set[str] = set()
    for path in PARSER_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str)
                and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
            ):
                found.add(node.left.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "startswith"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.add(node.args[0].value)
    return found


def _patterns() -> dict[str, re.Pattern[str]]:
    found = {
        name: value
        for module in (log_lines, log_failures)
        for name, value in vars(module).items()
        if isinstance(value, re.Pattern)
    }
    found.update((f"_CAUSES[{i}]", pattern) for i, (pattern, _, _) in enumerate(log_failures._CAUSES))
    return found


GUARDS = sorted(_guard_literals() - set(SECONDARY_LITERALS))
PATTERNS = _patterns()
KEYED_PATTERNS = sorted(name for name in PATTERNS if name not in FIELD_PATTERNS)


def test_exemption_lists_are_current() -> None:
    assert set(SECONDARY_LITERALS) <= _guard_literals()
    assert set(FIELD_PATTERNS) <= set(PATTERNS)


@pytest.mark.parametrize("literal", GUARDS)
def test_every_guard_holds_a_key(literal: str) -> None:
    # may_have_events(literal) means a key is a substring of it, so of any line that holds it.
    assert may_have_events(literal), f"add a prefilter key found in {literal!r}"


@pytest.mark.parametrize("name", KEYED_PATTERNS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_pattern_match_holds_a_key(name: str, data: st.DataObject) -> None:
    text = data.draw(st.from_regex(PATTERNS[name], fullmatch=True))
    assert may_have_events(text), f"{name} matches {text!r}, which no prefilter key admits"


def _real_lines() -> Iterator[str]:
    """Real pasted logs (whole, and line by line), the bench journal, and the line formats test_logs uses."""
    data = ROOT / "tests/data/sglang-real-logs.jsonl"
    for raw in data.read_text(encoding="utf-8").splitlines():
        if raw.strip():
            case = json.loads(raw)
            text = "\n".join(case.get("log_segments") or []) or str(case["log"])
            yield text
            yield from text.splitlines()
    yield from parse_bench._startup()
    yield from parse_bench._serving(30)
    for node in ast.walk(ast.parse((ROOT / "tests/pure/test_logs.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


REAL_LINES = list(dict.fromkeys(_real_lines()))


def test_real_lines_pass_the_prefilter_or_match_nothing() -> None:
    assert len(REAL_LINES) > 500
    keyed = [PATTERNS[name] for name in KEYED_PATTERNS]
    dropped = 0
    for line in REAL_LINES:
        assert parse_line(line) == parse_line_unfiltered(line), line
        if not may_have_events(line):
            dropped += 1
            assert parse_line_unfiltered(line) == [], line
            assert not [g for g in GUARDS if g in line], line
            assert not [p.pattern for p in keyed if p.search(line)], line
    assert dropped  # the real logs hold noise too: the prefilter does drop some


_FRAGMENTS = [
    *GUARDS,
    *SECONDARY_LITERALS,
    "[2026-10-30 12:00:00 TP0] ",
    "[gpu_id=0] ",
    "Nov 04 05:27:13 gpu1 python3[4242]: ",
    " avail mem=12.5 GB",
    ", #tokens: 1000, KV size: 2.00 GB",
    ": 50% Completed | 8/16",
    "=0.85, ",
    " --mem-fraction-static 0.8",
    "max_running_requests=64",
    "Error: ",
    ' "x.py", line 3',
    '127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK',
    "Decode batch. #running-req: 3, #token: 900, token usage: 0.05",
    " ",
    "\n",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=4), max_size=8).map("".join))
def test_prefilter_never_changes_events(text: str) -> None:
    assert parse_line(text) == parse_line_unfiltered(text)
