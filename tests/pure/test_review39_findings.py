"""Review findings against "plan exactly what will run, from the start that actually ran": each test fails
on the code as it stands and names the rule it breaks. Severity in the comment above each test."""

# ruff: noqa: E501 - verbatim SGLang and journal lines are longer than code lines

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.sglang.logs.decor import undecorated
from agent.sglang.logs.starts import evidence, split
from tests.pure.test_effective_config import H100, facts
from tests.pure.test_log_starts import GOOD, OOM_AT_095, journal, run, write


def cli(units: Path, *argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(units), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


# --- SGLang's own resolution of an unset --max-running-requests --------------------------------------------

LLAMA70_TOML = """
[ssh]
target = "l70"

[gpus]
count = 8
memory_gib = 79.6

[model]
path = "/models/Llama-3.1-70B"
attention = "gqa"
layers = 80
kv_heads = 8
head_dim = 128
weights_gib_per_gpu = 16.5
max_context = 131072

[sglang]
version = "0.5.23"

[sglang.flags]
tp-size = 8
context-length = 131072
mem-fraction-static = 0.85
"""


# MEDIUM: NGRAM speculative decoding resets an unset --max-running-requests to 48 in SGLang 0.5.23
# (arg_groups/speculative_hook.py:1285-1302 _handle_ngram, dispatched from speculative/spec_info.py:265-266),
# exactly as EAGLE/DFLASH/DSPARK do. The planner treats NGRAM as "no draft" (choose.py:145/316
# `algorithm != "NGRAM"`) and sizes, prints and explains SGLang's pool-derived 2,048-4,096 instead: the
# req_to_token table it reserves and the cap it reports ("SGLang ... resolves it to 4,096 here") are not what
# runs.
def test_ngram_unset_request_cap_is_sglangs_48_facts_path() -> None:
    doc = facts("qwen2.5-7b", H100, 1, 15.2, speculative_algorithm="NGRAM")
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
    assert plan.max_running_requests == 48


# MEDIUM: the same through --set on an inventory unit: plan --json says 4,096 requests for a unit SGLang caps at 48.
def test_ngram_set_flag_request_cap_is_sglangs_48_cli(tmp_path: Path) -> None:
    (tmp_path / "l70.toml").write_text(LLAMA70_TOML, encoding="utf-8")
    code, stdout, stderr = cli(
        tmp_path, "plan", "l70", "--context", "128k", "--offline", "--json",
        "--set", "speculative-algorithm=NGRAM",
    )  # fmt: skip
    assert code in (0, 5), stderr
    assert json.loads(stdout)["max_running_requests"] == 48


# MEDIUM: a hybrid (mamba) model's unset cap is also bounded by its state cache in SGLang 0.5.23
# (mem_cache/kv_cache_configurator.py:3134-3151 resolve_max_num_reqs: min(estimate, max_mamba_cache_size //
# ratio)). The plan's own note says "SGLang caps --max-running-requests at 22", yet the plan sizes, prints and
# JSONs 4,096 (plan/requests.py ignores the cap) and claims 73 full-context requests at once at 8k, above the
# cap it states: concurrency_at_full_context is not bounded by the cap that runs.
@pytest.mark.parametrize("context", [8192, 32768])
def test_a_hybrid_models_unset_cap_is_bounded_by_its_state_cache(context: int) -> None:
    plan = plan_from_facts(
        parse_facts(facts("nemotron-3-nano-30b-a3b", H100, 1, 63), name="x"), Target(context)
    )
    said = [m for n in plan.notes if (m := re.search(r"caps --max-running-requests at ([\d,]+)", n))]
    assert said, plan.notes
    cap = int(said[0][1].replace(",", ""))
    assert plan.max_running_requests <= cap, (plan.max_running_requests, cap)
    assert plan.concurrency_at_full_context <= cap, (plan.concurrency_at_full_context, cap)


# --- A failed start is bound to its own fraction --------------------------------------------------------------


# HIGH (wasted restart): a start that ran out of GPU memory capturing CUDA graphs, worded as PyTorch words it
# under expandable segments (c10/cuda/driver_api.h: "CUDA driver error: out of memory") or as NCCL words it
# during a captured all-reduce ("Cuda failure 'out of memory'"), is not read as out of memory
# (failures.py _OOM only knows "CUDA out of memory" / "CUDA error: out of memory"), so plan/failed.py does not
# bound the fraction and the plan recommends 0.873, ABOVE the 0.86 that just failed.
@pytest.mark.parametrize(
    "failure",
    ["RuntimeError: CUDA driver error: out of memory", "Cuda failure 'out of memory'"],
    ids=["torch-driver-api", "nccl"],
)
def test_a_graph_capture_oom_in_other_words_bounds_the_fraction(tmp_path: Path, failure: str) -> None:
    failed = [line.replace("0.95", "0.86") for line in OOM_AT_095]
    failed[-2] = "[2026-12-01 09:49:50.001 TP0] " + failure  # right after "Capture ... CUDA graph begin"
    log = write(tmp_path, journal(failed, GOOD))
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "128k", "--json", "--from-log", log
    )
    assert code in (0, 8), stderr  # 8: NOT_FEASIBLE, the bounded fraction misses 128k (printed either way)
    p = json.loads(stdout)
    assert p["mem_fraction_static"] < 0.86, p["mem_fraction_static"]


# --- Evidence is one start ------------------------------------------------------------------------------------

# A second SGLang server of the same host (a PD pair's decode role next to its prefill, units/pd-1p1d.toml; a
# second model): its own fraction and pool.
OTHER = [
    line.replace("#tokens: 101134", "#tokens: 555555")
    .replace("max_total_num_tokens=101134", "max_total_num_tokens=555555")
    .replace("'mem_fraction_static': 0.85", "'mem_fraction_static': 0.7")
    for line in GOOD
]


def interleaved(prefix_a: str, prefix_b: str) -> list[str]:
    out: list[str] = []
    for a, b in zip(GOOD, OTHER, strict=True):
        out += [prefix_a + a, prefix_b + b]
    return out


# HIGH (wrong calibration): two SGLang processes in one log (`journalctl -u 'llama-pd*'` of a PD pair on one
# host, `docker compose logs` of two services, `kubectl logs -l app=sglang --prefix`) are split on server_args
# lines alone; the process each line came from (journald PID, compose service, kubectl pod) is dropped in
# decor.py, so the evidence start holds one server's fraction (0.7) with the other's pool (101,134 tokens):
# a start that never ran.
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Dec 01 10:00:00 gpu-pd python3[100]: ", "Dec 01 10:00:00 gpu-pd python3[200]: "),
        ("prefill-1  | ", "decode-1   | "),
        ("[pod/sglang-0/sglang] ", "[pod/sglang-1/sglang] "),
    ],
    ids=["journald-two-pids", "compose-two-services", "kubectl-two-pods"],
)
def test_two_servers_interleaved_are_never_read_as_one_start(a: str, b: str) -> None:
    start = evidence(split(interleaved(a, b)))
    assert start is not None
    pair = (start.summary.mem_fraction_static, start.figures().get("kv_tokens"))
    assert pair in ((0.85, 101134), (0.7, 555555)), pair


# --- Decoration taken off before parsing ----------------------------------------------------------------------

SGLANG_LINE = "[2026-12-01 10:09:41.205 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 101134, KV size: 6.62 GB"


# LOW (no start read, refused): journalctl -o short-full / with-unit print the zone as strftime's %Z, which for
# the many tzdata zones without a letter abbreviation is numeric: "+04" (Asia/Dubai), "-03" (America/Sao_Paulo),
# "+08" (Asia/Singapore). decor.py's short-full stamp requires a capital letter first, so every line keeps its
# prefix and the log yields no start at all.
@pytest.mark.parametrize("zone", ["+04", "-03"])
def test_short_full_with_a_numeric_zone_is_undecorated(zone: str) -> None:
    line = f"Tue 2026-12-01 10:09:41 {zone} gpu-host python3[4800]: {SGLANG_LINE}"
    assert undecorated(line).text == SGLANG_LINE
    assert split([f"Tue 2026-12-01 10:00:00 {zone} gpu-host python3[4800]: {g}" for g in GOOD])


# LOW (no start read): the container runtime's own log file (/var/log/pods/<pod>/<container>/0.log, what
# `kubectl logs` reads; CRI format: RFC 3339 time, stream, P/F tag) keeps "stdout F " before SGLang's prefix,
# so no line parses: the start comes back "cut" with no pool.
def test_a_cri_log_file_is_undecorated() -> None:
    assert undecorated(f"2026-12-01T10:09:41.205123456Z stdout F {SGLANG_LINE}").text == SGLANG_LINE


# --- plan --from-log states the restart time from the start it reads ----------------------------------------


# MEDIUM (the restart estimate is off by hours): `journalctl -u sglang.service --since -3h` (or `-n 5000`) begins
# in the previous server's serving lines, whose own start is not in the log. They hold no start-up event, so
# starts.py keeps them in the first start (systemd's Started line does not open a start after lines with no
# event in them), and restart_time.from_log times "init" from the first timestamped line: 10,669 s of
# yesterday's traffic become the next restart's init (plain start: ~650 s in all).
def test_the_restart_estimate_ignores_the_previous_servers_tail(tmp_path: Path) -> None:
    host = "Dec 01 {t} ct200 {who}: "
    tail = [
        host.format(t="07:02:11", who="python3[4700]")
        + "[2026-12-01 07:02:11.001 TP0] Decode batch, #running-req: 3, #token: 5210, token usage: 0.05, cuda graph: True, gen throughput (token/s): 95.31, #queue-req: 0",
        host.format(t="07:02:12", who="python3[4700]")
        + '[2026-12-01 07:02:12.410] INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        host.format(t="09:59:50", who="systemd[1]") + "Stopping sglang.service - SGLang...",
        host.format(t="09:59:55", who="systemd[1]") + "sglang.service: Deactivated successfully.",
        host.format(t="09:59:55", who="systemd[1]") + "Stopped sglang.service - SGLang.",
        host.format(t="09:59:56", who="systemd[1]") + "Started sglang.service - SGLang.",
    ]
    start = [host.format(t="10:00:00", who="python3[4800]") + line for line in GOOD]
    log = write(tmp_path, "\n".join([*tail, *start]) + "\n")
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "32k", "--json", "--from-log", log
    )
    assert code in (0, 5), stderr
    parts = json.loads(stdout)["restart_estimate_parts"]
    assert parts["init"] < 60, parts


# --- The effective configuration is what is sized --------------------------------------------------------------


# HIGH (OOM under load at the planned ceiling): --set enable-symm-mem=true makes SGLang 0.5.23 set
# SGLANG_SYMM_MEM_PREALLOC_GB_SIZE=4 (arg_groups/memory_hook.py:349-354) and pre-allocate 4 GiB per GPU after the
# pool and the CUDA graphs (model_executor/model_runner_components/cuda_graph_setup.py:461 ->
# distributed/device_communicators/pynccl_allocator.py:510-536), out of the (1 - f) the floor is meant to keep
# free. The plan sizes the flag as if it cost nothing: same "memory left per GPU" (9.54 GiB) and the same
# ceiling (0.922, where the 4.0 GiB floor is exactly what the prealloc takes).
def test_symmetric_memory_prealloc_is_sized(tmp_path: Path) -> None:
    (tmp_path / "l70.toml").write_text(LLAMA70_TOML, encoding="utf-8")

    def planned(*argv: str) -> dict[str, object]:
        code, stdout, stderr = cli(tmp_path, "plan", "l70", "--context", "128k", "--offline", "--json", *argv)
        assert code in (0, 5), stderr
        return dict(json.loads(stdout))

    plain, symm = planned(), planned("--set", "enable-symm-mem=true")
    assert plain["mem_fraction_static"] == symm["mem_fraction_static"] == 0.85
    left = (float(str(plain["reserve_gib_per_gpu"])), float(str(symm["reserve_gib_per_gpu"])))
    assert left[1] <= left[0] - 4.0 + 0.01, left


# HIGH (wrong verdict, then a wasted restart on apply): a TP size that does not divide the model's heads is
# planned "feasible" and rendered, but SGLang 0.5.23 asserts in the model's constructor and never starts
# (models/llama.py:183 `total_num_heads % tp_size == 0`, :189 `total_num_kv_heads % tp_size == 0` when there
# are at least as many KV heads as ranks; Qwen2/Qwen3 the same). Llama-3.1-70B: 64 heads, 8 KV heads; TP 6.
def test_a_tp_size_that_does_not_divide_the_heads_is_not_feasible_facts() -> None:
    doc = facts("llama-3.1-70b", H100, 8, 141, tp_size=6)
    plan = plan_from_facts(parse_facts(doc, name="x"), Target(32768))
    assert not plan.feasible or plan.refusals


def test_a_set_tp_size_that_does_not_divide_the_kv_heads_is_not_feasible_cli(tmp_path: Path) -> None:
    (tmp_path / "l70.toml").write_text(LLAMA70_TOML, encoding="utf-8")
    code, stdout, _ = cli(
        tmp_path, "plan", "l70", "--context", "128k", "--offline", "--json", "--set", "tp-size=6"
    )
    assert code != 0 or not json.loads(stdout)["feasible"]


# --- Never shrink a running pool that holds the target without saying so -------------------------------------


def ran_at_093() -> list[str]:
    """The shipped ct200 start as it runs at 0.93 (the unit was edited on the host; the inventory still says
    0.85): the pool takes the extra 0.08 x 95.6 GiB, 226,588 tokens, and the memory after it is that much less."""
    swap = {
        "'mem_fraction_static': 0.85": "'mem_fraction_static': 0.93",
        "#tokens: 101134": "#tokens: 226588",
        "max_total_num_tokens=101134": "max_total_num_tokens=226588",
        "KV size: 6.62 GB": "KV size: 14.83 GB",
        "Memory pool end. avail mem=13.90": "Memory pool end. avail mem=6.25",
        "avail mem=12.50": "avail mem=4.85",
        "available_gpu_mem=12.50": "available_gpu_mem=4.85",
    }
    out = []
    for line in GOOD:
        for old, new in swap.items():
            line = line.replace(old, new)
        out.append(line)
    return out


# MEDIUM (a shrink not said): `plan --offline --from-log` reads a start that ran at 0.93 with 226,588 tokens
# (it holds the 100k target) and plans the inventory's 0.85: 111,559 tokens, half the pool that ran, with no
# SHRINKS headline and no word that the start ran at another fraction than the inventory's. choose._shrinks
# compares against the inventory's fraction, not the one the evidence start ran at.
def test_a_pool_that_ran_bigger_than_the_inventory_says_is_not_shrunk_silently(tmp_path: Path) -> None:
    log = write(tmp_path, "\n".join(ran_at_093()) + "\n")
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "100k", "--json", "--from-log", log
    )
    assert code in (0, 5), stderr
    p = json.loads(stdout)
    assert p["basis"] == "calibrated" and p["feasible"]
    assert p["mem_fraction_static"] >= 0.93 or p.get("shrinks"), (
        p["mem_fraction_static"],
        p["predicted_pool_tokens"],
    )


# LOW (one typed object): plan --json prints a --set max-total-tokens as the string "900000" while every other
# numeric --set flag (chunked-prefill-size, page-size, tp-size) is printed as a number.
def test_plan_json_types_max_total_tokens_like_the_other_numeric_flags(tmp_path: Path) -> None:
    (tmp_path / "l70.toml").write_text(LLAMA70_TOML, encoding="utf-8")
    code, stdout, stderr = cli(
        tmp_path, "plan", "l70", "--context", "128k", "--offline", "--json",
        "--set", "max-total-tokens=900000", "--set", "chunked-prefill-size=4096",
    )  # fmt: skip
    assert code in (0, 5), stderr
    flags = json.loads(stdout)["flags"]
    assert flags["chunked-prefill-size"] == 4096
    assert flags["max-total-tokens"] == 900000, flags


# --- Nothing rendered that was not sized ----------------------------------------------------------------------


# MEDIUM: the planner drops every spelling of a flag a --set replaces (plan/effective.py), but the renderer
# merges by the literal key (render.py effective_flags), so a unit whose inventory says
# `tensor-parallel-size = 8` and a `--set tp-size=4` renders BOTH `--tensor-parallel-size 8` and `--tp-size 4`
# (apply too: apply.prepare renders plan.flags() over the unmerged host). The unit runs TP 4 only because
# argparse keeps the last one; flagrules.canonical_flags refuses exactly this ("SGLang would run whichever
# comes last") when a person writes it.
def test_a_set_flag_replaces_every_spelling_in_the_rendered_unit(tmp_path: Path) -> None:
    toml = LLAMA70_TOML.replace("tp-size = 8", "tensor-parallel-size = 8")
    (tmp_path / "l70.toml").write_text(toml, encoding="utf-8")
    code, stdout, stderr = cli(tmp_path, "render", "l70", "--context", "128k", "--set", "tp-size=4")
    assert code == 0, stderr
    assert "--tp-size 4" in stdout
    assert "--tensor-parallel-size" not in stdout, [
        ln for ln in stdout.splitlines() if "parallel" in ln or "tp" in ln
    ]


# LOW (a valid unit refused): SGLang 0.5.23 reads --max-total-tokens with human_readable_int
# (srt/arg_groups/fields/schedule.py:39-50; deployctl's own table says human_int), so `100k` is 100,000 tokens;
# the planner refuses it: "--max-total-tokens '100k' is not an integer".
def test_max_total_tokens_is_read_as_sglang_reads_it(tmp_path: Path) -> None:
    (tmp_path / "l70.toml").write_text(LLAMA70_TOML, encoding="utf-8")
    code, stdout, stderr = cli(
        tmp_path, "plan", "l70", "--context", "32k", "--offline", "--json", "--set", "max-total-tokens=100k"
    )
    assert code in (0, 5), stderr
    assert json.loads(stdout)["predicted_pool_tokens"] == 100_000
