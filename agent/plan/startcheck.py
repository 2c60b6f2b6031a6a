"""Calibrate only on a start of this model: what a start-up log says it ran, against what is planned.

The architecture is the `type=` of the first `Load weight end` line (model_runner.py logs the target before
any draft). TP, PP, the KV cache dtype, the page size, the speculative algorithm and the model path come
from the `server_args` line, in either form SGLang logs it (0.5.23's dict, earlier releases' `ServerArgs(...)`
repr); without it, the KV dtype from the target's pool line. The GPU shows in `Load weight begin. avail
mem=` (free memory per card before the weights), which no card of this host could exceed. A start of
another model, TP, PP or on bigger cards is refused with one line; one with another KV dtype, page size or
draft calibrates, its measured cell scaled by the architecture's ratio (plan/evidence.py as_started), and
the plan's verdict line says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.sglang.logs.starts import LoggedStart

_TYPE = re.compile(r"Load weight end\..*?\btype=([A-Za-z0-9_]+)")
_PRE = re.compile(r"Load weight begin\. avail mem=(\d+(?:\.\d+)?) ?GB")
# The KV pool's dtype as the pool logs it (mem_cache/memory_pool.py: "KV Cache is allocated. dtype:
# {self.dtype}", the logical dtype) or as earlier releases said it ("Using KV cache dtype: torch.X"):
# the --kv-cache-dtype a start without its server_args line ran. float16 is only ever auto's (SGLang
# refuses it as a flag), and whether auto meant it is the model's to say: left unknown.
_KV_DTYPE = re.compile(r"(?:KV Cache is allocated\. dtype|Using KV cache dtype): torch\.(\w+)")
_TORCH_KV = {
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "float8_e5m2fnuz": "fp8_e5m2",
}
# SGLang's "GB" is GiB (utils get_available_gpu_memory divides by 1 << 30); a card never has more free than
# it has, but the driver's total and torch's view differ by a few hundred MiB
_CARD_SLACK_GIB = 0.5
# What a rank holds before its weights (CUDA context, NCCL) is a few per cent of a card (ct200: 2.8 of
# 95.6 GiB); a start that found more than this share missing did not run on a clean card of this kind.
_SHORT_CARD = 0.15


def _arg(name: str, value: str) -> re.Pattern[str]:
    """One keyword of the server_args line in either form SGLang logs: `ServerArgs(tp_size=8, ...)` (the
    dataclass repr) or `server_args={'tp_size': 8, ...}` (0.5.23, entrypoints/engine.py)."""
    return re.compile(r"[(,{]\s*'?" + name + r"'?\s*[=:]\s*" + value)


_ARG = {
    "tp": _arg("tp_size", r"(\d+)"),
    "pp": _arg("pp_size", r"(\d+)"),
    "kv_dtype": _arg("kv_cache_dtype", r"'([^']*)'"),
    "model_path": _arg("model_path", r"'([^']*)'"),
}
# Cell-changing flags a start's server_args states besides the KV dtype (plan/evidence.py CELL_FLAGS): a
# draft added or removed since, or another page size, scales the measured cell. None: the flag unset.
_CELL_ARG = {
    "page-size": _arg("page_size", r"(None|\d+)"),
    "speculative-algorithm": _arg("speculative_algorithm", r"(None|'[^']*')"),
}

# Flags a start's server_args states that change what the runtime takes after the pool (its graphs, DeepEP's
# buffers): a start under other values measured another need (plan/predict.py _runtime_since).
_RUNTIME_ARG = {
    "disable-cuda-graph": _arg("disable_cuda_graph", r"(True|False)"),
    "cuda-graph-backend-decode": _arg("cuda_graph_backend_decode", r"(None|'[^']*')"),
    "moe-a2a-backend": _arg("moe_a2a_backend", r"(None|'[^']*')"),
    "deepep-mode": _arg("deepep_mode", r"(None|'[^']*')"),
}
# 0.5.23 also logs the resolved graph config: decode graphs SGLang itself turned off show there.
_RESOLVED_DECODE_OFF = re.compile(r"'cuda_graph_config': \{'decode': \{'backend': 'disabled'")


@dataclass(frozen=True)
class StartIdentity:
    """What a start ran; None where its log does not say."""

    architecture: str | None = None
    model_path: str | None = None
    tp: int | None = None
    pp: int | None = None
    kv_dtype: str | None = None
    pre_gib: float | None = None  # free memory per GPU before the weights (the first rank that logged it)
    loads: int = 0  # `Load weight end` lines of the first rank to log one: the target, then a draft
    # the cell-changing flags server_args states, as (flag, value or None when unset)
    cell_flags: tuple[tuple[str, str | None], ...] = ()
    # the flags server_args states that change the runtime's need after the pool (_RUNTIME_ARG)
    runtime_flags: tuple[tuple[str, str | None], ...] = ()


def _runtime_flags(line: str) -> tuple[tuple[str, str | None], ...]:
    found = {k: m[1].strip("'") for k, p in _RUNTIME_ARG.items() if (m := p.search(line))}
    if _RESOLVED_DECODE_OFF.search(line):
        found["cuda-graph-backend-decode"] = "disabled"
    return tuple((k, None if v in ("None", "False") else v.lower()) for k, v in found.items())


def identity(lines: Iterable[str]) -> StartIdentity:
    found: dict[str, str] = {}
    loads = 0
    runtime: tuple[tuple[str, str | None], ...] = ()
    for line in lines:
        if _TYPE.search(line) and ("TP0" in line or "TP" not in line):
            loads += 1
        if "architecture" not in found and (m := _TYPE.search(line)):
            found["architecture"] = m[1]
        if "pre" not in found and (m := _PRE.search(line)):
            found["pre"] = m[1]
        if (
            "pool_dtype" not in found
            and ("TP0" in line or "TP" not in line)
            and (m := _KV_DTYPE.search(line))
        ):
            found["pool_dtype"] = m[1]
        if "ServerArgs(" in line or "server_args=" in line:
            runtime = runtime or _runtime_flags(line)
            for key, pattern in (*_ARG.items(), *_CELL_ARG.items()):
                if key not in found and (m := pattern.search(line)):
                    found[key] = m[1]
    cell = tuple((k, None if found[k] == "None" else found[k].strip("'")) for k in _CELL_ARG if k in found)
    return StartIdentity(
        found.get("architecture"),
        found.get("model_path"),
        int(found["tp"]) if "tp" in found else None,
        int(found["pp"]) if "pp" in found else None,
        found.get("kv_dtype") or _TORCH_KV.get(found.get("pool_dtype", "")),
        float(found["pre"]) if "pre" in found else None,
        loads,
        cell,
        runtime,
    )


@dataclass(frozen=True)
class Planned:
    """What the plan is for."""

    architecture: str | None  # config.json architectures[0], where known
    model_path: str
    tp: int
    pp: int
    kv_dtype: str
    card_gib: float | None = None  # the host's GPU memory per card


def refusal(start: StartIdentity, planned: Planned) -> str | None:
    """Why the start is not one of this model in this layout (one line), or None."""
    if start.architecture and planned.architecture and start.architecture != planned.architecture:
        return f"a start of {start.architecture}, not of this host's {planned.architecture}"
    if not planned.architecture and start.model_path and _name(start.model_path) != _name(planned.model_path):
        return f"a start of {start.model_path}, not of this host's {planned.model_path}"
    if start.tp is not None and start.tp != planned.tp:
        return f"a start at tensor parallel {start.tp}; the plan is for {planned.tp}"
    if start.pp is not None and start.pp != planned.pp:
        return f"a start at pipeline parallel {start.pp}; the plan is for {planned.pp}"
    if start.pre_gib is not None and planned.card_gib and start.pre_gib > planned.card_gib + _CARD_SLACK_GIB:
        return (
            f"a start with {start.pre_gib:g} GiB free per GPU before the weights, more than this host's "
            f"{planned.card_gib:g} GiB cards hold: a start on other GPUs"
        )
    return None


def short_card(start: StartIdentity, planned: Planned) -> str | None:
    """A start that found far less free memory than this host's cards hold (ran on smaller cards, or beside
    another process): it still calibrates, the pool SGLang sizes from the free memory it finds
    (model_runner.py: the memory before the weights) only growing on a clean card, but it is said."""
    if start.pre_gib is None or not planned.card_gib:
        return None
    missing = planned.card_gib - start.pre_gib
    if missing <= _SHORT_CARD * planned.card_gib:
        return None
    return (
        f"the earlier start had {start.pre_gib:g} GiB free per GPU before the weights, {missing:.1f} GiB "
        f"less than this host's {planned.card_gib:g} GiB cards hold: it ran on smaller GPUs, or beside "
        "another process; the plan is calibrated to its memory, so on a clean card the pool will be larger "
        "than predicted"
    )


def alike(starts: Sequence[LoggedStart], start: LoggedStart) -> list[LoggedStart]:
    """The log's starts of the evidence start's configuration (architecture, model path, TP, PP, where both
    logs say them): a failed start of another layout or model bounds only its own (plan/failed.py)."""
    ran = identity(start.lines)

    def same(other: StartIdentity) -> bool:
        pairs = [(other.architecture, ran.architecture), (other.tp, ran.tp), (other.pp, ran.pp)]
        if other.model_path and ran.model_path:
            pairs.append((_name(other.model_path), _name(ran.model_path)))
        return all(a is None or b is None or a == b for a, b in pairs)

    return [s for s in starts if s is start or same(identity(s.lines))]


def _name(path: str) -> str:
    """A model folder's last name: /models/Kimi-K2.6 and /data/Kimi-K2.6/ are the same model."""
    return path.rstrip("/").rsplit("/", 1)[-1].lower()
