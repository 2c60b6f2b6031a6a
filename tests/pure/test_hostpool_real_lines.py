"""The plan's host pool against the real SGLang 0.5.23's own lines on this machine's CPU, recorded in
../shared/sglang/PD-AND-HICACHE-ON-CPU.md (the real tier's tiny model: a 16,384-token device pool, 512 B of
KV per token): the CPU plan of that model, HiCache on, gives SGLang's token count to the token."""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.sglang.logs.summary import SummaryBuilder
from tests.pure.test_cpu_plan import cpu_facts

REAL = {  # flags -> SGLang's own line (PD-AND-HICACHE-ON-CPU.md, "What prints, verbatim")
    "ratio 2": ({"hicache-ratio": 2.0}, "[2026-12-06 02:09:32] Allocating kv hierarchical KV host pool: 32769 tokens, 0.02 GB host memory."),
    "size 1": ({"hicache-size": 1}, "[2026-12-06 02:10:48] Allocating kv hierarchical KV host pool: 1953126 tokens, 1.00 GB host memory."),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REAL))
def test_the_cpu_plans_host_pool_is_sglangs_line(case: str) -> None:
    flags, line = REAL[case]
    inp = parse_facts(cpu_facts(), name="tiny")
    inp = replace(inp, flags={**inp.flags, "enable-hierarchical-cache": True, **flags})
    plan = plan_from_facts(inp, Target(4096))
    b = SummaryBuilder()
    b.feed(line)
    logged = b.summary().to_dict()
    assert plan.host is not None and plan.host.bytes_per_token == 512
    assert plan.host.pool.tokens == logged.get("host_pool_tokens")
    assert round(plan.host.pool.gb, 2) == logged.get("host_pool_gb")
    # the gate gets the exact count only where the unit carries a size (a ratio's pool follows the device's)
    assert (plan.flags().get("hicache-size") is not None) is (case == "size 1")
