"""The simulated server's pool from SGLang 0.5.23's own sizing code (tests/oracle), not from formulas here.

The oracle client (tests/oracle/client.py, stdlib only) is found beside the sim in the work tree, or where
the test host binds it (SGLANG_SIM_ORACLE_DIR). Answers come from its disk cache, or from one run of the
real SGLang in the oracle venv (bound read-only into the test host).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from . import sizing as sz

DATA = Path(__file__).resolve().parent / "data"
# Kimi K2.6 shares K2.5's published config.json (architecture KimiK25ForConditionalGeneration).
DEFAULT_TARGET = DATA / "kimi-k2.6.json"
# The seed deployment's DFLASH draft: 3 layers of 32 KV heads x 128, as the sim has always assumed.
DEFAULT_DFLASH_DRAFT = DATA / "seed-dflash-draft.json"
SIZING_FLAGS = (
    "tp_size", "dp_size", "context_length", "mem_fraction_static", "max_running_requests", "max_total_tokens",
    "chunked_prefill_size", "kv_cache_dtype", "page_size", "attention_backend", "speculative_algorithm",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
)  # fmt: skip


def _client() -> ModuleType | None:
    places = [
        os.environ.get("SGLANG_SIM_ORACLE_DIR", ""),
        str(Path(__file__).resolve().parents[2] / "oracle"),  # the work tree
        "/opt/deployctl-oracle",  # a test host (tests/testhost/instance.py)
    ]
    for place in places:
        path = Path(place) / "client.py" if place else None
        if path and path.is_file():
            spec = importlib.util.spec_from_file_location("deployctl_oracle_client", path)
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
    return None


def flags(args: argparse.Namespace) -> list[str]:
    """The sizing flags the unit gave, as SGLang 0.5.23 spells them (defaults left to SGLang)."""
    argv: list[str] = []
    for name in SIZING_FLAGS:
        value = getattr(args, name, None)
        if (
            value is None
            or (name == "dp_size" and value == 1)
            or (name == "kv_cache_dtype" and value == "auto")
        ):
            continue
        argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


@dataclass(frozen=True)
class Configs:
    """The config.json files beside the target's and the draft's weights ({} where there is none)."""

    target: dict[str, Any]
    draft: dict[str, Any]


def request(
    args: argparse.Namespace, hw: sz.Hardware, env: dict[str, str], configs: Configs, used_gib: float
) -> dict[str, Any]:
    """What the oracle is asked: the start's flags and environment, its configs, the host's memory."""
    config, draft = configs.target, configs.draft
    target = config or json.loads(DEFAULT_TARGET.read_text())
    spec = args.speculative_algorithm
    draft_config: dict[str, Any] | None = None
    if spec == "DFLASH":
        draft_config = draft or json.loads(DEFAULT_DFLASH_DRAFT.read_text())
    elif spec in ("EAGLE", "EAGLE3", "STANDALONE"):
        draft_config = draft or None
    sglang_env = {k: v for k, v in env.items() if k.startswith("SGLANG_") and not k.startswith("SGLANG_SIM_")}
    for key, value in sz.PROFILE_ENV.get(hw.profile, {}).items():
        sglang_env.setdefault(key, value)
    profile = sz.PROFILES.get(hw.profile, {})
    return {
        "config": target,
        "draft_config": draft_config,
        "flags": flags(args),
        "env": sglang_env,
        "gpu": {
            "count": hw.gpus,
            "total_gib": hw.gpu_mem_gib,
            "pre_gib": hw.pre_gib,
            "post_gib": round(hw.pre_gib - used_gib, 6),
            "capability": list(profile.get("capability", (9, 0))),  # type: ignore[call-overload]
            "name": str(profile.get("device_name", "NVIDIA H100 80GB HBM3")),
        },
    }


def ask(req: dict[str, Any]) -> dict[str, Any] | None:
    """SGLang's answer, or None where no oracle is reached (fatal under SGLANG_SIM_ORACLE=require)."""
    client = _client()
    try:
        if client is None:
            raise RuntimeError("tests/oracle/client.py not found")
        answer: dict[str, Any] = client.ask([req])[0]
        return answer
    except Exception as exc:  # any failure: say so, then size the old way or stop
        if os.environ.get("SGLANG_SIM_ORACLE", "auto") == "require":
            raise SystemExit(f"sim: the SGLang oracle is required but failed: {exc}") from exc
        print(f"sim: no SGLang oracle ({exc}); sizing with the sim's own formulas", file=sys.stderr)
        return None
