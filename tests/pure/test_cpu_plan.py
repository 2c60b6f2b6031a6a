"""SGLang's CPU backend as a deploy target: facts read the host's RAM, the planner pins the pool and sizes
its fraction for free RAM that moves between starts. The start-up lines are the real ones of the PyPI
release on CPU (../shared/sglang/REAL-ON-CPU.md)."""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

import math
from typing import Any

import pytest

from agent.errors import UsageError
from agent.host import model_facts
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.sglang.logs.summary import start_figures, summarize

TOY = {  # the real tier's tiny model (tests/realsglang/make_model.py): 512 B of KV per token
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "vocab_size": 2048, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip
REAL_START = "\n".join([
    "[2026-12-03 18:46:01] Init parallel begin.",
    "[2026-12-03 18:46:01] Memory baseline taken. mem usage=0.00 GB",
    "[2026-12-03 18:46:02] Load weight begin. avail mem=21.63 GB",
    "[2026-12-03 18:46:02] Load weight end. elapsed=0.06 s, type=LlamaForCausalLM, avail mem=21.63 GB, mem usage=0.00 GB.",
    "[2026-12-03 18:46:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 16384, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-03 18:46:03] Memory pool end. avail mem=21.59 GB",
    "[2026-12-03 18:46:03] max_total_num_tokens=16384, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=2048, context_len=4096, available_cpu_mem=21.59 GB",
])  # fmt: skip
CPU_FLAGS = {
    "model-path": "/models/tiny",
    "device": "cpu",
    "max-total-tokens": 16384,
    "attention-backend": "torch_native",
}
MEMINFO = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20971520 kB\n"


def cpu_facts(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "deployctl-facts/1",
        "device": "cpu",
        "gpus": [model_facts.parse_host_ram(MEMINFO)],
        "sglang": {"version": "0.5.23"},
        "model": {"config": TOY, "weights_bytes": 3 * 2**20},
        "flags": dict(CPU_FLAGS),
        "last_start": REAL_START,
    }
    doc.update(over)
    return doc


def test_the_real_cpu_scheduler_line_gives_the_free_ram_after_start() -> None:
    s = summarize(REAL_START.splitlines())
    assert (s.kv_tokens, s.avail_mem_before_weights_gb, s.avail_mem_before_pool_gb) == (16384, 21.63, 21.63)
    assert s.available_gpu_mem_gb == 21.59  # `available_cpu_mem=` on CPU


@pytest.mark.parametrize(
    ("cgroup", "nodes", "free_mib"),
    [
        ((None, None), 1, 20480.0),  # MemAvailable (psutil's available)
        (("max\n", "123\n"), 1, 20480.0),  # no cgroup limit
        (("8589934592\n", "2147483648\n"), 1, 6144.0),  # memory.max - memory.current is lower
        ((None, None), 2, 10240.0),  # shared by the NUMA nodes, as SGLang divides it
    ],
)
def test_facts_read_the_ram_sglang_sizes_from(
    cgroup: tuple[str | None, str | None], nodes: int, free_mib: float
) -> None:
    row = model_facts.parse_host_ram(MEMINFO, *cgroup, numa_nodes=nodes)
    assert row is not None and row["memory_free_mib"] == free_mib
    assert row["memory_total_mib"] == round(24000.0 / nodes, 1)
    assert model_facts.parse_host_ram("MemTotal: 10 kB\n") is None  # no MemAvailable: no figure


def test_facts_of_a_cpu_unit_report_the_ram_not_nvidia_smi(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TOY), encoding="utf-8")
    unit = (
        "[Service]\nExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path "
        f"{model} --device cpu --max-total-tokens 16384\n"
    )
    monkeypatch.setattr(model_facts, "host_ram", lambda: model_facts.parse_host_ram(MEMINFO))
    monkeypatch.setattr(model_facts, "gpus", lambda: pytest.fail("nvidia-smi asked on a CPU host"))
    doc = model_facts.collect(unit, REAL_START.splitlines(), ())
    assert doc is not None and doc["device"] == "cpu"
    assert doc["gpus"] == [
        {"name": "host RAM (1 NUMA node)", "memory_total_mib": 24000.0, "memory_free_mib": 20480.0}
    ]


def test_a_cpu_host_is_planned_from_its_own_last_start() -> None:
    p = plan_from_facts(parse_facts(cpu_facts()), Target(32_768))
    goal = math.ceil(32_768 * 1.02)
    assert p.feasible and p.basis == "calibrated"
    # the pool is pinned: it does not move with free RAM
    assert p.flags()["max-total-tokens"] == goal == p.predicted_pool_tokens
    # the fraction holds the pin with free RAM 10 % (2.16 GiB) below the last start's 21.63 GiB, and as
    # much again taken between the start's weights and its pool
    low_pre, low_post, cell = 21.63 - 2.163, 21.63 - 2 * 2.163, 512
    rest = low_post - low_pre * (1 - p.mem_fraction_static)
    assert rest * 2**30 // cell >= goal
    rest_below = low_post - low_pre * (1 - (p.mem_fraction_static - 0.001))
    assert rest_below * 2**30 // cell < goal  # and is the smallest that does
    text = " ".join(p.notes)
    assert "free RAM" in text and "2.16 GiB less" in text and "no CUDA graphs" in text
    assert p.cell_bytes == 512 and p.pre_gib == 21.63


def test_the_drift_allowance_grows_with_what_the_starts_showed() -> None:
    inp = parse_facts(cpu_facts())
    second = start_figures(REAL_START.replace("avail mem=21.63", "avail mem=16.00").splitlines())
    from dataclasses import replace

    moved = replace(inp, starts=(*inp.starts, second))
    p = plan_from_facts(moved, Target(32_768))
    assert any("5.63 GiB less" in n for n in p.notes)  # 21.63 - 16.00 is more than 10 % of 16.00


def test_a_pool_free_ram_cannot_hold_is_not_feasible_and_says_why() -> None:
    p = plan_from_facts(parse_facts(cpu_facts()), Target(40_000_000))  # 19 GiB of KV at 512 B
    assert not p.feasible
    assert p.warnings and "free RAM cannot hold" in p.warnings[0]


def test_a_cold_cpu_plan_without_ram_figures_is_refused_in_one_line() -> None:
    doc = cpu_facts(last_start=None, gpus=[{"name": "host RAM", "memory_total_mib": 24000.0}])
    with pytest.raises(UsageError) as err:
        plan_from_facts(parse_facts(doc), Target(8192))
    assert "\n" not in str(err.value) and "on CPU without an earlier start" in str(err.value)


def test_a_cold_cpu_plan_is_given_only_with_a_wide_allowance() -> None:
    p = plan_from_facts(parse_facts(cpu_facts(last_start=None)), Target(8192))
    assert p.feasible and p.basis == "architecture" and p.flags()["max-total-tokens"] == 16384
    assert any("cold: MemAvailable 20.00 GiB" in n for n in p.notes)


def test_a_larger_running_pin_is_kept_when_it_fits() -> None:
    p = plan_from_facts(parse_facts(cpu_facts()), Target(4096))  # the unit pins 16384 already
    assert p.feasible and p.flags()["max-total-tokens"] == 16384 == p.predicted_pool_tokens
    assert p.target_pool_tokens == math.ceil(4096 * 1.02)
    small = cpu_facts(flags={**CPU_FLAGS, "max-total-tokens": 2048})
    p = plan_from_facts(parse_facts(small), Target(4096))
    assert p.flags()["max-total-tokens"] == math.ceil(4096 * 1.02)  # raised to the target in one restart


def test_a_gpu_host_gets_no_pin() -> None:
    from tests.pure.test_facts_plan import ct200

    p = plan_from_facts(parse_facts(ct200()), Target(200_000))
    assert "max-total-tokens" not in p.flags()


def test_apply_plans_a_cpu_host_from_its_facts_and_last_start(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path `deployctl apply` takes: the host's model facts (RAM, not nvidia-smi) and the figures of
    its last start as the agent read them off the journal (a real start, logged by the PyPI release)."""
    import json
    from pathlib import Path

    from agent.apply import calibration_from
    from agent.inventory import HostConfig
    from agent.plan.from_facts import plan_from_host_facts

    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TOY), encoding="utf-8")
    unit = f"[Service]\nExecStart=/v/bin/python -m sglang.launch_server --model-path {model} --device cpu --max-total-tokens 2048\n"
    monkeypatch.setattr(model_facts, "host_ram", lambda: model_facts.parse_host_ram(MEMINFO))
    real = (Path(__file__).resolve().parents[1] / "data" / "sglang-real-cpu-stop.log").read_text(
        encoding="utf-8"
    )
    facts = {
        "model_facts": model_facts.collect(unit, real.splitlines(), ()),
        "last_start": start_figures(real.splitlines()),
    }
    host = HostConfig.model_validate(
        {"name": "real-cpu", "ssh": {"target": "real-cpu"}, "gpus": {"count": 1, "memory_gib": 80.0},
         "model": {"path": str(model)}, "sglang": {"version": "0.5.23"}}
    )  # fmt: skip
    plan = plan_from_host_facts(host, facts, calibration_from(facts), Target(4096))
    assert plan is not None and plan.feasible and plan.basis == "calibrated"
    assert (
        plan.flags()["max-total-tokens"] == math.ceil(4096 * 1.02) == plan.predicted_pool_tokens
    )  # 2048 raised
    assert plan.pre_gib == 19.86 and plan.post_gib == 19.85  # the real start's free RAM


def test_the_chart_of_a_cpu_plan_shows_the_pin_and_no_floor() -> None:
    from agent.chart import from_plan

    p = plan_from_facts(parse_facts(cpu_facts()), Target(32_768))
    chart = from_plan(p, None)
    assert chart.pool_at(0.9) == p.predicted_pool_tokens  # the pin caps the curve
    assert chart.floor_fraction is None  # the fraction bounds no memory on CPU
