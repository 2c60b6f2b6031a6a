"""SGLang 0.5.23's default fraction (arg_groups/memory_hook.py): a chunked-prefill-size of 0 is chunking off,
as -1 is; a PD role reserves for its own phase only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sglang.config_json import ModelConfig
from agent.sglang.kvlayout import read_layout
from agent.sglang.memory_defaults import MemoryFlags, default_fraction
from agent.sglang.pools import Parallel
from tests.pure.test_review39b_findings import default_fraction as sglang_default
from tests.pure.test_review39b_findings import facts

LLAMA = read_layout(
    ModelConfig(
        {
            "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
        }
    )
)  # fmt: skip
CARDS = st.sampled_from([24 * 1024, 48 * 1024, 81_559, 97_871, 143_771])
PAR = Parallel(tp=1, pp=1, attn_dp=1, dcp=1)


@given(CARDS, st.sampled_from([None, 4096, 65536]))
def test_chunked_prefill_zero_is_chunking_off_as_minus_one(gpu_mib: int, max_prefill: int | None) -> None:
    off = [
        default_fraction(
            LLAMA, gpu_mib, PAR, MemoryFlags(chunked_prefill=c, max_prefill_tokens=max_prefill)
        ).fraction
        for c in (0, -1)
    ]
    assert off[0] == off[1]


@given(CARDS)
def test_a_pd_role_reserves_for_its_own_phase_alone(gpu_mib: int) -> None:
    null, prefill, decode = (
        default_fraction(LLAMA, gpu_mib, PAR, MemoryFlags(disaggregation=m)).fraction
        for m in (None, "prefill", "decode")
    )
    assert prefill >= null and decode >= null


def test_the_prefill_graph_backend_the_flags_set_decides_its_reserve() -> None:
    # The oracle on H100 (79.1 GiB), Llama-3.1-70B: TP 4 x PP 2 opted back in to the breakable prefill graph
    # resolves 0.811, as TP 8 with it; --disable-prefill-cuda-graph at TP 8 resolves 0.817, as PP's default.
    def fraction(**flags: object) -> float:
        return sglang_default(facts("llama-3.1-70b", 141, **flags))

    assert fraction(tp_size=4, pp_size=2, cuda_graph_backend_prefill="breakable") == 0.811
    assert fraction(tp_size=8, disable_prefill_cuda_graph=True) == 0.817


@pytest.mark.parametrize(
    ("flags", "sglang"),
    [
        ({"cuda_graph_max_bs_decode": 256}, 0.7712545312499999),  # a max bs given: no expansion to the cap
        ({"language_only": True}, 0.828),  # still multimodal to SGLang: expanded, no ViT factor
        ({"cuda_graph_bs_decode": "1 2 4 8 384"}, 0.7684802343749999),  # a list: its largest, no expansion
    ],
    ids=["max-bs-given", "language-only", "bs-list"],
)
def test_qwen3_vl_decode_graphs_on_hopper_as_sglang_resolves_them(
    flags: dict[str, object], sglang: float
) -> None:
    # The oracle, Qwen3-VL-8B on one H100 (79.1 GiB) at --max-running-requests 512.
    doc = facts("qwen3-vl-8b-instruct", 17.5, tp_size=1, max_running_requests=512, **flags)
    assert sglang_default(doc) == sglang


def test_post_capture_kv_sizing_is_said_with_a_given_fraction() -> None:
    # SGLang resizes the pool after capture under the env var whatever the fraction: the plan says its
    # prediction is the pool before capture (model_runner_components/kv_pool_runtime.py)
    from agent.plan.facts import parse_facts
    from agent.plan.predict import pool_model
    from tests.pure.test_review39b_findings import facts

    env = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
    doc = facts("llama-3.1-8b", 16, env=env, tp_size=1, mem_fraction_static=0.85)
    notes = pool_model(parse_facts(doc, name="x"), 32768).notes
    assert any("may resize the pool after graph capture" in n for n in notes), notes


@pytest.mark.parametrize(
    ("model", "weights", "flags", "sglang"),
    [
        ("deepseek-v3", 600, {}, 0.76),  # MLA: 1.5 GiB of prefill graphs, 1 GiB DeepEP delta, 2 GiB buffers
        ("qwen3-30b-a3b", 61, {"disaggregation_mode": "prefill"}, 0.813),  # no decode graphs: no buffers
        ("qwen3-30b-a3b", 61, {"deepep_mode": "normal"}, 0.775),  # graphs turned off after the fraction
    ],
    ids=["mla", "prefill-role", "normal-mode"],
)
def test_deepep_default_fraction_follows_sglang(
    model: str, weights: float, flags: dict[str, str], sglang: float
) -> None:
    # SGLang 0.5.23's own answers on the oracle's H100 (python -m tests.oracle size --gpu h100 -- --tp-size 8
    # --moe-a2a-backend deepep ...)
    from tests.pure.test_review39b_findings import default_fraction as planned
    from tests.pure.test_review39b_findings import facts

    doc = facts(model, weights, tp_size=8, moe_a2a_backend="deepep", **flags)
    assert planned(doc) == sglang
