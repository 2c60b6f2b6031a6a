"""Write a tiny random-weight model folder for the real SGLang: a config.json and a tokenizer trained here.

Runs in the real-SGLang venv (it needs `tokenizers`); no download. SGLang starts it with `--load-format
dummy` (random weights, no weight files), so its answers are noise: tests check usage figures, not words.

    python make_model.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

VOCAB = 2048
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,  # <|im_end|>, the ChatML turn end
}
# ChatML, as Qwen's tokenizer_config.json spells it
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def corpus() -> list[str]:
    """Text to learn merges from: this machine's standard-library docstrings plus the smoke sentence."""
    import email
    import http.client
    import json as json_mod
    import logging
    import os
    import pathlib
    import subprocess
    import textwrap
    import unittest

    texts = ["The quick brown fox jumps over the lazy dog. In one word, what animal is mentioned?"] * 50
    for module in (email, http.client, json_mod, logging, os, pathlib, subprocess, textwrap, unittest):
        for name in sorted(dir(module)):
            doc = getattr(getattr(module, name, None), "__doc__", None)
            if isinstance(doc, str):
                texts.append(doc)
    return texts


def train(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(out / "tokenizer.json"))
    ids = [tok.token_to_id(s) for s in SPECIAL]
    assert ids == [0, 1, 2], ids  # the config's token ids name them


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    train(out)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    generation = {"bos_token_id": 0, "eos_token_id": 2, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def recipe_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    stamp = out / ".model-stamp"
    if stamp.is_file() and stamp.read_text() == recipe_hash():
        return 0
    write(out)
    stamp.write_text(recipe_hash())
    print(f"real-sglang: tiny model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
