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
    cannot hold SGLang's 10 GiB reserve and the pool: the plan and apply refuse it before any start, on the
    real host's facts (--force too). Past the plan (--ignore-host-memory), the real SGLang refuses the pool
    itself, in its own words, the report names host_memory_short and deployctl rolls back to the running
    unit. The test host's systemd (nspawn) does not enforce a unit's memory.max (SGLang logs `cgroup
    8589934590.6 GiB` under MemoryMax=6G), so the size asked is one the host's RAM cannot hold either:
    SGLang's refusal comes from the host's memory here, from the cgroup on a host that enforces it (the
    same check, base.py:247-257)."""
    if not real.healthy():
        real.ensure_hand()
    old_unit, old_pool = real.unit_text(), real.pool()
    path = real.inventory(flags="enable-hierarchical-cache = true\nhicache-size = 100")
    text = path.read_text()
    assert '"Nice=10"' in text, text  # the hand-written unit's own line, kept verbatim by the adoption
    path.write_text(text.replace('"Nice=10"', '"Nice=10", "MemoryMax=6G"', 1))
    planned = real.deployctl("plan", HOST, "--context", CONTEXT, "--json")
    assert planned.returncode == ExitCode.NOT_FEASIBLE, planned.stdout + planned.stderr
    budget = json.loads(planned.stdout)["host_budget"]
    assert budget["verdict"] == "refused" and "Not enough host memory available" in budget["reason"]
    assert "MemoryMax=" in budget["reason"]  # the limit that would hold it, beside the size that fits
    refused = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes")
    assert refused.returncode == ExitCode.USAGE, refused.stdout + refused.stderr
    assert real.unit_text() == old_unit  # refused before anything changed
    # --force passes the device's refusal only; the host's memory has its own override
    assert (
        real.deployctl("apply", HOST, "--context", CONTEXT, "--yes", "--force").returncode == ExitCode.USAGE
    )
    forced = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes", "--ignore-host-memory")
    out = forced.stdout + forced.stderr
    assert forced.returncode == ExitCode.ROLLED_BACK, out
    said = r"Not enough host memory available\. Requesting 100\.00 GB but only have -?[\d.]+ GB free"
    assert re.search(said, real.journal(2000))
    assert "host_memory_short" in out and re.search(said, out), out  # parsed: the failure kind, its words
    assert real.unit_text() == old_unit
    real.wait_ready()
    assert real.pool() == old_pool
