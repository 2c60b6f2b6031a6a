"""Planning from a host's facts (deployctl-facts/1): every pool family SGLang 0.5.23 sizes, by its rules."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.errors import UsageError
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.predict import pool_model
from agent.sglang import kvpool, memory_defaults
from agent.sglang.kvlayout import read_layout
from agent.sglang.pools import Parallel
from tests.pure import facts_fixtures as cfg
from tests.pure.test_plan_cmd import START_LOG

H100 = ("NVIDIA H100 80GB HBM3", 81559, "9.0")
H20_96 = ("NVIDIA H20", 97871, None)
# The seed host's consistent figures (what the simulated host really does; test_planner.py).
TRUE_PRE, TRUE_POST, TRUE_CELL = 92.80, 21.1176, 70_272 + 6_144


def facts(
    config: dict[str, Any], gpu: tuple[str, int, str | None] = H100, n: int = 1, **kw: Any
) -> dict[str, Any]:
    card: dict[str, Any] = {"name": gpu[0], "memory_total_mib": gpu[1]}
    if gpu[2]:
        card["compute_capability"] = gpu[2]
    return {
        "format": "deployctl-facts/1", "gpus": [card] * n, "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": kw.pop("weights", None)}, "draft": kw.pop("draft", None),
        "flags": kw.pop("flags", {}), "env": kw.pop("env", {}), "last_start": kw.pop("last_start", None),
    }  # fmt: skip


def ct200(**over: Any) -> dict[str, Any]:
    doc = facts(
        cfg.KIMI_K26, H20_96, 8, weights=int(70.48 * 2**30 * 8),
        draft={"config": cfg.KIMI_DFLASH, "weights_bytes": int(1.2 * 2**30 * 8)},
        flags={"tp-size": 8, "mem-fraction-static": 0.85, "context-length": 32768, "max-running-requests": 64,
               "speculative-algorithm": "DFLASH"},
        env={"SGLANG_VLM_CACHE_SIZE_MB": "0"}, last_start=START_LOG,
    )  # fmt: skip
    doc.update(over)
    return doc


@pytest.mark.parametrize(("fraction", "measured"), [(0.92, 192_406), (0.94, 218_484)])
def test_ct200_calibrated_from_the_facts_within_0_1_percent(fraction: float, measured: int) -> None:
    fm = pool_model(parse_facts(ct200()), 200_000)
    assert fm.pool.basis == "calibrated" and fm.pool.cell_bytes == TRUE_CELL
    assert abs(fm.pool.pool(fraction) - measured) / measured < 0.001


def test_ct200_reaches_200k_in_one_restart_from_the_facts() -> None:
    p = plan_from_facts(parse_facts(ct200()), Target(200_000))
    assert p.feasible and p.basis == "calibrated"
    assert kvpool.pool_tokens(TRUE_PRE, TRUE_POST, p.mem_fraction_static, TRUE_CELL) >= 200_000


def test_ct200_with_the_multimodal_reservation_costs_1362_tokens_cold() -> None:
    # SGLang 0.5.23 reserves 0.1 GB for Kimi K2.6 (a VLM): 1,362 tokens on ct200 at the same memory.
    with_res = pool_model(parse_facts(ct200(env={}, last_start=None)), 200_000).pool
    without = pool_model(parse_facts(ct200(last_start=None)), 200_000).pool
    # 100 MB / 76,416 B = 1,372; the 1,362 compares SGLang's code with the logged (rounded) post.
    assert without.pool(0.85) - with_res.pool(0.85) == pytest.approx(1_362, rel=0.01)
    # Calibrated from a start, the reservation is part of what the start measured: predictions agree.
    cal = pool_model(parse_facts(ct200(env={})), 200_000).pool
    assert abs(cal.pool(0.92) - 192_406) / 192_406 < 0.001


def test_cold_ct200_still_reaches_200k_and_says_how_wide_the_margin_is() -> None:
    p = plan_from_facts(parse_facts(ct200(last_start=None)), Target(200_000))
    assert p.feasible and p.basis == "architecture"
    assert kvpool.pool_tokens(TRUE_PRE, TRUE_POST, p.mem_fraction_static, TRUE_CELL) >= 200_000
    assert any("-0.40 GiB margin" in n for n in p.notes)
    # The cold prediction at the seed's 0.85 is within 4 % of the logged pool (101,134).
    cold = pool_model(parse_facts(ct200(last_start=None)), 200_000).pool
    assert abs(cold.pool(0.85) / 101_134 - 1) < 0.04


def test_a_failed_start_still_calibrates_memory_before_and_after_the_weights() -> None:
    oom = "\n".join(START_LOG.splitlines()[:4]) + "\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    fm = pool_model(parse_facts(ct200(last_start=oom)), 200_000)
    assert fm.pool.basis == "calibrated" and (fm.pool.pre_gib, fm.pool.post_gib) == (92.80, 21.12)
    assert abs(fm.pool.pool(0.92) / 192_406 - 1) < 0.001


def cell(
    config: dict[str, Any], gpu: tuple[str, int, str | None] = H100, n: int = 1, **flags: Any
) -> tuple[float, int]:
    doc = facts(config, gpu, n, weights=10**9, flags={"tp-size": n, "mem-fraction-static": 0.88, **flags})
    pool = pool_model(parse_facts(doc), 32_768).pool
    return pool.cell_bytes, pool.page_size


def test_gqa_cell_over_attention_tp_and_replicated_beyond_the_heads() -> None:
    assert cell(cfg.LLAMA31_8B) == (8 * 256 * 32 * 2, 1)  # model_config.get_num_kv_heads
    assert cell(cfg.LLAMA31_8B, n=4)[0] == 2 * 256 * 32 * 2
    assert (
        cell(cfg.LLAMA31_8B, n=8)[0] == cell(cfg.LLAMA31_8B, n=16)[0] == 1 * 256 * 32 * 2
    )  # one head per GPU
    # attention DP 2 of TP 8: heads over attention TP 4
    assert cell(cfg.LLAMA31_8B, n=8, **{"attn-dp-size": 2})[0] == 2 * 256 * 32 * 2
    assert cell(cfg.LLAMA31_8B, **{"kv-cache-dtype": "fp8_e4m3"})[0] == 8 * 256 * 32
    b200 = ("NVIDIA B200", 183359, "10.0")
    assert cell(cfg.LLAMA31_8B, b200, **{"kv-cache-dtype": "mxfp8"}) == (
        8 * 256 * 32 + 8 * 256 * 32 // 32,
        64,
    )
    with pytest.raises(UsageError, match="mxfp8 requires an SM100"):  # SGLang refuses it before Blackwell
        cell(cfg.LLAMA31_8B, **{"kv-cache-dtype": "mxfp8"})


def test_sglang_refuses_fp16_kv_and_so_does_the_plan() -> None:
    with pytest.raises(UsageError, match="fp16"):
        cell(cfg.LLAMA31_8B, **{"kv-cache-dtype": "fp16"})


def test_dsa_indexer_row_layout_and_page_per_sm() -> None:
    # Hopper: auto -> bf16 (arg_groups/overrides.py), raw 576 x 2 B + indexer 132 B per layer, page 64.
    assert cell(cfg.DEEPSEEK_V32, ("NVIDIA H200", 143771, "9.0"), 8) == (61 * (576 * 2 + 132), 64)
    # Blackwell: auto -> fp8 with trtllm's raw row (576 B) + the indexer.
    assert cell(cfg.DEEPSEEK_V32, ("NVIDIA B200", 183359, "10.0"), 8) == (61 * (576 + 132), 64)
    # Hopper with fp8 asked: the scaled row, 512 + 16 scale bytes + 64 x 2 B rope = 656.
    assert cell(cfg.DEEPSEEK_V32, ("NVIDIA H200", 143771, "9.0"), 8, **{"kv-cache-dtype": "fp8_e4m3"})[
        0
    ] == 61 * (656 + 132)


def test_mla_is_not_divided_by_tp_and_nextn_scales_the_cell() -> None:
    one = cell(cfg.DEEPSEEK_V32, ("NVIDIA H200", 143771, "9.0"), 1)[0]
    assert cell(cfg.DEEPSEEK_V32, ("NVIDIA H200", 143771, "9.0"), 8)[0] == one
    mtp = cell(cfg.DEEPSEEK_V32, ("NVIDIA H200", 143771, "9.0"), 8, **{"speculative-algorithm": "NEXTN"})[0]
    assert mtp == one + int(61 * 576 * 2 * 1 / 61) + 132  # the latent scaled by 1/61 plus one indexer row


def test_sliding_window_hybrid_full_plus_ratio_times_sliding() -> None:
    per = 8 * 128 * 2 * 18  # gpt-oss: 8 KV heads of 64 (K and V), 18 full and 18 sliding layers
    assert cell(cfg.GPT_OSS_120B)[0] == pytest.approx(per + 0.8 * per)
    assert cell(cfg.GPT_OSS_120B, **{"swa-full-tokens-ratio": 0.5})[0] == pytest.approx(per * 1.5)
    assert cell(cfg.GPT_OSS_120B, **{"disable-hybrid-swa-memory": True})[0] == 2 * per


def test_gemma3_is_sized_as_full_attention_because_sglang_turns_hybrid_swa_off() -> None:
    doc = facts(cfg.GEMMA3_27B, weights=55 * 10**9, flags={"tp-size": 1})
    fm = pool_model(parse_facts(doc), 32_768)
    assert fm.pool.cell_bytes == 16 * 256 * 62 * 2
    assert any("gemma2_gemma3.py" in n for n in fm.notes)


def test_linear_attention_hybrids_count_only_full_layers_and_leave_the_state_its_share() -> None:
    doc = facts(cfg.QWEN3_NEXT, n=4, weights=160 * 10**9, flags={"tp-size": 4, "mem-fraction-static": 0.88})
    pool = pool_model(parse_facts(doc), 32_768).pool
    assert pool.cell_bytes == 1 * 512 * 12 * 2  # 2 KV heads over TP 4 -> 1; 12 of 48 layers full
    assert pool.sizer is not None and pool.sizer.mamba is not None
    # GDN state per slot at TP 4: conv (8192/4 x 3) bf16 + temporal (8 x 128 x 128) fp32, 36 layers.
    assert pool.sizer.mamba.per_slot_bytes == (2048 * 3 * 2 + 8 * 128 * 128 * 4) * 36
    rest = 20.0
    kv_share = pool.sizer.budget_gib(rest)
    assert kv_share == pytest.approx(rest / 1.9, rel=0.01)  # the state takes 0.9 / 1.9
    capped = pool_model(
        parse_facts({**doc, "flags": {**doc["flags"], "max-mamba-cache-size": 100}}), 32_768
    ).pool
    assert capped.sizer is not None
    assert capped.sizer.budget_gib(rest) == pytest.approx(
        rest - 101 * pool.sizer.mamba.per_slot_bytes / 2**30
    )


def test_nemotron_h_mamba2_layers() -> None:
    layout = read_layout(cfg.NEMOTRON_H_9B)
    assert layout.family == "linear" and len(layout.kv_layers) == 4 and layout.linear is not None
    assert cell(cfg.NEMOTRON_H_9B)[0] == 8 * 256 * 4 * 2


def test_kinds_not_followed_get_a_one_line_refusal() -> None:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(UsageError, match="DeepSeek V4 compressed attention pools"):
        pool_model(parse_facts(facts(cfg.DEEPSEEK_V4, weights=1)), 32_768)
    del out, err


def test_sglang_default_fraction_when_the_flag_is_absent() -> None:
    layout = read_layout(cfg.KIMI_K26)
    settings = memory_defaults.default_fraction(layout, 97_871, Parallel(tp=8))
    assert settings.fraction == pytest.approx(0.833 * 0.909736328125, abs=1e-6)  # FACTS: 0.758 on 0.5.23


def test_aiter_runs_at_0_85_of_an_explicit_fraction_unless_told_to_honor_it() -> None:
    mi355 = ("AMD Instinct MI355X", 294896, None)
    doc = facts(
        cfg.LLAMA31_8B, mi355, 1, weights=16 * 10**9, flags={"tp-size": 1, "mem-fraction-static": 0.9}
    )
    scaled = pool_model(parse_facts(doc), 131_072).pool
    honored = pool_model(
        parse_facts({**doc, "env": {"SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION": "1"}}), 131_072
    ).pool
    short = pool_model(parse_facts(doc), 8_192).pool
    assert scaled.fraction_scale == 0.85 and honored.fraction_scale == 1.0 and short.fraction_scale == 1.0
    assert scaled.pool(0.9) == honored.pool(0.9 * 0.85)


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(doc))
    return path


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), Output(stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


def test_cli_plans_offline_from_a_facts_file(tmp_path: Path) -> None:
    code, out, err = run("plan", "--facts", str(write(tmp_path, ct200())), "--context", "200k", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["feasible"] and plan["basis"] == "calibrated"
    assert any("facts.json: last_start" in n for n in plan["notes"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="deployctl-facts/9"), "format"),
        (lambda d: d.update(gpus=[]), "gpus"),
        (lambda d: d["model"].update(config=cfg.DEEPSEEK_V4), "DeepSeek V4"),
        (lambda d: d.update(last_start=None, model={"config": cfg.KIMI_K26}), "weights_bytes"),
    ],
)
def test_cli_bad_facts_are_one_line_errors(tmp_path: Path, mutate: Any, message: str) -> None:
    doc = copy.deepcopy(ct200())
    mutate(doc)
    code, out, err = run("plan", "--facts", str(write(tmp_path, doc)), "--context", "200k")
    assert code == 2 and out == ""
    first = err.splitlines()[0]
    assert first.startswith("deployctl: error: ") and message in first


def test_dsa_scaled_fp8_row_matches_a_real_b200_start() -> None:
    # sgl-project/sglang#11309: DeepSeek-V3.2-Exp on 8 x B200 with the flashmla_kv fp8 layout of its day:
    # "KV Cache is allocated. #tokens: 975424, KV size: 43.67 GB" (buffers hold tokens + one page).
    flags = {
        "kv-cache-dtype": "fp8_e4m3",
        "dsa-prefill-backend": "flashmla_kv",
        "dsa-decode-backend": "flashmla_kv",
    }
    per_token, page = cell(cfg.DEEPSEEK_V32, ("NVIDIA B200", 183359, "10.0"), 8, **flags)
    assert per_token == 61 * (656 + 132)
    assert (975_424 + page) * per_token / 2**30 == pytest.approx(43.67, abs=0.005)


def test_render_refuses_what_0_5_23_rejects_and_warns_on_what_it_deprecates(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "h.toml").write_text(
        '[ssh]\ntarget = "h"\n[gpus]\ncount = 1\nmemory_gib = 79.6\n[model]\npath = "/m"\n'
        '[sglang]\nversion = "0.5.23"\n[sglang.flags]\nmodel-path = "/m"\n'
    )
    code, out, err = run(
        "--units", str(units), "render", "h", "--context", "32k", "--set", "cuda-graph-max-bs=64"
    )
    assert code == 2 and out == ""
    assert (
        "--cuda-graph-max-bs is not accepted by SGLang 0.5.23" in err and "--cuda-graph-max-bs-decode" in err
    )
    code, out, err = run(
        "--units", str(units), "render", "h", "--context", "32k", "--set", "disable-cuda-graph=true"
    )
    assert code == 0 and "deployctl: warning: --disable-cuda-graph is deprecated" in err
    assert "--cuda-graph-backend-decode disabled" in err
    # An older SGLang still takes the old name.
    (units / "h.toml").write_text((units / "h.toml").read_text().replace("0.5.23", "0.5.14"))
    code, out, err = run(
        "--units", str(units), "render", "h", "--context", "32k", "--set", "cuda-graph-max-bs=64"
    )
    assert code == 0 and "not accepted" not in err and "removed" not in err and "deprecated" not in err
    # said plainly: deployctl ships no 0.5.14 table, so 0.5.23's read the flag
    assert "checked against SGLang 0.5.23's flag table, not 0.5.14's" in err


def test_multimodal_is_what_sglang_serves_as_multimodal() -> None:
    def reserve(config: dict[str, Any], **flags: Any) -> float:
        doc = facts(config, weights=10**9, flags={"tp-size": 1, "mem-fraction-static": 0.88, **flags})
        sizer = pool_model(parse_facts(doc), 32_768).pool.sizer
        assert sizer is not None
        return sizer.reserve_gib

    assert reserve(cfg.KIMI_K26) == pytest.approx(100 / 1024)  # listed, and a text_config inside
    assert reserve(cfg.KIMI_K26, **{"language-only": True}) == 0.0
    assert reserve(cfg.GEMMA3_27B) == 0.0  # SGLang serves Gemma 3 as text unless --enable-multimodal
    assert reserve(cfg.GEMMA3_27B, **{"enable-multimodal": True}) == pytest.approx(100 / 1024)
    assert reserve(cfg.LLAMA31_8B) == 0.0


def test_alternatives_resize_the_familys_own_pool() -> None:
    # gpt-oss-120b on one H100: a 400k context does not fit; fp8 KV must double the hybrid pool it predicts.
    doc = facts(cfg.GPT_OSS_120B, weights=65 * 10**9, flags={"tp-size": 1, "mem-fraction-static": 0.88})
    p = plan_from_facts(parse_facts(doc), Target(400_000))
    assert not p.feasible
    fp8 = next(a for a in p.alternatives if a.change.startswith("fp8"))
    model = pool_model(parse_facts(doc), 400_000).pool
    assert fp8.mem_fraction_static is not None
    assert fp8.predicted_pool_tokens == pytest.approx(2 * model.pool(fp8.mem_fraction_static), rel=0.001)
    gpus = next(a for a in p.alternatives if a.change.startswith("more GPUs"))
    assert "replicated" not in gpus.change


def test_dflash_before_0_5_18_scales_by_layers_and_the_plan_warns_about_the_version() -> None:
    old = ct200(sglang={"version": "0.5.17"}, last_start=None)
    fm = pool_model(parse_facts(old), 200_000)
    assert fm.pool.cell_bytes == -(-70_272 * 64 // 61)
    p = plan_from_facts(parse_facts(old), Target(200_000))
    assert any("follows 0.5.23's sizing rules" in w for w in p.warnings)
    assert not any(
        "follows 0.5.23" in w for w in plan_from_facts(parse_facts(ct200()), Target(200_000)).warnings
    )


def test_linear_hybrid_plan_names_the_request_cap_of_the_state_cache() -> None:
    doc = facts(cfg.QWEN3_NEXT, n=4, weights=160 * 10**9, flags={"tp-size": 4, "mem-fraction-static": 0.88})
    p = plan_from_facts(parse_facts(doc), Target(131_072))
    assert any("SGLang caps --max-running-requests at" in n for n in p.notes)
