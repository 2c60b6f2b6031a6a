"""A second newcomer's hour with the planner: public configs, start logs, ordinary --set flags.

Each test states what a user reading README.md, docs/ and --help would rightly expect, and fails on what
deployctl says today. Facts files are written by hand from the models' published config.json; logs follow
the format of examples/ct200-start.log and the journal, docker and kubectl prefixes docs/planning.md names.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "units"
MODELS = ROOT / "tests/data/models"
CT200_LOG = ROOT / "examples/ct200-start.log"
NO_DRAFT = ("--set", "speculative-algorithm=false")

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0"}
RTX4090 = {"name": "NVIDIA GeForce RTX 4090", "memory_total_mib": 24564, "compute_capability": "8.9"}

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json (hybrid: one full-attention layer in four)
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_num_value_heads": 32,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "intermediate_size": 5120,
    "vocab_size": 151936,
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def model_config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return config


def write_facts(
    tmp: Path,
    config: dict[str, Any],
    cards: tuple[dict[str, Any], int],
    weights_bytes: int,
    flags: dict[str, Any],
) -> str:
    gpu, n = cards
    facts = {
        "format": "deployctl-facts/1",
        "gpus": [dict(gpu) for _ in range(n)],
        "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": weights_bytes, "path": "/models/m"},
        "draft": None,
        "flags": flags,
        "env": {},
        "last_start": None,
    }
    path = tmp / "facts.json"
    path.write_text(json.dumps(facts))
    return str(path)


def run_cli(*argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(UNITS), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def plan_json(*argv: str) -> dict[str, Any]:
    code, stdout, stderr = run_cli("plan", *argv, "--json")
    assert code in (ExitCode.OK, ExitCode.NOT_FEASIBLE), stderr
    plan: dict[str, Any] = json.loads(stdout)
    return plan


def because(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("because"))


# 1. One plan prints two ceilings for the same floor: the note says "do not push the fraction above 0.881",
#    the chart's legend under it "memory floor: above 0.882 less than 8.7 GiB stays free". A user who sets
#    0.882 by the chart is told by the note it breaks the floor. Seen on most facts files (Llama 3.1 70B,
#    Qwen3-32B, DeepSeek V3, Mixtral, gpt-oss, ...); ct200's own example happens to agree.


def test_the_note_and_the_chart_name_the_same_highest_safe_fraction(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("llama-3.1-70b"), (H100, 4), 141_107_412_992, {"tp-size": 4})
    _, out, _ = run_cli("plan", "--facts", facts, "--context", "32k", "--shrink-context")
    note = re.search(r"do not push the fraction above (\d\.\d+)", out)
    chart = re.search(r"memory floor: above (\d\.\d+)", out)
    assert note and chart, out
    assert note[1] == chart[1], (note[0], chart[0])


# 2. Qwen3-32B (65.5 GB of bf16 weights) on one 24 GiB RTX 4090 at 128k: the weights cannot load, yet the
#    `because` line names the context refusal and offers the YaRN override; following it, the user meets the
#    weights next. docs/planning.md lists "weights that do not fit" among the constraints the line names, and
#    the same plan on four H100s of Kimi K2 does name it ("the weights do not fit: about 239.8 GiB per GPU").


def test_weights_that_cannot_load_are_what_binds_before_the_context(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("qwen3-32b"), (RTX4090, 1), 65_524_246_528, {})
    code, out, _ = run_cli("plan", "--facts", facts, "--context", "128k")
    assert code == ExitCode.NOT_FEASIBLE
    assert "weights do not fit" in because(out), because(out)


# 3. A cold plan with `--set speculative-algorithm=false` drops the draft's KV from the cell (76,416 -> 70,272
#    B/token) but keeps the draft's 1.20 GiB of weights per GPU in its memory (post 20.93 GiB either way;
#    note: "weights 70.48 GiB per GPU + draft 1.20 GiB"). The calibrated plan of the same change gives them
#    back (post 21.12 -> 22.32), as docs/planning.md says a dropped draft does.


def test_a_cold_plan_gives_a_dropped_drafts_weights_back() -> None:
    base = plan_json("ct200", "--offline", "--context", "200k")
    dropped = plan_json("ct200", "--offline", "--context", "200k", *NO_DRAFT)
    assert dropped["post_gib"] == pytest.approx(base["post_gib"] + 1.20, abs=0.01), base["post_gib"]


def test_a_cold_plan_without_the_draft_does_not_count_its_weights() -> None:
    _, out, _ = run_cli("plan", "ct200", "--offline", "--context", "200k", *NO_DRAFT)
    cold = next(line for line in out.splitlines() if "cold estimate" in line)
    assert "draft" not in cold, cold


# 4. The text's flags line is where a user reads what the unit will get; `--set speculative-algorithm=false`
#    (docs/commands.md: "false leaves the flag out") removes the DFLASH draft, which --json's flags carry as
#    "speculative-algorithm": false, but the text's flags line says nothing of it.


def test_the_text_flags_line_shows_the_draft_removed() -> None:
    _, out, _ = run_cli("plan", "ct200", "--offline", "--context", "200k", *NO_DRAFT)
    flags = next(line for line in out.splitlines() if line.strip().startswith("flags"))
    assert "speculative-algorithm" in flags, flags


# 5. Calibrated on ct200's bf16 start with only the draft dropped, the note says the start ran "before
#    --kv-cache-dtype, --speculative-algorithm changed": the KV dtype did not change (auto, bf16 both).


def test_the_scaling_note_names_only_the_flag_that_changed() -> None:
    argv = ("--context", "200k", "--from-log", str(CT200_LOG), *NO_DRAFT)
    _, out, _ = run_cli("plan", "ct200", *argv)
    note = next(line for line in out.splitlines() if "the start ran before" in line)
    assert "--kv-cache-dtype" not in note, note


# 6. plan --json's cell_bytes is an integer (76416) except when the cell was scaled from a start, where it
#    becomes 70272.0: a consumer comparing or formatting it as an int breaks on one path only.


def test_json_cell_bytes_stays_an_integer_when_scaled() -> None:
    argv = ("--context", "200k", "--from-log", str(CT200_LOG), *NO_DRAFT)
    plan = plan_json("ct200", *argv)
    assert isinstance(plan["cell_bytes"], int), repr(plan["cell_bytes"])


# 7. On an inventory host, a --set error is reported under the inventory model's field path, "flags.tp: SGLang
#    0.5.23 has no flag --tp" (also "flags.kv-cache-dtype: ..."), where the same --set on a facts file says
#    "--set kv-cache-dtype: ...". The user wrote no "flags.tp": they wrote --set, and may look for it in the
#    inventory's [sglang.flags].


def test_a_bad_set_on_an_inventory_host_is_named_as_the_set_the_user_typed() -> None:
    code, _, err = run_cli("plan", "ct200", "--offline", "--context", "200k", "--set", "kv-cache-dtype=FP8")
    assert code == ExitCode.USAGE
    assert "--set kv-cache-dtype" in err and "flags.kv-cache-dtype" not in err, err


# 8. A journal in which systemd reports the service's end ("Main process exited, code=killed, status=9/KILL",
#    "Failed with result 'oom-kill'", or "code=exited, status=1/FAILURE") is read as a start "cut" with
#    "failure: none": docs/planning.md keeps "cut" for a start cut by the log's end, and the user is told
#    nothing failed when the kernel's OOM killer ended it during the weights' load.

LLAMA8B_START = """\
[2026-11-20 08:00:01] server_args=ServerArgs(model_path='/models/Llama-3.1-8B-Instruct', \
mem_fraction_static=0.83, tp_size=1, pp_size=1, kv_cache_dtype='auto', page_size=1)
[2026-11-20 08:00:03 TP0] Init torch distributed begin.
[2026-11-20 08:00:04 TP0] Init torch distributed ends. mem usage=0.00 GB
[2026-11-20 08:00:04 TP0] Load weight begin. avail mem=78.58 GB
Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:02<00:02,  1.10it/s]"""


def journal(lines: str, pid: int) -> list[str]:
    return [f"Nov 20 08:00:{i:02d} gpu1 python3[{pid}]: {line}" for i, line in enumerate(lines.splitlines())]


def test_a_start_the_kernel_killed_is_failed_not_cut(tmp_path: Path) -> None:
    log = tmp_path / "journal.log"
    lines = [
        "Nov 20 07:59:59 gpu1 systemd[1]: Starting sglang.service - SGLang server...",
        *journal(LLAMA8B_START, 1234),
        "Nov 20 08:00:30 gpu1 kernel: Out of memory: Killed process 1234 (python3) total-vm:120000000kB",
        "Nov 20 08:00:30 gpu1 systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL",
        "Nov 20 08:00:30 gpu1 systemd[1]: sglang.service: Failed with result 'oom-kill'.",
    ]
    log.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli("parse-log", str(log), "--json")
    assert code == ExitCode.OK, err
    assert json.loads(out)["failure"] is not None, out


def test_a_start_systemd_saw_exit_is_not_listed_as_cut(tmp_path: Path) -> None:
    log = tmp_path / "journal.log"
    lines = [
        "Nov 20 07:59:59 gpu1 systemd[1]: Starting sglang.service - SGLang server...",
        *journal(LLAMA8B_START, 1234),
        "Nov 20 08:00:31 gpu1 systemd[1]: sglang.service: Main process exited, code=exited, status=1/FAILURE",
        "Nov 20 08:00:31 gpu1 systemd[1]: sglang.service: Failed with result 'exit-code'.",
    ]
    log.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli("parse-log", str(log))
    assert code == ExitCode.OK, err
    start = next(line for line in out.splitlines() if line.startswith("start:"))
    assert "cut" not in start, out


# 9. Qwen3-Next-80B-A3B (163 GB of bf16 weights) on 2 x H100 leaves no pool at the floor's fraction, and
#    the plan lists "fp8 KV cache ... at --mem-fraction-static 0.922 the pool is about 0 tokens (still short
#    of the target)": an alternative that closes none of the gap (docs/planning.md: "listed only when they
#    reach the target or close at least half of the gap").


def test_no_fp8_alternative_that_holds_no_pool(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, QWEN3_NEXT, (H100, 2), 163_000_000_000, {"tp-size": 2})
    plan = plan_json("--facts", facts, "--context", "128k")
    assert plan["predicted_pool_tokens"] == 0
    fp8 = [a for a in plan["alternatives"] if "kv-cache-dtype" in a["flags"]]
    assert all(a["predicted_pool_tokens"] > 0 for a in fp8), fp8


# 10. The restart estimate from ct200's own start says "pool 42.9" s: the time from the target's `Load weight
#     end` (10:09:00.117) to the first graph line (10:09:43.001), which holds the DFLASH draft's own load
#     (10:09:30.002 to 10:09:40.310: weights) and a 30 s wait before it; the KV pool itself was allocated in
#     about a second (10:09:40.310 to 10:09:41.205). A user reading "pool 42.9" looks for a slow allocation.


def test_the_drafts_weight_load_is_not_counted_as_pool_time() -> None:
    plan = plan_json("ct200", "--context", "200k", "--from-log", str(CT200_LOG))
    parts = plan["restart_estimate_parts"]
    assert parts["pool"] < 5.0, parts


# 11. The YaRN override the `because` line offers, given back with --set, is printed on the flags line
#     unquoted (`--json-model-override-args {"rope_scaling": {...}, ...}`): the one line a user copies into a
#     shell or a unit splits at its spaces and loses its quotes.

YARN_7X = (
    'json-model-override-args={"rope_scaling": {"rope_type": "yarn", "factor": 7.0, '
    '"original_max_position_embeddings": 32768}, "max_position_embeddings": 229376}'
)


def test_the_flags_line_quotes_a_json_value(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("qwen3-32b"), (H100, 2), 65_524_246_528, {"tp-size": 2})
    _, out, _ = run_cli("plan", "--facts", facts, "--context", "200k", "--set", YARN_7X)
    flags = next(line for line in out.splitlines() if line.strip().startswith("flags"))
    assert "--json-model-override-args '{" in flags, flags


# 12. A bad value inside --set json-model-override-args is blamed on the facts file's config.json
#     ("q3.json: config.json: max_position_embeddings = 'abc' is not a number"): the user's config.json is
#     fine; the override they typed is not.


def test_a_bad_override_value_is_blamed_on_the_override(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("qwen3-32b"), (H100, 2), 65_524_246_528, {"tp-size": 2})
    bad = 'json-model-override-args={"max_position_embeddings": "abc"}'
    code, _, err = run_cli("plan", "--facts", facts, "--context", "32k", "--set", bad)
    assert code == ExitCode.USAGE
    assert "json-model-override-args" in err, err


# 13. A facts file with three H100 80GB and one A100 40GB: the plan sizes from the 40 GiB card (as SGLang
#     takes the minimum over ranks), yet its sources note says "gpus (4 x NVIDIA H100 80GB HBM3)" and nothing
#     warns that the cards differ: the user cannot tell why an H100 plan holds 13,039 tokens.

A100_40 = {"name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960, "compute_capability": "8.0"}


def test_mixed_cards_are_not_reported_as_four_of_the_first(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("llama-3.1-70b"), (H100, 3), 141_107_412_992, {"tp-size": 4})
    data = json.loads(Path(facts).read_text())
    data["gpus"].append(A100_40)
    Path(facts).write_text(json.dumps(data))
    _, out, _ = run_cli("plan", "--facts", facts, "--context", "100k")
    assert "4 x NVIDIA H100" not in out, [ln for ln in out.splitlines() if "gpus" in ln]
    assert "A100" in out


# 14. A facts file whose flags keep their dashes ({"--tp-size": 4}, as a unit's ExecStart= spells them) is
#     refused with "SGLang 0.5.23 has no flag ----tp-size; did you mean --tp-size ...?": the user wrote
#     --tp-size, is told it does not exist, and is offered what they wrote.


def test_a_dashed_flag_name_in_facts_is_explained(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("llama-3.1-70b"), (H100, 4), 141_107_412_992, {"--tp-size": 4})
    code, _, err = run_cli("plan", "--facts", facts, "--context", "100k")
    assert code == ExitCode.USAGE
    assert "----tp-size" not in err, err


# 15. `--set kv-cache-dtype=nvfp4` on 8 x H200 (compute capability 9.0) for DeepSeek V3 plans "feasible"
#     with a pool of 2,262,916 tokens; SGLang 0.5.23 raises before any pool is sized on a CUDA GPU that is
#     neither SM100 nor SM120 (arg_groups/kv_cache_hook.py:125-131: "--kv-cache-dtype=nvfp4 requires
#     Blackwell SM100 or SM120"). The planner refuses mxfp8 on the same card ("requires an SM100+ GPU").

H200 = {"name": "NVIDIA H200", "memory_total_mib": 143771, "compute_capability": "9.0"}


def test_nvfp4_kv_on_hopper_is_not_feasible(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("deepseek-v3"), (H200, 8), 688_586_727_424, {"tp-size": 8})
    code, out, _ = run_cli("plan", "--facts", facts, "--context", "128k", "--set", "kv-cache-dtype=nvfp4")
    assert code in (ExitCode.USAGE, ExitCode.NOT_FEASIBLE), out.splitlines()[:3]


# 16. With --attention-backend flashmla the plan sizes page 64, as SGLang does; add --page-size 16 and the
#     plan sizes page 16 ("mla pool, ... page 16"), though SGLang 0.5.23 overrides any page size to 64 for
#     FlashMLA (arg_groups/overrides.py:1143-1154 _mla_backend_page_constraints: "FlashMLA only supports a
#     page_size of 64, change page_size to 64"). A few tokens here, but the cell note names a page SGLang
#     will not use.


def test_flashmla_sizes_page_64_whatever_page_size_is_given(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("deepseek-v3"), (H200, 8), 688_586_727_424, {"tp-size": 8})
    flashmla = ("--set", "attention-backend=flashmla", "--set", "page-size=16")
    _, out, _ = run_cli("plan", "--facts", facts, "--context", "128k", *flashmla)
    cell = next(line for line in out.splitlines() if "mla pool," in line)
    assert "page 64" in cell, cell


# 17. docs/planning.md: each alternative "is one command away with --set FLAG=VALUE ... so its fraction, pool
#     and 'reaches the target' are what `plan --set ...` then says". Calibrated on ct200's start, the plan
#     offers "more GPUs (tensor parallel 16 instead of 8)"; the command it points at, the same plan with
#     `--set tp-size=16`, exits 2: "a start at tensor parallel 8; the plan is for 16: it cannot calibrate".


def test_the_more_gpus_alternative_of_a_calibrated_plan_is_one_command_away() -> None:
    argv = ("ct200", "--context", "300k", "--from-log", str(CT200_LOG))
    plan = plan_json(*argv)
    more = next(a for a in plan["alternatives"] if "tp-size" in a["flags"])
    tp = f"tp-size={more['flags']['tp-size']}"
    code, _, err = run_cli("plan", *argv, "--set", tp)
    assert code in (ExitCode.OK, ExitCode.NOT_FEASIBLE), err


#     Cold, on one RTX 4090, Llama 3.1 8B at 64k: "more GPUs (tensor parallel 2 instead of 1) ... at
#     --mem-fraction-static 0.698 the pool is about 136,135 tokens"; `plan --set tp-size=2` says 0.704 and
#     138,358 tokens.


def test_the_more_gpus_alternative_states_what_the_set_plan_says(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("llama-3.1-8b"), (RTX4090, 1), 16_060_522_496, {})
    plan = plan_json("--facts", facts, "--context", "64k")
    more = next(a for a in plan["alternatives"] if "tp-size" in a["flags"])
    replanned = plan_json(
        "--facts", facts, "--context", "64k", "--set", f"tp-size={more['flags']['tp-size']}"
    )
    got = (replanned["mem_fraction_static"], replanned["predicted_pool_tokens"])
    assert (more["mem_fraction_static"], more["predicted_pool_tokens"]) == got


# 18. `--set page-size=16` on Llama 3.1 70B puts "SHRINKS the pool from 403,870 tokens ... to 403,856" in the
#     headline, in capitals, for 14 tokens of page rounding (0.003 %); the same word warns of a fraction
#     lowered by tens of thousands of tokens, and the user cannot tell the two apart at a glance.


def test_page_rounding_is_not_headlined_as_a_shrunk_pool(tmp_path: Path) -> None:
    facts = write_facts(tmp_path, model_config("llama-3.1-70b"), (H100, 4), 141_107_412_992, {"tp-size": 4})
    _, out, _ = run_cli("plan", "--facts", facts, "--context", "100k", "--set", "page-size=16")
    assert "SHRINKS" not in out.splitlines()[0], out.splitlines()[0]
