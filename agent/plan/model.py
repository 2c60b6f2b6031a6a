"""A host's KV pool at any fraction (PoolModel), and the figures of an earlier start that fit it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from agent.errors import UsageError
from agent.inventory import FlagValue, HostConfig
from agent.sglang import kvpool
from agent.sglang.kvpool import GIB
from agent.sglang.logs.summary import (
    StartFigures as StartFigures,
)  # one start as the log parser summarises it
from agent.sglang.pools import PoolSizer

# Within this, the measured bytes per token are the architecture's cell seen through 2-decimal logs.
CELL_AGREEMENT = 0.015
# CUDA graphs are captured for batch sizes up to min(--max-running-requests, --cuda-graph-max-bs); part of
# their memory is per captured size, part is fixed (the shared pool, the largest graph's buffers). We credit
# half of the logged graph memory as scaling with the largest captured batch size: conservative, so a
# lower --max-running-requests is never assumed to free more than it does.
GRAPH_SCALING_SHARE = 0.5
SPEC_DEFAULT_REQUESTS = 48  # EAGLE, DFLASH and DSPARK reset an unset --max-running-requests to 48
DEFAULT_GRAPH_MAX_BS = 512  # SGLang's decode max bs for TP >= 4 on 60-160 GB cards (server_args)
Basis = Literal["calibrated", "architecture"]
Flags = Mapping[str, FlagValue]


@dataclass(frozen=True)
class PoolModel:
    """pre/post free memory (GiB, minimum over ranks), bytes per token, and what the runtime needs."""

    pre_gib: float
    post_gib: float
    cell_bytes: float
    basis: Basis
    runtime_gib: float  # graphs + activations (+ draft weights before 0.5.14); req_to_token is added per plan
    runtime_measured: bool
    page_size: int = 1
    max_total_tokens: int | None = None
    dp: int = 1  # attention-DP ranks: each owns a pool and its share of the requests
    notes: tuple[str, ...] = ()
    graph_gib: float = 0.0  # CUDA-graph memory the calibration start logged (0: unknown)
    graph_bs: int = 0  # the largest batch size that start captured
    graph_max_bs: int = DEFAULT_GRAPH_MAX_BS
    # The family's own sizing (hybrid SWA, state caches, reservations); None: the plain cell rule.
    sizer: PoolSizer | None = None
    # Uncertainty of pre (and so post) without an earlier start: fractions are chosen for the low end.
    margin_gib: float = 0.0
    # SGLang's own change to the fraction given (AMD aiter above 8k context: x 0.85); 1 = as given.
    fraction_scale: float = 1.0
    # The checkpoint's attention and KV heads (0: unknown), for SGLang's TP divisibility asserts.
    heads: tuple[int, int] = (0, 0)
    # Taken after the pool and the graphs, out of the slack (--enable-symm-mem's pre-allocation).
    prealloc_gib: float = 0.0
    partial: str | None = None  # calibrated on a start that was cut short: what it did not show
    # What the verdict line says of the evidence besides its basis: a cell scaled from a start under other
    # flags, memory other processes hold since the start (plan/predict.py)
    said: tuple[str, ...] = ()
    # Flag combinations SGLang refuses at start for this model (plan/startrefusals.py)
    refused: tuple[str, ...] = ()

    def basis_said(self) -> str:
        """The basis as the verdict line says it: a partial start is named there."""
        return self.basis if self.partial is None else f"{self.basis}, partial start"

    def pool(self, fraction: float) -> int:
        fraction *= self.fraction_scale
        if self.sizer is not None:
            return self.sizer.tokens(self.post_gib - self.pre_gib * (1.0 - fraction))
        paging = kvpool.Paging(self.page_size, self.max_total_tokens)
        return kvpool.pool_tokens(self.pre_gib, self.post_gib, fraction, self.cell_bytes, paging)

    def state_cap(self, fraction: float) -> int | None:
        """The request cap a hybrid model's state cache sets at this fraction (per attention-DP worker);
        None without one (sglang/pools.py MambaShare.request_cap)."""
        if self.sizer is None or self.sizer.mamba is None:
            return None
        rest = self.post_gib - self.pre_gib * (1.0 - fraction * self.fraction_scale)
        return self.sizer.mamba.request_cap(rest - self.sizer.reserve_gib)

    def low(self) -> PoolModel:
        """The interval's low end: pre and post lower by the margin (the weights stay what they are); a
        calibrated model has no margin, so it is its own low end."""
        if not self.margin_gib:
            return self
        return replace(self, pre_gib=self.pre_gib - self.margin_gib, post_gib=self.post_gib - self.margin_gib,
                       margin_gib=0.0)  # fmt: skip

    def pool_low(self, fraction: float) -> int:
        return self.low().pool(fraction)

    def min_fraction(self, tokens: int) -> float | None:
        """The smallest 0.001 step whose pool's low end holds tokens."""
        if self.sizer is None and not self.margin_gib and self.fraction_scale == 1.0:
            paging = kvpool.Paging(self.page_size, self.max_total_tokens)
            return kvpool.min_fraction(self.pre_gib, self.post_gib, self.cell_bytes, tokens, paging)
        return kvpool.search_fraction(self.low().pool, tokens)

    def scaled_cell(self, ratio: float) -> PoolModel:
        """The same host with every KV byte per token times ratio (another dtype, another TP)."""
        sizer = None if self.sizer is None else replace(self.sizer, cell_bytes=self.sizer.cell_bytes * ratio)
        return replace(self, cell_bytes=self.cell_bytes * ratio, sizer=sizer)

    def cell_bytes_effective(self) -> float:
        return self.sizer.effective_cell() if self.sizer is not None else self.cell_bytes

    def need_gib(self, requests: int, context: int) -> float:
        """Memory the runtime takes from the slack: the measured part plus req_to_token for this plan."""
        table = kvpool.req_to_token_bytes(req_rows(requests, self.dp), context) / GIB
        return self.runtime_gib + self.prealloc_gib - self.graph_credit_gib(requests) + table

    def graph_credit_gib(self, requests: int) -> float:
        """CUDA-graph memory freed (or, above the calibration start's count, taken) by this request count."""
        if not self.graph_gib or not self.graph_bs or not requests:
            return 0.0
        bs = min(requests, self.graph_max_bs)
        return GRAPH_SCALING_SHARE * self.graph_gib * (1 - bs / self.graph_bs)

    def reserve_gib(self, fraction: float, requests: int, context: int) -> float:
        """Free memory per GPU once the server is up (SGLang's available_gpu_mem): slack minus the need."""
        return self.pre_gib * (1.0 - fraction * self.fraction_scale) - self.need_gib(requests, context)

    def max_fraction(self, requests: int, context: int, floor_gib: float) -> float | None:
        """The highest fraction (0.001 steps) that still leaves floor_gib free per GPU."""
        top = (1.0 - (self.need_gib(requests, context) + floor_gib) / self.pre_gib) / self.fraction_scale
        fraction = min(kvpool.floor_fraction(top), 0.999)
        return fraction if fraction > 0 else None

    def tokens_per_step(self) -> int:
        return kvpool.tokens_per_step(self.pre_gib, self.cell_bytes_effective())


def req_rows(requests: int, dp: int) -> int:
    """req_to_token rows per DP worker: the user value split over DP, plus the padding row (>= 0.5.16)."""
    return max(1, requests // dp) + 1


def flag(flags: Flags, *names: str) -> FlagValue | None:
    """The first of several spellings of one flag."""
    for name in names:
        if name in flags:
            return flags[name]
    return None


def parallelism(host: HostConfig, flags: Flags) -> tuple[int, int]:
    """(tp, attention-DP size) from the flags; TP defaults to 1, as SGLang's does."""
    tp = int(str(flag(flags, "tp-size", "tensor-parallel-size", "tp") or 1))
    dp_attn = flag(flags, "attn-dp-size")
    if dp_attn is None and flag(flags, "enable-dp-attention"):
        dp_attn = flag(flags, "dp-size")
    return tp, max(1, int(dp_attn or 1))


def version(host: HostConfig) -> tuple[int, int, int, int]:
    try:
        return kvpool.parse_version(host.sglang.version)
    except ValueError as exc:
        raise UsageError(f"sglang.version: {exc}") from None


def architecture_cell(
    host: HostConfig, flags: Flags, kv_dtype: str | None = None
) -> tuple[int | None, list[str]]:
    """Bytes per token with the draft term, or None and the inventory keys that are missing."""
    m, d = host.model, host.draft
    tp, dp = parallelism(host, flags)
    attn_tp = max(1, tp // dp)
    dtype = kv_dtype or str(flag(flags, "kv-cache-dtype") or "auto")
    try:
        elem = kvpool.kv_elem_bytes(dtype, m.dtype_bytes)
        draft_elem = kvpool.kv_elem_bytes(str(flag(flags, "speculative-draft-kv-cache-dtype") or dtype), elem)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    need = (
        ["layers", "kv_lora_rank", "qk_rope_head_dim"]
        if m.attention == "mla"
        else ["layers", "kv_heads", "head_dim"]
    )
    missing = [f"model.{k}" for k in need if getattr(m, k) is None]
    if missing:
        return None, missing
    assert m.layers is not None
    if m.attention == "mla":
        assert m.kv_lora_rank is not None and m.qk_rope_head_dim is not None
        cell = kvpool.mla_cell(m.kv_lora_rank, m.qk_rope_head_dim, m.layers, elem)
    else:
        assert m.kv_heads is not None and m.head_dim is not None
        heads = kvpool.Heads(m.kv_heads, m.head_dim, m.v_head_dim or m.head_dim)
        cell = kvpool.gqa_cell(heads, m.layers, elem, attn_tp)
    if d is None:
        return cell, []
    try:
        draft_heads = None
        if d.kv_heads is not None and d.head_dim is not None:
            draft_heads = kvpool.Heads(d.kv_heads, d.head_dim)
        draft = kvpool.DraftKV(d.algorithm, d.layers, draft_heads, draft_elem)
        return kvpool.with_draft(cell, draft, version=version(host), layers=m.layers, attn_tp=attn_tp), []
    except ValueError:
        keys = ["layers"] if d.algorithm != "DFLASH" else ["layers", "kv_heads", "head_dim"]
        return None, [f"draft.{k}" for k in keys if getattr(d, k) is None] or [f"draft ({d.algorithm})"]


@dataclass(frozen=True)
class Start:
    pre: float
    post: float
    fraction: float
    tokens: int
    available: float | None
    requests: int | None
    context: int | None
    graph: float | None = None
    fraction_logged: bool = True  # its log said the fraction (server_args); else the plan's stands in


def start_of(figures: StartFigures, flags: Flags) -> Start | None:
    """One earlier start's figures, or None when it lacks the pool or the memory lines."""
    post = figures.get("avail_mem_before_pool_gb") or figures.get("avail_mem_after_weights_gb")
    pre = figures.get("avail_mem_before_weights_gb")
    tokens = figures.get("kv_tokens") or figures.get("max_total_num_tokens")
    fraction = figures.get("mem_fraction_static") or flag(flags, "mem-fraction-static")
    if not (pre and post and tokens and fraction):
        return None
    requests = figures.get("max_running_requests") or flag(flags, "max-running-requests")
    context = figures.get("context_len") or flag(flags, "context-length")
    available = figures.get("available_gpu_mem_gb")
    graph = figures.get("graph_mem_gb")
    return Start(
        float(pre), float(post), float(fraction), int(tokens),
        None if available is None else float(available),
        None if requests is None else int(requests),
        None if context is None else int(context),
        None if graph is None else float(graph),
        bool(figures.get("mem_fraction_static")),
    )  # fmt: skip


def with_graphs(model: PoolModel, starts: Sequence[Start], flags: Flags) -> PoolModel:
    """The model with the CUDA-graph memory of the latest start that logged it, for crediting a lower
    request count (GRAPH_SCALING_SHARE); unchanged when none did."""
    max_bs_flag = flag(flags, "cuda-graph-max-bs-decode", "cuda-graph-max-bs")
    max_bs = int(str(max_bs_flag)) if max_bs_flag else DEFAULT_GRAPH_MAX_BS
    for s in reversed(starts):
        if s.graph and s.requests and s.available is not None:
            return replace(model, graph_gib=s.graph, graph_bs=min(s.requests, max_bs), graph_max_bs=max_bs)
    return model


def runtime_need(starts: Sequence[Start], model: PoolModel) -> tuple[float, bool]:
    """The largest measured graphs-and-activations need, req_to_token taken out (it is re-added per plan)."""
    needs = [
        s.pre * (1 - s.fraction) - s.available - model.need_gib(s.requests or 0, s.context or 0)
        for s in starts
        if s.available is not None
    ]
    return (max(needs), True) if needs else (0.0, False)
