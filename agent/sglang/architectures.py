"""The architectures SGLang 0.5.23 sizes in each way, by the class name in config.json's `architectures`.

Stdlib only (it may run on the host). Each set names the file of sglang/srt/ whose rule it follows.
"""

from __future__ import annotations

from collections.abc import Mapping

# configs/model_config.py _derive_model_shapes: the architectures sized as MLA (latent + rope per layer).
MLA_ARCHS = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteForCausalLMNextN",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "MistralLarge3ForCausalLMEagle",
        "KimiK25ForConditionalGeneration",
        "Eagle3DeepseekV2ForCausalLM",
        "KimiVLForConditionalGeneration",
        "KimiLinearForCausalLM",
        "DeepseekVL2ForCausalLM",
        "MiniCPM3ForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "SarvamMLAForCausalLM",
    }
)
# configs/model_config.py is_deepseek_dsa: these with index_topk carry the DSA indexer.
DSA_ARCHS = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
    }
)
# configs/model_config.py multimodal_model_archs (the ones people serve; the list there is longer).
MULTIMODAL_ARCHS = frozenset(
    {
        "KimiK25ForConditionalGeneration",
        "KimiVLForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "Llama4ForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Mistral3ForConditionalGeneration",
        "Glm4vForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration",
        "InternVLChatModel",
        "LlavaForConditionalGeneration",
        "MllamaForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "NemotronH_Nano_VL_V2",
        "DeepseekVL2ForCausalLM",
        "MiniCPMV",
        "MiniCPMO",
        "Phi4MMForCausalLM",
        "PixtralForConditionalGeneration",
    }
)
MM_OFF_BY_DEFAULT = frozenset(
    {"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration", "Step3VLForConditionalGeneration"}
)
# configs/model_config.py is_hybrid_swa_model (hybrid_swa_archs and SWA_SINK_ARCHS).
HYBRID_SWA_ARCHS = frozenset(
    {
        "Llama4ForConditionalGeneration",
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "Step3p5ForCausalLM",
        "MiMoV2FlashForCausalLM",
        "BeamForCausalLM",
        "LagunaForCausalLM",
        "MellumForCausalLM",
    }
)
# Hybrid SWA archs whose pool this module does not follow (compressed SWA, request-ring SWA); Gemma 4's
# compressed shapes are read by agent/sglang/gemma4.py.
SWA_COMPRESS_ARCHS = frozenset({"InklingForConditionalGeneration"})
# configs/hybrid_arch.py: linear-attention state caches.
GDN_ARCHS = frozenset(
    {
        "Qwen3NextForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
    }
)
MAMBA2_ARCHS = frozenset({"NemotronHForCausalLM", "NemotronH_Nano_VL_V2"})
KDA_ARCHS = frozenset({"KimiLinearForCausalLM"})
REFUSED: Mapping[str, str] = {
    "DeepseekV4ForCausalLM": "DeepSeek V4 compressed attention pools (DSV4PoolConfigurator)",
    "DeepseekV4ForCausalLMNextN": "DeepSeek V4 compressed attention pools (DSV4PoolConfigurator)",
    "MiniMaxM3SparseForCausalLM": "MiniMax sparse attention pools (MiniMaxSparseKVPool)",
    "MiniMaxM3SparseForConditionalGeneration": "MiniMax sparse attention pools (MiniMaxSparseKVPool)",
    "Glm5NextForConditionalGeneration": "GLM-5 Next hybrid KDA + DSA pools",
    "KimiK3ForConditionalGeneration": "Kimi K3 linear-attention pools",
    "FalconH1ForCausalLM": "Falcon-H1 Mamba pools",
    "MambaForCausalLM": "pure Mamba state caches",
    "Mamba2ForCausalLM": "pure Mamba state caches",
    "FalconMambaForCausalLM": "pure Mamba state caches",
    "Lfm2ForCausalLM": "LFM2 short-convolution state caches",
}
