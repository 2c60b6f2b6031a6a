"""The simulated SGLang server's pool arithmetic: the seed's three pools, fp8, GQA, no memory left."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))

from sglang import sizing as sz
from sglang.launch_server import build_parser, human_readable_int

CT200 = sz.hardware_from_env({})
V23 = (0, 5, 23)


def ct200_pool(fraction: float, version: tuple[int, int, int] = V23, kv: str = "auto") -> int:
    """The pool the simulated ct200 sizes for Kimi K2.6 + DFLASH at TP 8."""
    elem = sz.kv_elem(kv, "bfloat16")
    cell = sz.sizing_cell(version, sz.KIMI_K26, sz.Speculation("DFLASH", sz.DFLASH_DRAFT), 8, elem)
    post = CT200.pre_gib - CT200.weights_gib - CT200.draft_weights_gib
    return sz.pool_tokens(CT200.pre_gib, post, fraction, cell).tokens


@pytest.mark.parametrize(("fraction", "seed"), [(0.85, 101_134), (0.92, 192_406), (0.94, 218_484)])
def test_ct200_reproduces_the_seed_pools(fraction: float, seed: int) -> None:
    assert abs(ct200_pool(fraction) - seed) <= 3


def test_ct200_logs_the_seed_memory_figures() -> None:
    post = CT200.pre_gib - CT200.weights_gib - CT200.draft_weights_gib
    assert f"{CT200.pre_gib:.2f}" == "92.80"
    assert f"{post:.2f}" == "21.12"


def test_cells_are_mla_plus_the_exact_dflash_draft_term() -> None:
    assert sz.cell_bytes(sz.KIMI_K26, 8, 2) == 70_272
    assert sz.cell_bytes(sz.DFLASH_DRAFT, 8, 2) == 6_144
    assert sz.sizing_cell(V23, sz.KIMI_K26, sz.Speculation("DFLASH", sz.DFLASH_DRAFT), 8, 2) == 76_416
    # 0.5.11-0.5.16 scale the target by its layers instead: 576 x (61 + 3) x 2
    assert sz.sizing_cell((0, 5, 16), sz.KIMI_K26, sz.Speculation("DFLASH", sz.DFLASH_DRAFT), 8, 2) == 73_728


def test_pool_grows_13039_tokens_per_hundredth() -> None:
    assert abs((ct200_pool(0.94) - ct200_pool(0.92)) / 2 - 13_039) <= 2


def test_fp8_kv_halves_the_cell_and_doubles_the_pool() -> None:
    assert sz.cell_bytes(sz.KIMI_K26, 8, sz.kv_elem("fp8_e4m3", "bfloat16")) == 35_136
    assert abs(ct200_pool(0.85, kv="fp8_e4m3") - 2 * ct200_pool(0.85)) <= 2


def test_gqa_cell_shards_kv_heads_over_tp() -> None:
    llama70b = sz.arch_from_config(
        {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80, "num_attention_heads": 64,
         "num_key_value_heads": 8, "hidden_size": 8192, "max_position_embeddings": 131072},
        sz.KIMI_K26,
    )  # fmt: skip
    assert not llama70b.mla
    assert llama70b.head_dim == 128
    assert sz.cell_bytes(llama70b, 8, 2) == 1 * 256 * 80 * 2
    assert sz.cell_bytes(llama70b, 2, 2) == 4 * 256 * 80 * 2
    assert sz.cell_bytes(llama70b, 16, 2) == 1 * 256 * 80 * 2  # never below one head per rank


def test_gqa_pool_from_the_formula() -> None:
    pool = sz.pool_tokens(pre=76.0, post=60.0, fraction=0.9, cell=163_840, paging=sz.Paging(page=16))
    assert pool.tokens == (int((60.0 - 7.6) * sz.GIB / 163_840) // 16) * 16
    assert pool.tokens % 16 == 0


def test_max_total_tokens_only_lowers_the_pool() -> None:
    lower = sz.pool_tokens(92.8, 21.12, 0.94, 76_416, sz.Paging(cap=150_000))
    higher = sz.pool_tokens(92.8, 21.12, 0.94, 76_416, sz.Paging(cap=500_000))
    assert (lower.tokens, lower.cap_ignored) == (150_000, False)
    assert higher.tokens == higher.profiled and higher.cap_ignored


def test_no_memory_left_names_the_minimum_fraction() -> None:
    with pytest.raises(sz.NoKvMemory) as caught:
        sz.pool_tokens(92.8, 21.12, 0.70, 76_416)
    assert caught.value.min_fraction == pytest.approx(1 - 21.12 / 92.8)
    with pytest.raises(sz.NoKvMemory):
        sz.pool_tokens(92.8, 21.12, 1 - 21.12 / 92.8, 76_416)


def test_default_fraction_matches_the_documented_kimi_values() -> None:
    k26 = sz.default_fraction(V23, CT200, sz.KIMI_K26, sz.FractionArgs(8, None, 8192, 512))
    assert k26 == pytest.approx(0.833 * sz.VLM_FACTOR)
    assert sz.default_fraction((0, 4, 6), CT200, sz.KIMI_K26, sz.FractionArgs(8, None, 8192, 512)) == 0.88


def test_smaller_max_running_requests_leaves_more_graph_memory() -> None:
    assert sz.graph_gib(CT200, 8, False) < sz.graph_gib(CT200, 64, False) < sz.graph_gib(CT200, 512, False)
    assert sz.graph_gib(CT200, 64, True) == 0.0


def test_context_length_accepts_human_readable_counts_from_0_5_10() -> None:
    assert human_readable_int("200k") == 200_000
    assert human_readable_int("256Ki") == 262_144
    new = build_parser(V23).parse_args(["--model-path", "m", "--context-length", "200k", "--tp", "8"])
    assert (new.context_length, new.tp_size) == (200_000, 8)
    with pytest.raises(SystemExit) as caught:
        build_parser((0, 4, 6)).parse_args(["--model-path", "m", "--context-length", "200k"])
    assert caught.value.code == 2


def test_cuda_graph_max_bs_is_an_ambiguous_prefix_from_0_5_20() -> None:
    assert (
        build_parser((0, 5, 10))
        .parse_args(["--model-path", "m", "--cuda-graph-max-bs", "8"])
        .cuda_graph_max_bs
        == 8
    )
    with pytest.raises(SystemExit):
        build_parser(V23).parse_args(["--model-path", "m", "--cuda-graph-max-bs", "8"])


def test_the_simulator_imports_only_the_stdlib() -> None:
    """It runs on a bare Debian python3, and it must not share code with the planner it checks."""
    for module in sorted((Path(__file__).resolve().parents[1] / "sim" / "sglang").glob("*.py")):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names | {"__future__"}, (
                    f"{module.name}: {name}"
                )
