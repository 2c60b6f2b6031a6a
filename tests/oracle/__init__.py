"""An oracle no one here wrote: SGLang 0.5.23's own KV-pool sizing, run on the CPU against simulated GPUs.

`size(config, flags, env, gpu)` answers what SGLang would allocate; the work is done by the real SGLang wheel
in a venv built by `make oracle` (tests/oracle/build-venv.sh), answers are cached on disk by a hash of the
inputs (client.py). Nothing here repeats SGLang's or the planner's arithmetic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.oracle import client
from tests.oracle.client import OracleUnavailable, venv_ready

MODELS = Path(__file__).resolve().parents[1] / "data/models"
__all__ = [
    "GpuFigures",
    "OracleRefusal",
    "OracleResult",
    "OracleUnavailable",
    "size",
    "size_many",
    "venv_ready",
]


@dataclass(frozen=True)
class GpuFigures:
    """One simulated host: what torch.cuda reports on every rank (all ranks alike)."""

    count: int
    total_gib: float
    pre_gib: float  # free before the weights (after the CUDA context and communication buffers)
    post_gib: float  # free after the target and draft weights, when the pool is sized
    capability: tuple[int, int] = (9, 0)
    name: str = "NVIDIA H100 80GB HBM3"

    def as_request(self) -> dict[str, Any]:
        return {**asdict(self), "capability": list(self.capability)}


@dataclass(frozen=True)
class OracleResult:
    """What SGLang 0.5.23 resolved and sized (per GPU; per attention-DP rank where that applies)."""

    pool_tokens: int  # max_total_num_tokens
    max_running_requests: int
    context_len: int
    mem_fraction_static: float
    page_size: int
    attention_backend: str
    kv_cache_dtype: str
    cell_bytes: float | None  # bytes per token the pool is sized with, draft share included (SWA: blended)
    draft_cell_bytes: int | None  # the DFLASH draft's share of cell_bytes
    mm_reservation_gib: float  # multimodal reservation taken from the budget
    full_tokens: int | None = None  # hybrid sliding-window: full-attention pool
    swa_tokens: int | None = None  # hybrid sliding-window: window pool
    mamba_slots: int | None = None  # linear-attention hybrids: state-cache slots
    attention_arch: str = ""
    pool_configurator: str = ""
    logs: list[str] = field(default_factory=list, compare=False, repr=False)


class OracleRefusal(Exception):
    """SGLang itself refused the start (for example: no memory left for the pool)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


def request(
    config: Mapping[str, Any],
    flags: Mapping[str, Any] | Sequence[str],
    env: Mapping[str, str],
    gpu: GpuFigures,
    draft_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON request the worker takes; flags as {"tp-size": 8, "enable-x": True} or a ready argv."""
    if isinstance(flags, Mapping):
        argv: list[str] = []
        for name, value in flags.items():
            if value is False or value is None:
                continue
            argv += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    else:
        argv = list(flags)
    return {
        "config": dict(config),
        "draft_config": dict(draft_config) if draft_config is not None else None,
        "flags": argv,
        "env": {k: str(v) for k, v in env.items()},
        "gpu": gpu.as_request(),
    }


def result_from_answer(answer: Mapping[str, Any]) -> OracleResult:
    if not answer.get("ok"):
        raise OracleRefusal(str(answer.get("error_type")), str(answer.get("message")))
    return OracleResult(
        pool_tokens=int(answer["max_total_num_tokens"]),
        max_running_requests=int(answer["max_running_requests"]),
        context_len=int(answer["context_len"]),
        mem_fraction_static=float(answer["mem_fraction_static"]),
        page_size=int(answer["page_size"]),
        attention_backend=str(answer["attention_backend"]),
        kv_cache_dtype=str(answer["kv_cache_dtype"]),
        cell_bytes=answer.get("cell_bytes"),
        draft_cell_bytes=answer.get("draft_cell_bytes"),
        mm_reservation_gib=float(answer.get("mm_reservation_gib") or 0.0),
        full_tokens=answer.get("full_max_total_num_tokens"),
        swa_tokens=answer.get("swa_max_total_num_tokens"),
        mamba_slots=answer.get("max_mamba_cache_size"),
        attention_arch=str(answer.get("attention_arch", "")),
        pool_configurator=str(answer.get("pool_configurator", "")),
        logs=list(answer.get("logs", [])),
    )


def size(
    config: Mapping[str, Any],
    flags: Mapping[str, Any] | Sequence[str],
    env: Mapping[str, str],
    gpu: GpuFigures,
    draft_config: Mapping[str, Any] | None = None,
) -> OracleResult:
    """SGLang 0.5.23's pool for one start; raises OracleRefusal where SGLang refuses to start."""
    return result_from_answer(client.ask([request(config, flags, env, gpu, draft_config)])[0])


def size_many(requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Raw answers for many requests (see `request`), in one SGLang run per GPU kind."""
    return client.ask(requests)


def load_model(name: str) -> dict[str, Any]:
    """A stored real config: tests/data/models/<name>/config.json."""
    data: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return data


def stored_models() -> list[str]:
    return sorted(p.parent.name for p in MODELS.glob("*/config.json"))
