"""A forced change whose plan predicts no pool at all still runs, fails on the host and rolls back."""

from __future__ import annotations

import pytest

from agent.exitcodes import ExitCode
from tests.integration.conftest import cli, wait_pool
from tests.simhost import SimHost

pytestmark = pytest.mark.integration


def test_forced_fraction_below_the_weights_rolls_back(sim: SimHost) -> None:
    before = sim.unit_text()
    pool = wait_pool(sim)
    # At 0.70 the weights alone exceed the static share: the planner predicts a pool of 0 tokens.
    r = cli(sim, "apply", sim.name, "--context", "200k", "--mem-fraction-static", "0.70", "--force", "--yes")
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert sim.unit_text() == before
    assert wait_pool(sim) == pool
