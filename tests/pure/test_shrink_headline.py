"""The SHRINKS headline: said when the plan's pool is smaller than the one the unit runs now and that one
holds the target, measured from the fraction the unit ran at; never for a page size's rounding."""

from __future__ import annotations

import json
from pathlib import Path

from tests.pure.test_log_starts import GOOD, run, write
from tests.pure.test_review39_findings import ran_at_093
from tests.pure.test_unset_fraction_set import plan_json


def test_a_pool_that_differs_only_by_page_rounding_is_not_called_a_shrink() -> None:
    running = plan_json()["predicted_pool_tokens"]
    doc = plan_json("--set", "page-size=64")
    assert 0 < running - doc["predicted_pool_tokens"] < 64  # the page's rounding, nothing else
    assert "shrinks" not in doc, doc["shrinks"]


def test_the_shrink_headline_names_the_fraction_the_start_ran_at(tmp_path: Path) -> None:
    log = write(tmp_path, "\n".join(ran_at_093()) + "\n")
    code, stdout, stderr = run(tmp_path, "plan", "ct200", "--offline", "--context", "100k", "--from-log", log)
    assert code == 0, stderr
    head = stdout.splitlines()[0]
    assert "SHRINKS the pool from 226,588 tokens (at the fraction it runs now, 0.930" in head, head
    assert "0.850" in head, head


def test_a_start_at_the_inventorys_fraction_is_no_shrink(tmp_path: Path) -> None:
    log = write(tmp_path, "\n".join(GOOD) + "\n")  # the shipped start, at the inventory's 0.85
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "100k", "--json", "--from-log", log
    )
    assert code in (0, 5), stderr
    assert "shrinks" not in json.loads(stdout)
