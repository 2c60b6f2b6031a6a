"""docs/accuracy.md's host-pool rows are generated from SGLang's own answers: every case is counted, a case
the planner gets wrong by one token (or refuses in other words) shows as differing, by name."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent.plan.hostpool import HostPool
from tests import accuracy, accuracy_hostpool
from tests.pure import test_hostpool_oracle as oracle


def test_every_case_is_a_row_and_the_report_carries_the_summary() -> None:
    rows = accuracy_hostpool.host_rows()
    assert len(rows) == len(oracle.CASES) and all(r.agrees for r in rows)
    text = accuracy.REPORT.read_text()
    assert accuracy_hostpool.summary_line(rows) in text
    assert "\n".join(accuracy_hostpool.section()) in text


@pytest.mark.parametrize("fault", ["one token more", "other words"])
def test_a_planner_that_is_off_shows_as_differing(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    real = oracle.plan

    def off(case: dict[str, Any]) -> tuple[Any, HostPool | None]:
        pool, got = real(case)
        if got is None:
            return pool, got
        if fault == "one token more":
            return pool, replace(got, tokens=got.tokens + 1) if got.refusal is None else got
        return pool, replace(got, allowance=got.allowance + 10**9) if got.refusal is not None else got

    monkeypatch.setattr(accuracy_hostpool, "plan", off)
    rows = accuracy_hostpool.host_rows()
    differ = [r for r in rows if not r.agrees]
    assert differ and all(r.case in "\n".join(accuracy_hostpool.section()) for r in differ)
    line = accuracy_hostpool.summary_line(rows)
    assert f"{len(differ)} differ" in line
    if fault == "one token more":
        assert "largest error 1 tokens" in line
