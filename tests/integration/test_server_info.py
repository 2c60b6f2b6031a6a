"""After ready, the server's own /server_info must show what the unit was rendered with."""

from __future__ import annotations

import pytest

from agent.exitcodes import ExitCode
from tests.integration.conftest import cli
from tests.integration.test_faults import assert_old_back, base, fault_in_new_start

pytestmark = pytest.mark.integration
__all__ = ["base"]


def test_a_server_that_runs_another_context_fails_the_gate_with_both_values(sim, base):
    old, pool = base
    fault_in_new_start(sim, "wrapper_context")  # the new start serves 32768 whatever its unit says
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes", timeout=600)
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert "--context-length 200000 in the unit, /server_info context_length=32768" in r.stdout
    assert_old_back(sim, old, pool)
