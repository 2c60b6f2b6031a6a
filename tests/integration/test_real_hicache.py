"""HiCache against the real SGLang 0.5.23 on the test host's CPU (tests/realhost.py): the plan's host pool,
rendered as --hicache-size with its MemoryMax=, is the pool SGLang itself logs, to the token. On CPU the host
pool then dies pinning its memory (cudaHostRegister: ../shared/sglang/PD-AND-HICACHE-ON-CPU.md), so the start
fails on SGLang's own line and deployctl rolls back to the running unit by itself."""

from __future__ import annotations

import json
import re

import pytest

from agent.exitcodes import ExitCode
from tests import realhost
from tests.realhost import RealHost

pytestmark = [pytest.mark.integration, pytest.mark.real_sglang]

HOST = realhost.NAME
CONTEXT = "4096"


def test_the_plans_host_pool_is_the_real_line_to_the_token(real: RealHost) -> None:
    if not real.healthy():
        real.ensure_hand()
    old_unit, old_pool = real.unit_text(), real.pool()
    # ratio 150 of the 16,384-token device pool asks 1.26 GB: the plan renders --hicache-size 1
    real.inventory(flags="enable-hierarchical-cache = true\nhicache-ratio = 150.0")
    planned = real.deployctl("plan", HOST, "--context", CONTEXT, "--json")
    assert planned.returncode == ExitCode.OK, planned.stderr
    plan = json.loads(planned.stdout)
    pool, budget = plan["host_pool"], plan["host_budget"]
    assert pool["checked"] is True and budget["verdict"] in ("fits", "fits, pre-warm skipped")
    assert plan["flags"]["hicache-size"] == 1 and pool["memory_max"]
    r = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes")
    out = r.stdout + r.stderr
    assert r.returncode == ExitCode.ROLLED_BACK, out
    lines = real.journal(2000)
    said = [int(m) for m in re.findall(r"Allocating kv hierarchical KV host pool: (\d+) tokens", lines)]
    assert said and said[-1] == pool["tokens"], (said, pool)
    assert "host_pool_mismatch" not in out and "CUDA" in out  # rolled back on SGLang's own failure
    assert real.unit_text() == old_unit
    real.wait_ready()
    assert real.pool() == old_pool


def test_a_memory_max_too_small_is_refused_by_the_plan_and_by_sglang_in_its_own_words(real: RealHost) -> None:
    """A MemoryMax= of the unit's own (a verbatim line, which systemd applies over the rendered one) that
    cannot hold SGLang's 10 GiB reserve and the pool: the plan refuses it before any start; forced past the
    plan, the real SGLang refuses it itself under that cgroup, the report names host_memory_short, and
    deployctl rolls back to the running unit."""
    if not real.healthy():
        real.ensure_hand()
    old_unit, old_pool = real.unit_text(), real.pool()
    path = real.inventory(flags="enable-hierarchical-cache = true\nhicache-size = 1")
    text = path.read_text()
    assert '"Nice=10"' in text, text  # the hand-written unit's own line, kept verbatim by the adoption
    path.write_text(text.replace('"Nice=10"', '"Nice=10", "MemoryMax=6G"', 1))
    planned = real.deployctl("plan", HOST, "--context", CONTEXT, "--json")
    assert planned.returncode == ExitCode.NOT_FEASIBLE, planned.stdout + planned.stderr
    budget = json.loads(planned.stdout)["host_budget"]
    assert budget["verdict"] == "refused" and "Not enough host memory available" in budget["reason"]
    refused = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes")
    assert refused.returncode == ExitCode.USAGE, refused.stdout + refused.stderr
    assert real.unit_text() == old_unit  # refused before anything changed
    forced = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes", "--force")
    out = forced.stdout + forced.stderr
    assert forced.returncode == ExitCode.ROLLED_BACK, out
    lines = real.journal(2000)
    assert re.search(
        r"Not enough host memory available\. Requesting 1\.00 GB but only have -?[\d.]+ GB free", lines
    )
    assert "host_memory_short" in out or "MemoryMax=" in out, out  # the failure kind, with its fix
    assert real.unit_text() == old_unit
    real.wait_ready()
    assert real.pool() == old_pool
