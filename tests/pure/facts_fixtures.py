"""config.json shapes of public models (the keys SGLang's sizing reads, values as published), for the
planner's facts tests. Sources: the models' Hugging Face repositories."""

from __future__ import annotations

from typing import Any

# moonshotai/Kimi-K2.6 (the seed host's model): MLA text model inside a vision-language wrapper.
KIMI_K26: dict[str, Any] = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "num_hidden_layers": 61,
        "hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
        "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
        "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"},
    },
    "vision_config": {"vt_num_hidden_layers": 27, "vt_hidden_size": 1152},
}  # fmt: skip
# z-lab Kimi-K2.6 DFlash draft (3 layers, 32 KV heads of 128).
KIMI_DFLASH: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "num_hidden_layers": 3, "hidden_size": 7168,
    "num_attention_heads": 64, "num_key_value_heads": 32, "head_dim": 128, "torch_dtype": "bfloat16",
}  # fmt: skip
# meta-llama/Llama-3.1-8B-Instruct
LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},
    "torch_dtype": "bfloat16",
}  # fmt: skip
# Qwen/Qwen3-Next-80B-A3B-Instruct: GDN linear attention, every 4th layer full attention.
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 48, "hidden_size": 2048,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# openai/gpt-oss-120b: alternating sliding (128) and full attention.
GPT_OSS_120B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "num_hidden_layers": 36, "hidden_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# deepseek-ai/DeepSeek-V3.2: MLA with the DSA indexer.
DEEPSEEK_V32: dict[str, Any] = {
    "architectures": ["DeepseekV32ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168,
    "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "index_head_dim": 128, "index_n_heads": 64,
    "index_topk": 2048, "num_nextn_predict_layers": 1, "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# google/gemma-3-27b-it: sliding-window layers, but SGLang turns the hybrid pool off.
GEMMA3_27B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "num_hidden_layers": 62, "hidden_size": 5376, "num_attention_heads": 32, "num_key_value_heads": 16,
        "head_dim": 128, "sliding_window": 1024, "max_position_embeddings": 131072,
    },
    "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152},
    "torch_dtype": "bfloat16",
}  # fmt: skip
# nvidia/NVIDIA-Nemotron-Nano-9B-v2: Mamba2 hybrid.
NEMOTRON_H_9B: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"], "hidden_size": 4480, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128, "mamba_head_dim": 80,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "max_position_embeddings": 131072,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "num_hidden_layers": 56, "torch_dtype": "bfloat16",
}  # fmt: skip
# deepseek-ai/DeepSeek-V4 (compressed attention): refused.
DEEPSEEK_V4: dict[str, Any] = {"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 61}
