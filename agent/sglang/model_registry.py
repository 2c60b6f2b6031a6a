"""Which code SGLang runs a checkpoint with: its own model class, or the Transformers backend. Stdlib only.

agent/sglang/data/model_archs-<version>.json is written from the wheel by tests/oracle/model_archs.py: the
architectures of SGLang's own registry (srt/models/registry.py) and the model classes of the transformers
release it pins. The rule is sglang/srt/model_loader/utils.py get_model_architecture and
resolve_transformers_arch: when no name in config.json's `architectures` is registered (or --model-impl is
transformers), SGLang falls back to a Transformers-backend class; a name transformers does not have either
needs config.json's auto_map to name an AutoModel (remote code), else SGLang's start refuses the model.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from agent.sglang.config_json import ModelConfig
from agent.sglang.kvpool import parse_version

# The release whose names are shipped; another version's registry is judged by it (said in the note).
NAMES_VERSION = "0.5.23"


@dataclass(frozen=True)
class KnownModels:
    sglang: frozenset[str]  # srt/models/registry.py: the EntryClass names
    transformers: frozenset[str]  # getattr(transformers, arch) finds these
    transformers_version: str


@functools.lru_cache(maxsize=1)
def known_models() -> KnownModels:
    text = (
        resources.files("agent.sglang").joinpath(f"data/model_archs-{NAMES_VERSION}.json").read_text("utf-8")
    )
    doc = json.loads(text)
    return KnownModels(
        frozenset(doc["sglang_models"]),
        frozenset(doc["transformers_models"]),
        str(doc["transformers_version"]),
    )


def _release(version: str) -> str:
    try:
        return ".".join(str(n) for n in parse_version(version)[:3])
    except ValueError:
        return version


class CannotLoad(ValueError):
    """SGLang's start would refuse this model (resolve_transformers_arch raises)."""


def transformers_fallback(config: ModelConfig, model_impl: str, version: str, family: str) -> str | None:
    """None when SGLang runs its own class of this model; else the note that says it falls back to the
    Transformers backend and what that means for the KV estimate (`family`: the pool's kind as read).
    CannotLoad where SGLang 0.5.23's start would refuse the model (another release: said, not refused, as
    its registry may have the model)."""
    archs = config.value("architectures")
    names = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    known = known_models()
    forced = model_impl == "transformers"
    if not names or (not forced and any(a in known.sglang for a in names)):
        return None
    same = _release(version) == NAMES_VERSION
    try:
        _loadable(config, names, known, forced)
    except CannotLoad as exc:
        if same:
            raise
        return (
            f"{exc}; SGLang {version}'s registry may have it (deployctl ships {NAMES_VERSION}'s names only)"
        )
    judged = "" if same else f" (judged by {NAMES_VERSION}'s registry)"
    why = "--model-impl transformers" if forced else f"not in SGLang {version}'s model registry{judged}"
    return (
        f"{names[0]}: {why}; SGLang runs it on its Transformers fallback (model_loader/utils.py "
        "resolve_transformers_arch: slower, some features unsupported); its KV pool is estimated as "
        f"{family.upper()} from config.json's layers, KV heads and head size, as SGLang's model_config.py "
        "sizes it whatever the backend: a custom config that names them otherwise is not read"
    )


def _loadable(config: ModelConfig, names: Sequence[str], known: KnownModels, forced: bool) -> None:
    """resolve_transformers_arch: each name must be a transformers class or come with auto_map's AutoModel
    (with --model-impl transformers a name with neither is let through)."""
    auto_map = config.value("auto_map")
    has_auto_model = isinstance(auto_map, dict) and "AutoModel" in auto_map
    for arch in names:
        if arch.startswith("Transformers") or arch in known.transformers or has_auto_model or forced:
            continue
        raise CannotLoad(
            f"{arch} is neither in SGLang {NAMES_VERSION}'s model registry nor a Transformers "
            f"{known.transformers_version} model class, and config.json's auto_map names no AutoModel: "
            f"SGLang {NAMES_VERSION}'s start refuses it (model_loader/utils.py resolve_transformers_arch)"
        )
