"""docs/accuracy.md is what `make accuracy` (tests/accuracy.py) gives from the committed data, and the public
starts it reports are each checked and sourced."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import UsageError
from tests import accuracy


def test_the_committed_report_is_what_the_data_gives() -> None:
    # On a failure: run `make accuracy` and commit docs/accuracy.md with the change that moved it.
    assert accuracy.REPORT.read_text() == accuracy.render()


def test_every_public_start_is_in_the_report_with_its_source() -> None:
    rows = accuracy.public_rows()
    text = accuracy.REPORT.read_text()
    assert len(rows) >= 20
    for row in rows:
        assert row.source.startswith("https://") and row.source in text and row.name in text


def test_the_public_starts_hit_unless_a_known_miss_says_why() -> None:
    # Cold and cell alike: a miss stays in the report, with its likely cause from the data file.
    for row in accuracy.public_rows():
        assert row.verdict == "hit" or "(known: " in row.verdict, row


def test_a_start_the_planner_refuses_is_shown_as_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> Any:
        raise UsageError("this architecture is not followed")

    monkeypatch.setattr(accuracy, "pool_model", refuse)
    for check in ("cold", "cell"):
        start = next(s for s in accuracy.public_starts() if s.get("check", "cold") == check)
        row = accuracy.public_row(start)
        assert row.verdict == "refused: this architecture is not followed" and row.error is None
        assert row.predicted == "refused"


def test_misses_refusals_and_set_asides_are_listed_plainly() -> None:
    text = accuracy.render()
    section = text.split("## Known misses, refusals and cases set aside")[1].split("## Public starts")[0]
    for row in accuracy.public_rows() + accuracy.oracle_rows():
        if row.verdict != "hit" and not row.verdict.startswith("hit "):
            assert row.name in section, row


def test_a_cold_verdict_names_over_prediction_beyond_the_margin() -> None:
    assert accuracy.cold_verdict(100_000, 101_000, 99_000) == "hit"
    assert accuracy.cold_verdict(100_000, 104_000, 100_500).startswith("miss: over-predicted")
    assert accuracy.cold_verdict(100_000, 90_000, 88_000).startswith("miss: under-predicted")
