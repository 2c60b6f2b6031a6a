"""Calibrate only on a start of this model: another architecture, TP or PP is refused; another KV dtype
calibrates with its cell scaled, and the plan says so."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from agent.plan.startcheck import Planned, StartIdentity, identity, refusal
from tests.pure.test_plan_cmd import HOST_TOML, START_LOG

ARGS = (
    "[2026-12-01 09:59:59] server_args=ServerArgs(model_path='{path}', tp_size={tp}, pp_size=1, "
    "kv_cache_dtype='{kv}')\n"
)
LLAMA = START_LOG.replace("KimiK25ForConditionalGeneration", "LlamaForCausalLM")


def run_plan(tmp_path: Path, log: str, *argv: str) -> tuple[int, str, str]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / "ct200.toml").write_text(HOST_TOML, encoding="utf-8")
    path = tmp_path / "start.log"
    path.write_text(log, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(tmp_path / "units"), "plan", "ct200", "--context", "200k", "--json",
                 "--from-log", str(path), *argv], out)  # fmt: skip
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


@pytest.mark.parametrize(
    ("log", "says"),
    [
        (
            ARGS.format(path="/models/Llama-3.1-8B", tp=8, kv="auto") + LLAMA,
            "a start of /models/Llama-3.1-8B",
        ),
        (
            ARGS.format(path="/models/Kimi-K2.6", tp=4, kv="auto") + START_LOG,
            "tensor parallel 4; the plan is for 8",
        ),
        (
            ARGS.format(path="/models/Kimi-K2.6", tp=8, kv="auto")
            + START_LOG.replace("avail mem=92.80 GB", "avail mem=137.29 GB"),
            "a start on other GPUs",
        ),
    ],
)
def test_a_start_of_another_model_or_layout_is_refused(tmp_path: Path, log: str, says: str) -> None:
    """A Llama start on the Kimi host was accepted as "calibrated"."""
    code, stdout, stderr = run_plan(tmp_path, log)
    assert (code, stdout) == (ExitCode.USAGE, "")
    assert says in stderr.splitlines()[0] and "cannot calibrate" in stderr.splitlines()[0]


def test_a_start_of_this_host_that_set_moves_to_another_tp_is_set_aside_not_refused(tmp_path: Path) -> None:
    """The start ran the unit as it is (TP 8); --set tp-size=16 plans another layout: the start cannot
    calibrate it, but it is this host's, so the plan goes on cold and says why (was: exit 2)."""
    log = ARGS.format(path="/models/Kimi-K2.6", tp=8, kv="auto") + START_LOG
    code, stdout, stderr = run_plan(tmp_path, log, "--set", "tp-size=16")
    assert code in (ExitCode.OK, ExitCode.NOT_FEASIBLE), stderr
    plan = json.loads(stdout)
    assert plan["basis"] != "calibrated"
    assert any("tensor parallel 8; the plan is for 16" in w for w in plan["warnings"]), plan["warnings"]
    # a start at another TP than the unit runs is still another layout's: refused
    log4 = ARGS.format(path="/models/Kimi-K2.6", tp=4, kv="auto") + START_LOG
    assert run_plan(tmp_path, log4, "--set", "tp-size=16")[0] == ExitCode.USAGE


def test_a_start_with_another_kv_dtype_calibrates_and_says_so(tmp_path: Path) -> None:
    # Was: set aside ("the earlier start ran --kv-cache-dtype auto, the plan is for fp8_e4m3"), the plan cold.
    # Issue 30 item 1: its memory is kept and its measured cell scaled by the architecture's ratio.
    log = ARGS.format(path="/models/Kimi-K2.6", tp=8, kv="auto") + START_LOG
    code, stdout, _ = run_plan(tmp_path, log, "--set", "kv-cache-dtype=fp8_e4m3")
    plan = json.loads(stdout)
    assert code == 0 and plan["basis"] == "calibrated"
    assert plan["evidence"] == ["the cell scaled from a start at --kv-cache-dtype auto"]
    code, stdout, _ = run_plan(tmp_path, log)
    assert code == 0 and json.loads(stdout)["basis"] == "calibrated"


def test_the_architecture_is_the_targets_type() -> None:
    """The target's `Load weight end` comes first; the draft's (DFlash2DraftModel) does not count."""
    start = identity(START_LOG.splitlines())
    assert start.architecture == "KimiK25ForConditionalGeneration"
    kimi = Planned("KimiK25ForConditionalGeneration", "/m", 8, 1, "auto")
    assert refusal(start, kimi) is None
    assert "not of this host's DeepseekV3ForCausalLM" in str(
        refusal(start, Planned("DeepseekV3ForCausalLM", "/m", 8, 1, "auto"))
    )
    assert refusal(StartIdentity(), kimi) is None  # a log that does not say is not refused


def test_a_start_on_bigger_cards_is_refused() -> None:
    """An H200 start (137.29 GiB free before the weights) cannot calibrate a plan for 95.6 GiB cards."""
    h200 = START_LOG.replace("avail mem=92.80 GB", "avail mem=137.29 GB")
    start = identity(h200.splitlines())
    assert start.pre_gib == 137.29
    kimi = Planned("KimiK25ForConditionalGeneration", "/m", 8, 1, "auto", 95.6)
    assert "137.29 GiB free per GPU before the weights, more than this host's 95.6 GiB" in str(
        refusal(start, kimi)
    )
    assert refusal(identity(START_LOG.splitlines()), kimi) is None  # the host's own cards


def _drafts(line: str) -> bool:
    """The draft's load: its begin line (after the target's 22.32 GB) and its end line."""
    return "DFlash" in line or line.endswith("Load weight begin. avail mem=22.32 GB")


# ct200's start at 0.85 had it run without its DFLASH draft: the target's weights only (no second load),
# and the pool at MLA's own 70,272 B per token (61 layers x (512 + 64) x 2 B): 8.40 GiB = 128,350 tokens.
NO_DRAFT_LOG = (
    "[2026-12-01 09:59:59] server_args=ServerArgs(model_path='/models/Kimi-K2.6', tp_size=8, pp_size=1, "
    "kv_cache_dtype='auto', page_size=1, speculative_algorithm=None, mem_fraction_static=0.85)\n"
    + "".join(line + "\n" for line in START_LOG.splitlines() if not _drafts(line))
    .replace("#tokens: 101134, KV size: 6.62 GB", "#tokens: 128350, KV size: 8.40 GB")
    .replace("avail mem=13.90 GB", "avail mem=13.92 GB")
    .replace("max_total_num_tokens=101134", "max_total_num_tokens=128350")
    .replace("available_gpu_mem=12.50 GB", "available_gpu_mem=12.52 GB")
)


# The same start as SGLang 0.5.23 logs its arguments (entrypoints/engine.py: a dict), and one that ran NGRAM,
# which loads no draft model.
DICT_FORM = NO_DRAFT_LOG.replace(
    "server_args=ServerArgs(model_path='/models/Kimi-K2.6', tp_size=8, pp_size=1, kv_cache_dtype='auto', "
    "page_size=1, speculative_algorithm=None, mem_fraction_static=0.85)",
    "server_args={'model_path': '/models/Kimi-K2.6', 'tp_size': 8, 'pp_size': 1, 'kv_cache_dtype': 'auto', "
    "'page_size': 1, 'speculative_algorithm': None, 'mem_fraction_static': 0.85}",
)
NGRAM = NO_DRAFT_LOG.replace("speculative_algorithm=None", "speculative_algorithm='NGRAM'")


def test_the_real_0_5_23_server_args_line_is_read() -> None:
    # Was: only the `ServerArgs(...)` repr was read, so a 0.5.23 start said nothing of its model, TP or flags.
    real = (Path(__file__).parents[1] / "data" / "sglang-real-cpu-stop.log").read_text(encoding="utf-8")
    start = identity(real.splitlines())
    assert (start.tp, start.pp, start.kv_dtype) == (1, 1, "auto")
    assert start.model_path == "/root/.cache/deployctl/real-sglang-tiny-model"
    assert start.cell_flags == (("page-size", "1"), ("speculative-algorithm", None))
    assert identity(DICT_FORM.splitlines()) == identity(NO_DRAFT_LOG.splitlines())
    # what changes the runtime's need after the pool: this CPU start's decode graphs were off as SGLang
    # resolved them (cuda_graph_config), though no flag turned them off
    assert dict(start.runtime_flags) == {
        "disable-cuda-graph": None,
        "cuda-graph-backend-decode": "disabled",
        "moe-a2a-backend": "none",
        "deepep-mode": "auto",
    }


@pytest.mark.parametrize("log", [NO_DRAFT_LOG, DICT_FORM, NGRAM], ids=["repr", "dict", "ngram"])
def test_a_start_without_the_draft_plans_the_pool_the_draft_leaves(tmp_path: Path, log: str) -> None:
    # Was: the start taken as one with the draft, its 70,272 B cell and the memory without the draft's 1.20
    # GiB calibrating the DFLASH plan: about 18 % over at 0.92, a restart and a failed gate (8.8 % for a
    # start that ran NGRAM, taken for one that had loaded a draft).
    _, out, err = run_plan(tmp_path, log, "--mem-fraction-static", "0.92")
    plan = json.loads(out)
    assert plan["basis"] == "calibrated", err
    # the seed start (with its draft) predicts 192,406 at 0.92: the same host, the same pool
    assert abs(plan["predicted_pool_tokens"] - 192_406) / 192_406 < 0.005, plan["predicted_pool_tokens"]
    assert plan["evidence"][0].startswith("the cell scaled from a start at --speculative-algorithm ")
    assert any(
        "the start ran without a draft: the DFLASH draft's 1.20 GiB per GPU" in n for n in plan["notes"]
    )


@pytest.mark.parametrize("log", [NO_DRAFT_LOG, DICT_FORM], ids=["repr", "dict"])
def test_a_draft_added_since_the_start_brings_graphs_the_floor_counts_again(log: str) -> None:
    # ct200's facts (its config.json gives the shapes) with a last start that ran without the draft: its
    # measured need holds no draft graphs, so the floor keeps the cold graph part; the draft's own start does.
    from agent.plan.choose import Target
    from agent.plan.facts import parse_facts
    from agent.plan.from_facts import plan_from_facts

    doc = json.loads((Path(__file__).parents[2] / "examples" / "ct200.json").read_text(encoding="utf-8"))
    with_draft = plan_from_facts(parse_facts(doc), Target(200_000, 0.92))
    without = plan_from_facts(parse_facts({**doc, "last_start": log}), Target(200_000, 0.92))
    floors = [next(n for n in p.notes if n.startswith("the memory floor is")) for p in (with_draft, without)]
    assert "CUDA graphs" not in floors[0] and "CUDA graphs" in floors[1]
    assert without.reserve_floor_gib > with_draft.reserve_floor_gib
    assert abs(without.predicted_pool_tokens - with_draft.predicted_pool_tokens) / 192_406 < 0.005
