"""`deployctl plan` end to end in-process: inventory file, start-up log, human and JSON output."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output

HOST_TOML = """
[ssh]
target = "ct200"

[gpus]
count = 8
memory_gib = 95.6

[model]
path = "/models/Kimi-K2.6"
attention = "mla"
layers = 61
kv_lora_rank = 512
qk_rope_head_dim = 64
weights_gib_per_gpu = 70.48
max_context = 262144

[draft]
algorithm = "DFLASH"
path = "/models/Kimi-K2.6-DFlash"
layers = 3
kv_heads = 32
head_dim = 128
weights_gib_per_gpu = 1.20

[sglang]
version = "0.5.23"

[sglang.flags]
tp-size = 8
context-length = 32768
mem-fraction-static = 0.85
max-running-requests = 64
"""
# The start at 0.85 as SGLang 0.5.23 logs it on TP0 (the other ranks print the same figures).
START_LOG = """\
[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=92.80 GB
[2026-12-01 10:09:00 TP0] Load weight end. elapsed=540.00 s, type=KimiK25ForConditionalGeneration, \
avail mem=22.32 GB, mem usage=70.48 GB.
[2026-12-01 10:09:30 TP0] Load weight begin. avail mem=22.32 GB
[2026-12-01 10:09:40 TP0] Load weight end. elapsed=10.00 s, type=DFlash2DraftModel, avail mem=21.12 GB, \
mem usage=1.20 GB.
[2026-12-01 10:09:41 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 101134, KV size: 6.62 GB
[2026-12-01 10:09:42 TP0] Memory pool end. avail mem=13.90 GB
[2026-12-01 10:10:42 TP0] max_total_num_tokens=101134, chunked_prefill_size=8192, max_prefill_tokens=16384, \
max_running_requests=64, context_len=32768, available_gpu_mem=12.50 GB
"""


@pytest.fixture
def units(tmp_path: Path) -> Path:
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "ct200.toml").write_text(HOST_TOML, encoding="utf-8")
    return tmp_path / "units"


def run(*argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(list(argv), out=out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


@pytest.fixture
def start_log(tmp_path: Path) -> Path:
    path = tmp_path / "start.log"
    path.write_bytes(START_LOG.encode() + b"\xff garbage that is not utf-8\n")
    return path


def test_plan_200k_from_a_log_as_json(units: Path, start_log: Path) -> None:
    code, stdout, stderr = run(
        "--units", str(units), "plan", "ct200", "--context", "200k", "--from-log", str(start_log), "--json"
    )
    assert (code, stderr) == (0, "")
    plan = json.loads(stdout)
    assert plan["basis"] == "calibrated" and plan["feasible"] is True
    assert plan["predicted_pool_tokens"] >= 204_000
    assert plan["concurrency_at_full_context"] == 1
    assert plan["mem_fraction_static"] == 0.929 and plan["max_running_requests"] == 64
    assert plan["reserve_gib_per_gpu"] >= 4.0
    assert isinstance(plan["notes"], list) and plan["notes"]


def test_plan_human_output(units: Path, start_log: Path) -> None:
    code, stdout, _ = run(
        "--units", str(units), "plan", "ct200", "--context", "200k", "--from-log", str(start_log)
    )
    assert code == 0
    assert "feasible (calibrated)" in stdout
    assert "--mem-fraction-static 0.929 --max-running-requests 64 --context-length 200000" in stdout
    assert "full-context requests at once  1" in stdout
    assert "memory left per GPU" in stdout
    assert "--context-length alone does not grow the pool" in stdout


def test_plan_400k_says_not_feasible_and_exits_8(units: Path) -> None:
    code, stdout, _ = run("--units", str(units), "plan", "ct200", "--context", "400k", "--offline")
    assert code == 8  # the exit status says the plan is not feasible; the plan is printed all the same
    assert "NOT FEASIBLE" in stdout
    assert "fp8 KV cache" in stdout and "more GPUs" in stdout
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in stdout


def test_plan_at_a_given_fraction(units: Path, start_log: Path) -> None:
    code, stdout, _ = run(
        "--units", str(units), "plan", "ct200", "--context", "200k", "--from-log", str(start_log),
        "--mem-fraction-static", "0.94", "--max-running-requests", "8", "--json",
    )  # fmt: skip
    assert code == 0
    plan = json.loads(stdout)
    assert plan["mem_fraction_static"] == 0.94 and plan["max_running_requests"] == 8
    assert abs(plan["predicted_pool_tokens"] - 218_484) / 218_484 < 0.005


def test_missing_log_is_a_usage_error(units: Path, tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "--units", str(units), "plan", "ct200", "--context", "200k", "--from-log", str(tmp_path / "nope.log")
    )
    assert code == 2 and stdout == ""
    assert "nope.log" in stderr and "cannot read" in stderr


def test_unknown_host_and_missing_context(units: Path) -> None:
    assert run("--units", str(units), "plan", "ct201", "--context", "200k")[0] == 2
    code, _, stderr = run("--units", str(units), "plan", "ct200")
    assert code == 2 and "--context" in stderr
