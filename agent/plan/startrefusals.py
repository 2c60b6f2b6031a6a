"""Flag combinations SGLang 0.5.23 refuses at start for this model, whatever the pool: each a one-line reason
naming the flag and what to set instead. The plan carries them as refusals (plan/refusals.py), not feasible.

Files named per rule, relative to sglang/srt/.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.inventory import FlagValue
from agent.plan.inputs import int_of, value_of
from agent.sglang.kvlayout import KVLayout

Flags = Mapping[str, FlagValue]

# arg_groups/model_hook.py: the attention backends a model's own branch asserts. (accepted, both sides):
# GPT-OSS (l. 515-543) and Gemma 4 (l. 636-661) check the prefill and the decode backend; Llama 4
# (l. 615-631) the base --attention-backend.
_ACCEPTED_BACKENDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "GptOssForCausalLM": (
        ("triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu", "aiter"), True
    ),
    **dict.fromkeys(
        ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4UnifiedForConditionalGeneration"),
        (("trtllm_mha", "triton", "fa4", "ascend", "intel_xpu", "intel_amx", "aiter"), True),
    ),
    **dict.fromkeys(
        ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"),
        (("fa3", "aiter", "triton", "ascend", "trtllm_mha", "intel_xpu"), False),
    ),
}  # fmt: skip
# GPT-OSS's override sets no backend once any is given (model_overrides/gpt_oss.py:29): one split flag
# alone leaves the other side None, which its assert refuses; Gemma 4's fills it (model_overrides/gemma4.py).
_UNSET_SIDE_UNFILLED = frozenset({"GptOssForCausalLM"})
_SPLIT = ("prefill-attention-backend", "decode-attention-backend")
# arg_groups/fields/spec.py: --speculative-ngram-max-bfs-breadth's default, NGRAM's eagle top-k.
NGRAM_BFS_BREADTH = 10


def start_refusals(
    layout: KVLayout, flags: Flags, page: int, backend: str | None, attn_dp: int
) -> tuple[str, ...]:
    """What SGLang refuses at start for `layout` under `flags`, at its resolved `page` size, the attention
    `backend` the flags resolve (None: SGLang's own default) and `attn_dp` attention-DP ranks."""
    found = [*_dsa_kv_dtype(layout, flags), *_model_backends(layout, flags)]
    return (*found, *_ngram(flags, page, backend, attn_dp))


def _dsa_kv_dtype(layout: KVLayout, flags: Flags) -> list[str]:
    """arg_groups/overrides.py:540-544 _dsa_kv_cache_dtype_default: a DeepSeek DSA model (DeepSeek-V3.2,
    GLM-5) takes a bf16/bfloat16 or fp8_e4m3 KV cache only (auto resolves to one of them)."""
    dtype = str(value_of(flags, "kv-cache-dtype") or "auto")
    if layout.family != "dsa" or dtype in ("auto", "bf16", "bfloat16", "fp8_e4m3"):
        return []
    return [
        f"--kv-cache-dtype {dtype}: SGLang refuses it for a DeepSeek DSA model ({layout.arch}), which takes "
        "bf16 or fp8_e4m3 only; set --kv-cache-dtype fp8_e4m3 (or bfloat16, or leave it auto)"
    ]


def _model_backends(layout: KVLayout, flags: Flags) -> list[str]:
    """The model's own attention-backend assert (arg_groups/model_hook.py); an unset backend takes the
    model's default (arg_groups/model_overrides/), which it accepts."""
    rule = _ACCEPTED_BACKENDS.get(layout.arch)
    if rule is None:
        return []
    accepted, split = rule
    sides = _sides(flags, split)
    given = [(name, value) for name, value in sides if value is not None]
    if given and len(given) < len(sides) and layout.arch in _UNSET_SIDE_UNFILLED:
        name, value = given[0]
        return [
            f"--{name} {value} alone: SGLang's {layout.arch} assert finds the other side's backend unset "
            f"and refuses the start; set --attention-backend {value} instead (or both split flags)"
        ]
    return [
        f"--{name} {value}: SGLang refuses it for {layout.arch}, which takes {', '.join(accepted)}; set one "
        "of those or leave it unset"
        for name, value in dict(given).items()
        if value not in accepted
    ]


def _sides(flags: Flags, split: bool) -> list[tuple[str, str | None]]:
    """(the flag, its value) behind each backend an assert checks: the base one, or the prefill and the
    decode side's own flag over it (arg_groups/model_override_base.py attention_backends_of). Equal split
    flags set the base (arg_groups/overrides.py:1127-1131) only after the model's assert ran on the base
    its override chose (model_overrides/llama4.py:23, model_hook.py:615-631), so they are not checked."""
    base = _text(value_of(flags, "attention-backend"))
    if not split:
        return [("attention-backend", base)]
    own = [(name, _text(value_of(flags, name))) for name in _SPLIT]
    return [(n, v) if v is not None else ("attention-backend", base) for n, v in own]


def _text(value: FlagValue | None) -> str | None:
    return None if value is None else str(value)


def _ngram(flags: Flags, page: int, backend: str | None, attn_dp: int) -> list[str]:
    """arg_groups/speculative_hook.py:1353-1370 _handle_ngram: the top-k is --speculative-ngram-max-bfs-
    breadth (10); above 1 with a page above 1 only an explicit flashinfer backend is taken (the oracle
    refuses an unset one on H100 and A100 alike), and attention DP not at all."""
    if str(value_of(flags, "speculative-algorithm") or "").upper() != "NGRAM":
        return []
    found = []
    topk = int_of(flags, "speculative-ngram-max-bfs-breadth") or NGRAM_BFS_BREADTH
    if topk > 1 and page > 1 and backend != "flashinfer":
        given = int_of(flags, "page-size") is not None
        paged = f"--page-size {page}" if given else f"page size {page} (SGLang's own for this model)"
        found.append(
            f"--speculative-algorithm NGRAM with {paged}: SGLang refuses a top-k {topk} > 1 on a paged cache "
            "off flashinfer; set --attention-backend flashinfer or --speculative-ngram-max-bfs-breadth 1"
            + (", or --page-size 1" if given else "")
        )
    if attn_dp > 1:
        found.append(
            "--speculative-algorithm NGRAM with attention DP: SGLang refuses it; drop --attn-dp-size "
            "(--enable-dp-attention) or the NGRAM draft"
        )
    return found
