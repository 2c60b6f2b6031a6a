"""The load check before a commit ([smoke] load = N), on the simulated server.

The simulated SGLang streams as SGLang does (the first token after the prefill, then one per decode step),
so the figures are measured, not echoed; with SGLANG_SIM_OOM_OVER_TOKENS (a fault) more prompt tokens than
that in prefill at once answer CUDA out of memory, as a fraction that leaves too little for activations
does under load.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from agent.exitcodes import ExitCode
from tests import simhost
from tests.integration.conftest import boot_sim, cli, wait_pool

pytestmark = pytest.mark.integration
DECODE = {"SGLANG_SIM_DECODE_SECONDS_PER_TOKEN": "0.02"}  # 20 ms per decode step


@pytest.fixture(scope="module")
def sim() -> Iterator[simhost.SimHost]:
    host = boot_sim(DECODE)
    path = host.units_dir / f"{host.name}.toml"
    path.write_text(path.read_text().replace("[smoke]\n", "[smoke]\nload = 3\n", 1))
    try:
        yield host
    finally:
        host.stop()


def test_the_load_check_measures_prefill_and_decode_at_the_target_context(sim: simhost.SimHost) -> None:
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes", timeout=600)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("load check:"))
    print("\n" + line)
    m = re.search(r"4 requests at once, all answered in [\d.]+ s; prefill ([\d,]+) tokens/s, "
                  r"decode ([\d.]+) ms/token at ([\d,]+) tokens", line)  # fmt: skip
    assert m, line
    assert int(m[3].replace(",", "")) > 150_000  # the long prompt was at the target context
    assert 15 <= float(m[2]) <= 200  # the simulated 20 ms per step, plus this machine's own time


def test_an_oom_under_load_rolls_back(sim: simhost.SimHost) -> None:
    wait_pool(sim)
    sim.set_sim_env({**DECODE, "SGLANG_SIM_OOM_OVER_TOKENS": "100000"})
    try:
        r = cli(sim, "apply", sim.name, "--context", "150k", "--yes", timeout=600)
    finally:
        sim.set_sim_env(DECODE)
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert "load check failed" in r.stdout and "CUDA out of memory" in r.stdout, r.stdout
