"""What a model's config.json says about its KV pool, read as SGLang 0.5.23 reads it.

Stdlib only (this module may run on the host). Each rule names the file it follows, relative to
sglang/srt/ in the 0.5.23 wheel. A kind SGLang sizes with its own configurator that this module does not
follow raises Unsupported with one line naming the kind: never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal

from agent.sglang import gemma4
from agent.sglang.architectures import (
    DSA_ARCHS,
    GDN_ARCHS,
    HYBRID_SWA_ARCHS,
    KDA_ARCHS,
    MAMBA2_ARCHS,
    MLA_ARCHS,
    MM_OFF_BY_DEFAULT,
    MULTIMODAL_ARCHS,
    REFUSED,
    SWA_COMPRESS_ARCHS,
)
from agent.sglang.config_json import ModelConfig

Family = Literal["mha", "mla", "dsa", "swa", "linear"]
LinearKind = Literal["gdn", "mamba2", "kda"]


class Unsupported(ValueError):
    """A model kind SGLang sizes in a way deployctl does not follow; the text names the kind."""


# configs/model_config.py: swa_attention_layer_ids for architectures with a fixed pattern.
_LLAMA4 = "Llama4ForConditionalGeneration"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# transformers' configuration_utils.py (5.19, the release SGLang 0.5.23 pins) reads a string torch_dtype /
# dtype as getattr(torch, name): another word, a number or a list stops SGLang's start. The floating dtypes
# torch has (SGLang's configs/model_config.py _get_and_verify_dtype sizes the names it does not map as
# float32 under --dtype auto: 2 bytes).
TORCH_DTYPES = frozenset(
    {*_DTYPE_BYTES, "float64", "double", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
)


@dataclass(frozen=True)
class LinearState:
    """A linear-attention / Mamba layer's per-request state shape (configs/mamba_utils.py)."""

    kind: LinearKind
    layers: tuple[int, ...]
    num_heads: int  # value heads (GDN), mamba heads (Mamba2), heads (KDA)
    head_dim: int
    state_size: int  # key head dim (GDN), ssm_state_size (Mamba2), head_dim (KDA)
    n_groups: int  # key heads (GDN), n_groups (Mamba2), key heads (KDA)
    conv_kernel: int
    ssm_dtype_bytes: int  # mamba_ssm_dtype, float32 unless the config says otherwise

    def per_request_bytes(self, attn_tp: int, conv_dtype_bytes: int = 2) -> int:
        """mamba_cache_per_req: conv + temporal state, every linear layer, this rank's share."""
        if self.kind == "kda":
            # KimiLinearStateShape.create: q, k, v convs of heads*head_dim; temporal (heads, d, d).
            proj = self.num_heads * self.head_dim // attn_tp
            proj_k = self.n_groups * self.head_dim // attn_tp
            conv = (self.conv_kernel - 1) * (proj + 2 * proj_k)
            temporal = self.num_heads // attn_tp * self.head_dim * self.head_dim
        else:
            # Mamba2StateShape.create: groups padded to the TP size when they do not divide it.
            groups = self.n_groups
            if groups % attn_tp:
                groups += attn_tp - groups
            conv_dim = self.num_heads * self.head_dim + 2 * groups * self.state_size
            conv = conv_dim // attn_tp * (self.conv_kernel - 1)
            temporal = self.num_heads // attn_tp * self.head_dim * self.state_size
        return (conv * conv_dtype_bytes + temporal * self.ssm_dtype_bytes) * len(self.layers)


@dataclass(frozen=True)
class KVLayout:
    """The figures of config.json that size SGLang's pool, already resolved as SGLang resolves them."""

    arch: str
    family: Family
    layers: int  # num_hidden_layers
    kv_layers: tuple[int, ...]  # layers with a full-attention KV entry (all layers for plain models)
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    swa_layers: tuple[int, ...] = ()
    swa_kv_heads: int = 0
    swa_head_dim: int = 0
    swa_v_head_dim: int = 0
    sliding_window: int | None = None
    dsa_index_head_dim: int = 0
    dsa_index_kpool: int = 1
    dsa_shared_layers: int = 0  # layers that reuse the previous top-k: their index-K rows are elided
    linear: LinearState | None = None
    multimodal: bool = False
    multimodal_off_by_default: bool = False
    model_type: str = ""
    vit_layers: int = 0
    vit_hidden: int = 0
    dtype_bytes: int = 2  # the model dtype: what --kv-cache-dtype auto means
    kv_quant_fp8: bool = False  # quantization_config.kv_cache_quant_algo == FP8
    context_len: int = 2048
    nextn_layers: int = 0  # num_nextn_predict_layers (MTP drafts)
    swa_disabled_by_sglang: str | None = None  # why SGLang sizes a sliding-window model as full attention


def _int(cfg: ModelConfig, name: str, what: str) -> int:
    value = cfg.value(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"config.json of {what} lacks an integer {name!r}")
    return value


def _number(cfg: ModelConfig, name: str, what: str) -> int:
    """A number the kind needs, as an integer (int() of it)."""
    value = cfg.number(name)
    if value is None:
        raise ValueError(f"config.json of {what} lacks {name!r}")
    return int(value)


# Keys a published config.json may leave out because they sit at the config class's default: transformers
# fills them when it loads the config, and SGLang reads that object. The class's literal defaults (values it
# derives, such as Llama's head_dim = hidden_size / heads, are derived here too), transformers 5.19.0:
CLASS_DEFAULTS: dict[str, dict[str, int]] = {
    # models/gemma3/configuration_gemma3.py Gemma3TextConfig (Gemma 3's text_config)
    "gemma3_text": {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
                    "sliding_window": 4096},
    # models/llama/configuration_llama.py LlamaConfig (num_key_value_heads None: the attention heads)
    "llama": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "max_position_embeddings": 2048},
    # models/mistral/configuration_mistral.py MistralConfig
    "mistral": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 131072, "sliding_window": 4096},
    # models/mixtral/configuration_mixtral.py MixtralConfig
    "mixtral": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 131072},
    # models/qwen2/configuration_qwen2.py Qwen2Config
    "qwen2": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "max_position_embeddings": 32768},
    # models/qwen3/configuration_qwen3.py Qwen3Config
    "qwen3": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
}  # fmt: skip
# A multimodal config's text part without a model_type: the class its parent's type implies.
_TEXT_TYPE = {"gemma3": "gemma3_text"}


def with_class_defaults(cfg: Mapping[str, object], parent_type: str = "") -> Mapping[str, object]:
    """The decoded config as transformers loads it: the keys left at the class's default filled in."""
    model_type = str(cfg.get("model_type") or _TEXT_TYPE.get(parent_type, ""))
    defaults = CLASS_DEFAULTS.get(model_type)
    if not defaults:
        return cfg
    return {**defaults, **cfg}


def _loaded(cfg: ModelConfig, parent_type: str = "") -> ModelConfig:
    return replace(cfg, data=with_class_defaults(cfg.data, parent_type))


def lm_subconfig(config: ModelConfig) -> ModelConfig | None:
    """The language model's sub-config of a multimodal config (with its class defaults), or None."""
    parent = str(config.value("model_type") or "")
    for key in ("thinker_config", "llm_config", "language_config", "text_config"):
        sub = config.sub(key)
        if sub is None:
            continue
        sub = _loaded(sub, parent)
        if sub.value("num_hidden_layers") or sub.value("hybrid_override_pattern"):
            return sub
    return None


def text_config(config: ModelConfig) -> ModelConfig:
    """hf_text_config: text_config / llm_config / language_config for multimodal configs, else the config;
    with the keys its config class would fill (CLASS_DEFAULTS)."""
    sub = lm_subconfig(config)
    return sub if sub is not None else _loaded(config)


def context_length(cfg: ModelConfig) -> int:
    """utils/hf_transformers/common.py get_context_length: the first length key times the rope factor;
    the factor counts 1 with original_max_position_embeddings or llama3 rope; 2048 when no key is there."""
    rope = cfg.sub("rope_scaling")
    factor: float = 1
    if rope is not None and rope.data:
        overridden = rope.has("original_max_position_embeddings") or rope.value("rope_type") == "llama3"
        given = None if overridden else rope.number("factor")
        factor = 1 if given is None else given
    for key in (
        "max_sequence_length",
        "seq_length",
        "max_seq_len",
        "model_max_length",
        "max_position_embeddings",
    ):
        length = cfg.number(key)
        if length is not None:
            return int(factor * length)
    return 2048


def _dtype_bytes(config: ModelConfig, text: ModelConfig) -> int:
    for cfg in (config, text):
        for key in ("torch_dtype", "dtype"):
            value = cfg.value(key)
            if value is not None and not (
                isinstance(value, str) and value.removeprefix("torch.") in TORCH_DTYPES
            ):
                raise ValueError(
                    f"{cfg.where}: {cfg.prefix}{key} = {value!r} is not a torch dtype "
                    "(bfloat16, float16, float32, ...)"
                )
    name = text.first("torch_dtype", "dtype") or config.first("torch_dtype", "dtype") or "bfloat16"
    return _DTYPE_BYTES.get(str(name).removeprefix("torch."), 2)


def _kv_quant_fp8(config: ModelConfig, text: ModelConfig) -> bool:
    """mem_cache/kv_cache_dtype.py: auto means fp8 when the loaded quant config's kv_cache_quant_algo is FP8.

    How each method derives it (layers/quantization/): modelopt's flat config from kv_cache_scheme (float,
    8 bits) or kv_cache_quant_algo; compressed-tensors only for a static symmetric per-tensor fp8 scheme;
    fp8 and others from kv_cache_quant_algo.
    """
    for cfg in (config, text):
        quant = cfg.sub("quantization_config")
        if quant is None:
            continue
        scheme = quant.sub("kv_cache_scheme")
        method = str(quant.value("quant_method") or "")
        if method == "compressed-tensors":
            return (
                scheme is not None and scheme.value("type") == "float" and scheme.value("num_bits") == 8
                and scheme.value("strategy") == "tensor" and bool(scheme.value("symmetric", True))
                and not scheme.value("dynamic", False)
            )  # fmt: skip
        if quant.value("quant_algo") is not None and scheme is not None:
            return scheme.value("type") == "float" and scheme.value("num_bits") == 8
        algo = quant.value("kv_cache_quant_algo")
        return isinstance(algo, str) and algo.upper() == "FP8"
    return False


def _vision(config: ModelConfig) -> tuple[int, int]:
    """(vit layers, vit hidden) for the default fraction's multimodal factor.

    arg_groups/memory_hook.py adjust_mem_fraction_for_vlm reads vision_config.num_hidden_layers and
    hidden_size, 24 and 1024 when absent: a Qwen-VL `depth` is not read. Kimi K2.5's vision config class
    (configs/kimi_k25.py) names them vt_num_hidden_layers / vt_hidden_size.
    """
    vision = config.sub("vision_config")
    if vision is None:
        return 0, 0
    layers = vision.first("num_hidden_layers", "vt_num_hidden_layers")
    hidden = vision.first("hidden_size", "vt_hidden_size")
    return (layers if isinstance(layers, int) else 24), (hidden if isinstance(hidden, int) else 1024)


# The counts and sizes the pool is computed from, and their sane range: a zero divides, 1e21 layers is a
# range() that never ends, an infinite length an int() that raises. Checked wherever config.json nests them.
_DIMS = (
    "num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim", "kv_lora_rank",
    "qk_rope_head_dim", "index_head_dim", "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim",
    "linear_num_value_heads", "linear_num_key_heads", "linear_value_head_dim", "linear_key_head_dim",
    "linear_conv_kernel_dim", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
    "conv_kernel",
)  # fmt: skip
_RANGES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "vt_num_hidden_layers"), (1, 4096)),
    "num_nextn_predict_layers": (0, 4096),
    **dict.fromkeys(("hidden_size", "vt_hidden_size"), (1, 2**20)),
    **dict.fromkeys(_DIMS, (1, 65536)),
    **dict.fromkeys(
        ("max_position_embeddings", "max_sequence_length", "seq_length", "max_seq_len", "model_max_length"),
        (1, 2**31),
    ),
    "factor": (0, 65536),  # rope_scaling's: times the length above
}
_LARGEST = 2**53  # any other number: beyond this a float no longer holds every integer


def check_numbers(config: ModelConfig, where: str = "config.json") -> None:
    """ValueError naming the first number of `config` that is not finite or not in its range.

    A non-finite number under a key the planner never reads (Nemotron-H's time_step_limit holds
    Infinity) is left alone: ModelConfig.number refuses one wherever a key is read.
    """
    stack: list[tuple[str, str, object]] = [(k, k, v) for k, v in config.items()]
    while stack:
        path, key, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{path}.{k}", str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", "", v) for i, v in enumerate(value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = _RANGES.get(key, (-_LARGEST, _LARGEST))
            if not math.isfinite(value) and key not in _RANGES:
                continue
            said = "--json-model-override-args" if config.written_in(path) != config.where else where
            if not math.isfinite(value):
                raise ValueError(f"{said}: {path} = {value} is not a finite number")
            if not lo <= value <= hi:
                raise ValueError(f"{said}: {path} = {value:.6g} is out of range ({lo:,} to {hi:,})")


@dataclass(frozen=True)
class _Common:
    """The KVLayout fields every family fills the same way."""

    arch: str
    multimodal: bool
    multimodal_off_by_default: bool
    model_type: str
    dtype_bytes: int
    kv_quant_fp8: bool
    context_len: int
    nextn_layers: int
    vit_layers: int
    vit_hidden: int


@dataclass(frozen=True)
class _Heads:
    """An attention layer's KV shape (MHA, SWA's full layers, the attention layers of linear hybrids)."""

    kv_heads: int
    head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class _Latent:
    """An MLA layer's KV shape: the compressed latent and the rope part."""

    kv_lora_rank: int
    qk_rope_head_dim: int


def read_layout(config: ModelConfig | Mapping[str, object], *, is_draft: bool = False) -> KVLayout:
    """config.json (as published, or as decoded) -> KVLayout.

    Unsupported for kinds not followed, ValueError for bad input (a number out of range included).
    """
    where = "the draft's config.json" if is_draft else "config.json"
    config = ModelConfig.of(config, where)
    check_numbers(config, where)
    archs = config.value("architectures")
    if not isinstance(archs, Sequence) or not archs or not isinstance(archs[0], str):
        raise ValueError("config.json has no 'architectures' list")
    arch = archs[0]
    _refuse(arch)
    text = text_config(config)
    if arch in gemma4.ARCHS:
        text = gemma4.flatten(text)
    common = _common(config, text, arch, is_draft)
    if arch in MAMBA2_ARCHS:
        return _mamba2(text, common)
    layers = _int(text, "num_hidden_layers", arch)
    if arch in MLA_ARCHS or (arch == "PixtralForConditionalGeneration" and text.value("kv_lora_rank")):
        return _latent_layout(text, layers, common)
    heads = _mha_heads(text, arch)
    if arch in GDN_ARCHS:
        return _gdn(text, layers, heads, common)
    if arch in HYBRID_SWA_ARCHS or arch in gemma4.ARCHS or text.value("is_hybrid_swa"):
        return _swa(text, arch, layers, heads, common)
    return KVLayout(
        family="mha",
        layers=layers,
        kv_layers=tuple(range(layers)),
        **asdict(heads),
        **asdict(common),
        swa_disabled_by_sglang=_swa_off(arch, text),
    )


def _refuse(arch: str) -> None:
    """Unsupported for the architectures whose pools SGLang sizes in a way this module does not follow."""
    if arch in REFUSED:
        raise Unsupported(f"{arch}: SGLang 0.5.23 sizes {REFUSED[arch]}, which deployctl does not follow")
    if arch in SWA_COMPRESS_ARCHS:
        raise Unsupported(
            f"{arch}: SGLang 0.5.23 sizes its sliding-window pool with separate global and sliding head "
            "shapes (is_hybrid_swa_compress), which deployctl does not follow yet"
        )


def _common(config: ModelConfig, text: ModelConfig, arch: str, is_draft: bool) -> _Common:
    # configs/model_config.py: multimodal when the arch is listed or the LM config is a sub-config
    # (has_multimodal_subconfig); Gemma 3, Llama 4, Step3-VL turn it off unless --enable-multimodal.
    structural = arch in MULTIMODAL_ARCHS or lm_subconfig(config) is not None
    vit_layers, vit_hidden = _vision(config)
    return _Common(
        arch=arch,
        multimodal=structural and not is_draft,
        multimodal_off_by_default=arch in MM_OFF_BY_DEFAULT,
        model_type=str(config.value("model_type") or ""),
        dtype_bytes=_dtype_bytes(config, text),
        kv_quant_fp8=_kv_quant_fp8(config, text),
        context_len=context_length(text),
        nextn_layers=int(text.number("num_nextn_predict_layers") or 0),
        vit_layers=vit_layers,
        vit_hidden=vit_hidden,
    )


def _latent_layout(text: ModelConfig, layers: int, common: _Common) -> KVLayout:
    """MLA, with DSA's indexer where the architecture carries one, or Kimi Linear's KDA layers."""
    arch = common.arch
    mla = _Latent(_int(text, "kv_lora_rank", arch), _int(text, "qk_rope_head_dim", arch))
    everything = tuple(range(layers))
    if arch in DSA_ARCHS and text.value("index_topk") is not None:
        return KVLayout(
            family="dsa",
            layers=layers,
            kv_layers=everything,
            **asdict(mla),
            **asdict(common),
            dsa_index_head_dim=_int(text, "index_head_dim", arch),
            dsa_shared_layers=sum(_dsa_skips_topk(text, i) for i in range(layers)),
            dsa_index_kpool=int(text.number("index_kpool") or 1),
        )
    if arch in KDA_ARCHS:
        return _kda(text, layers, mla, common)
    return KVLayout(family="mla", layers=layers, kv_layers=everything, **asdict(mla), **asdict(common))


def _dsa_skips_topk(cfg: ModelConfig, layer: int) -> bool:
    """configs/model_config.py dsa_layer_skips_topk: a layer reusing the previous layer's top-k."""
    types = cfg.value("indexer_types")
    if isinstance(types, Sequence) and not isinstance(types, str):
        return 0 <= layer < len(types) and types[layer] == "shared"
    cli = int(cfg.number("cli_factor") or 1)
    if cli > 1:
        return layer % cli != 0
    pattern = cfg.value("index_topk_pattern")
    if isinstance(pattern, (str, Sequence)) and pattern:
        return layer < len(pattern) and pattern[layer] == "S"
    freq = int(cfg.number("index_topk_freq") or 1)
    offset = cfg.number("index_skip_topk_offset")
    if offset is not None:
        return max(layer - int(offset) + 1, 0) % freq != 0
    return max(layer - 1, 0) % freq != 0


def _mha_heads(text: ModelConfig, arch: str) -> _Heads:
    """configs/model_config.py: head_dim defaults to hidden/heads, v_head_dim to head_dim, kv heads to
    attention heads."""
    heads = _int(text, "num_attention_heads", arch)
    head_dim = text.number("head_dim") or _int(text, "hidden_size", arch) // heads
    kv_heads = text.number("num_key_value_heads") or heads
    v_head_dim = text.number("v_head_dim") or head_dim
    return _Heads(int(kv_heads), int(head_dim), int(v_head_dim))


def _swa_off(arch: str, text: ModelConfig) -> str | None:
    """Sliding-window models SGLang 0.5.23 sizes as full attention (arg_groups/model_overrides/*.py)."""
    if not text.value("sliding_window") and "sliding_attention" not in (text.array("layer_types") or ()):
        return None
    if arch.startswith(("Gemma2", "Gemma3")):
        return f"{arch}: hybrid SWA memory is turned off (model_overrides/gemma2_gemma3.py)"
    if arch.startswith(("Exaone", "Olmo")):
        return f"{arch}: hybrid SWA memory is turned off (model_overrides/exaone.py, olmo2.py)"
    return f"{arch} is not a hybrid-SWA architecture in configs/model_config.py: every layer is full size"


def _swa(text: ModelConfig, arch: str, layers: int, heads: _Heads, common: _Common) -> KVLayout:
    """configs/model_config.py get_hybrid_layer_ids and get_swa_num_kv_heads."""
    if arch == _LLAMA4:
        swa = tuple(i for i in range(layers) if (i + 1) % 4 != 0)
    elif (pattern := text.array("hybrid_layer_pattern")) is not None:
        swa = tuple(i for i in range(layers) if pattern[i] == 1)
    else:
        types = text.array("layer_types") or ()
        swa = tuple(i for i, t in enumerate(types[:layers]) if t == "sliding_attention")
    full = tuple(i for i in range(layers) if i not in set(swa))
    if not swa:
        return KVLayout(family="mha", layers=layers, kv_layers=full, **asdict(heads), **asdict(common))
    swa_heads = text.number("swa_num_key_value_heads") or heads.kv_heads
    swa_head_dim = text.number("swa_head_dim") or heads.head_dim
    window = text.number("sliding_window") or text.number("attention_chunk_size")
    return KVLayout(
        family="swa",
        layers=layers,
        kv_layers=full,
        swa_layers=swa,
        swa_kv_heads=int(swa_heads),
        swa_head_dim=int(swa_head_dim),
        swa_v_head_dim=int(text.number("swa_v_head_dim") or swa_head_dim),
        sliding_window=int(window) if window else None,
        **asdict(heads),
        **asdict(common),
    )


def _ssm_bytes(text: ModelConfig) -> int:
    """configs/mamba_utils.py mamba2_state_dtype: float32 unless mamba_ssm_dtype says otherwise."""
    return _DTYPE_BYTES.get(str(text.value("mamba_ssm_dtype") or "float32"), 4)


def _gdn(text: ModelConfig, layers: int, heads: _Heads, common: _Common) -> KVLayout:
    """configs/qwen3_next.py: every full_attention_interval-th layer is full attention; the rest GDN."""
    types = text.value("layer_types")
    if isinstance(types, Sequence) and len(types) >= layers:
        full = tuple(i for i in range(layers) if types[i] == "full_attention")
    else:
        interval = int(text.number("full_attention_interval") or 4)
        full = tuple(i for i in range(layers) if (i + 1) % interval == 0)
    linear = LinearState(
        kind="gdn",
        layers=tuple(i for i in range(layers) if i not in set(full)),
        num_heads=int(text.number("linear_num_value_heads") or 32),
        head_dim=int(text.number("linear_value_head_dim") or 128),
        state_size=int(text.number("linear_key_head_dim") or 128),
        n_groups=int(text.number("linear_num_key_heads") or 16),
        conv_kernel=int(text.number("linear_conv_kernel_dim") or 4),
        ssm_dtype_bytes=_ssm_bytes(text),
    )
    return KVLayout(
        family="linear", layers=layers, kv_layers=full, linear=linear, **asdict(heads), **asdict(common)
    )


def _mamba2(text: ModelConfig, common: _Common) -> KVLayout:
    """configs/nemotron_h.py: hybrid_override_pattern, 'M' Mamba2 layers and '*' attention layers."""
    pattern = text.value("hybrid_override_pattern")
    if not isinstance(pattern, str):
        raise ValueError(f"config.json of {common.arch} lacks 'hybrid_override_pattern'")
    full = tuple(i for i, c in enumerate(pattern) if c == "*")
    linear = LinearState(
        kind="mamba2",
        layers=tuple(i for i, c in enumerate(pattern) if c == "M"),
        num_heads=_int(text, "mamba_num_heads", common.arch),
        head_dim=_int(text, "mamba_head_dim", common.arch),
        state_size=_int(text, "ssm_state_size", common.arch),
        n_groups=_int(text, "n_groups", common.arch),
        conv_kernel=int(text.number("conv_kernel") or 4),
        ssm_dtype_bytes=_ssm_bytes(text),
    )
    heads = _mha_heads(text, common.arch)
    return KVLayout(
        family="linear", layers=len(pattern), kv_layers=full, linear=linear, **asdict(heads), **asdict(common)
    )


def _kda(text: ModelConfig, layers: int, mla: _Latent, common: _Common) -> KVLayout:
    """configs/kimi_linear.py: kda_layers (1-based) are linear; the others MLA."""
    cfg = text.sub("linear_attn_config")
    if cfg is None:
        raise ValueError(f"config.json of {common.arch} lacks 'linear_attn_config'")
    kda = {i - 1 for i in cfg.integers("kda_layers") or ()}
    heads = _number(cfg, "num_heads", common.arch)
    linear = LinearState(
        kind="kda",
        layers=tuple(sorted(kda)),
        num_heads=heads,
        head_dim=_number(cfg, "head_dim", common.arch),
        state_size=_number(cfg, "head_dim", common.arch),
        n_groups=heads,
        conv_kernel=int(cfg.number("short_conv_kernel_size") or 4),
        ssm_dtype_bytes=_ssm_bytes(text),
    )
    full = tuple(i for i in range(layers) if i not in kda)
    return KVLayout(
        family="linear", layers=layers, kv_layers=full, linear=linear, **asdict(mla), **asdict(common)
    )
