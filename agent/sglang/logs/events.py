"""The typed events read off SGLang start-up log lines (one frozen dataclass per kind)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# Failure kinds: the root cause of a failed start, as named in reports and decisions.
NOT_ENOUGH_MEMORY = "not_enough_memory"
WEIGHTS_LEAVE_NO_MEMORY = "weights_leave_no_memory"
CUDA_OOM = "cuda_oom"
SCHEDULER_EXCEPTION = "scheduler_exception"
SIGQUIT = "sigquit"
RANK_DIED = "rank_died"
MEMORY_UNBALANCED = "memory_unbalanced"
CONTEXT_TOO_LONG = "context_too_long"
CUDA_GRAPH_FAILED = "cuda_graph_failed"
NEGATIVE_POOL = "negative_pool"
ADDRESS_IN_USE = "address_in_use"
INIT_FAILED = "init_failed"
WATCHDOG_TIMEOUT = "watchdog_timeout"
# SGLang refused its arguments before any scheduler ran: argparse's `error:` line, or an exception raised by
# its argument checks (srt/server_args.py, srt/arg_groups/*_hook.py: prepare_server_args)
START_REFUSED = "start_refused"
HOST_MEMORY_SHORT = "host_memory_short"  # HiCache's host pool refused (agent/sglang/logs/hicache.py)
# A PD decode whose page size or KV dtype text differs from its prefill's (agent/sglang/logs/pd.py)
PD_PAGE_SIZE_MISMATCH = "pd_page_size_mismatch"
PD_KV_DTYPE_MISMATCH = "pd_kv_dtype_mismatch"
# The same handshake's other refusals (srt/disaggregation/common/conn.py:1336-1418): the KV layout (DSV4's
# attention backend), DSpark's layout, attention TP sizes a model's pages cannot be resliced across, and a
# decode's DCP a peer or pool does not take
PD_KV_LAYOUT_MISMATCH = "pd_kv_layout_mismatch"
PD_DSPARK_LAYOUT_MISMATCH = "pd_dspark_layout_mismatch"
PD_ATTN_TP_MISMATCH = "pd_attn_tp_mismatch"
PD_DECODE_DCP_UNSUPPORTED = "pd_decode_dcp_unsupported"
# Mooncake's own refusals before its first RDMA write (srt/disaggregation/mooncake/conn.py:1306-1324, :2315):
# --enable-unified-memory across attention TP sizes, or its whole-envelope KV layout against the peer's, and
# Mamba state slots of different sizes
PD_UNIFIED_MEMORY_TP_MISMATCH = "pd_unified_memory_tp_mismatch"
PD_UNIFIED_MEMORY_LAYOUT_MISMATCH = "pd_unified_memory_layout_mismatch"
PD_MAMBA_SLOT_MISMATCH = "pd_mamba_slot_mismatch"
# A PD decode received KV that is not what its prefill sent (SGLang drops that request and serves on)
PD_KV_CHECKSUM_MISMATCH = "pd_kv_checksum_mismatch"
# What the kernel and systemd say of the service's end (agent/sglang/logs/system.py): the kernel's OOM killer
# ended a process (host RAM, not GPU memory), and the main process exited without SGLang saying why
HOST_OOM_KILLED = "host_oom_killed"
PROCESS_EXITED = "process_exited"

FAILURE_KINDS = frozenset(
    {
        NOT_ENOUGH_MEMORY,
        WEIGHTS_LEAVE_NO_MEMORY,
        CUDA_OOM,
        SCHEDULER_EXCEPTION,
        SIGQUIT,
        RANK_DIED,
        MEMORY_UNBALANCED,
        CONTEXT_TOO_LONG,
        CUDA_GRAPH_FAILED,
        NEGATIVE_POOL,
        ADDRESS_IN_USE,
        INIT_FAILED,
        WATCHDOG_TIMEOUT,
        HOST_MEMORY_SHORT,
        START_REFUSED,
        PD_PAGE_SIZE_MISMATCH,
        PD_KV_DTYPE_MISMATCH,
        PD_KV_LAYOUT_MISMATCH,
        PD_DSPARK_LAYOUT_MISMATCH,
        PD_ATTN_TP_MISMATCH,
        PD_DECODE_DCP_UNSUPPORTED,
        PD_UNIFIED_MEMORY_TP_MISMATCH,
        PD_UNIFIED_MEMORY_LAYOUT_MISMATCH,
        PD_MAMBA_SLOT_MISMATCH,
        PD_KV_CHECKSUM_MISMATCH,
        HOST_OOM_KILLED,
        PROCESS_EXITED,
    }
)
# Kinds that say "something died" without saying why; a later line usually names the cause.
GENERIC_FAILURE_KINDS = frozenset({SCHEDULER_EXCEPTION, SIGQUIT, RANK_DIED, INIT_FAILED, PROCESS_EXITED})


@dataclass(frozen=True)
class WeightsBegin:
    kind: ClassVar[str] = "weights_begin"
    rank: str | None
    avail_gb: float


@dataclass(frozen=True)
class WeightsProgress:
    kind: ClassVar[str] = "weights_progress"
    rank: str | None
    percent: int
    n: int
    total: int


@dataclass(frozen=True)
class WeightsEnd:
    kind: ClassVar[str] = "weights_end"
    rank: str | None
    avail_gb: float
    usage_gb: float | None
    model_type: str | None
    is_draft: bool


@dataclass(frozen=True)
class KvPool:
    """One `KV Cache is allocated` line; size_gb is the KV size, or K + V for MHA."""

    kind: ClassVar[str] = "kv_pool"
    rank: str | None
    tokens: int
    size_gb: float | None
    k_gb: float | None
    v_gb: float | None
    dtype: str | None
    label: str | None  # "SWA", "Full", "va_upper_bound", "post_capture" or None
    is_draft: bool


@dataclass(frozen=True)
class SwaPool:
    """A sliding-window model's pool split: its extra KV lines are sub-pools, not a draft pool."""

    kind: ClassVar[str] = "swa_pool"
    rank: str | None
    full_tokens: int | None
    swa_tokens: int | None


@dataclass(frozen=True)
class MemoryPoolEnd:
    kind: ClassVar[str] = "memory_pool_end"
    rank: str | None
    avail_gb: float


@dataclass(frozen=True)
class GraphBegin:
    kind: ClassVar[str] = "graph_begin"
    rank: str | None
    avail_gb: float | None


@dataclass(frozen=True)
class GraphEnd:
    kind: ClassVar[str] = "graph_end"
    rank: str | None
    avail_gb: float | None
    usage_gb: float | None


@dataclass(frozen=True)
class Scheduler:
    kind: ClassVar[str] = "scheduler"
    rank: str | None
    max_total_num_tokens: int | None
    context_len: int | None
    max_running_requests: int | None
    chunked_prefill_size: int | None
    available_gpu_mem_gb: float | None


@dataclass(frozen=True)
class ServerArgs:
    """Resolved settings; source ranks how much to trust them (see SOURCE_RANK)."""

    kind: ClassVar[str] = "server_args"
    rank: str | None
    mem_fraction_static: float | None
    context_length: int | None
    max_running_requests: int | None
    source: str  # "command", "server_args", "error", "auto_reduce"
    # SGLang's ranks per host (its host-pool divisor) and the host pools pinned there (x DP replicas)
    host_ranks: tuple[int, int] | None = None
    hicache_size: int | None = (
        None  # --hicache-size (GB per rank) where explicit: its pool's padding is known
    )


# A later-resolved value beats an earlier one: flags < printed ServerArgs < value quoted by an error
# < the multimodal auto-reduction, which happens after ServerArgs is printed.
SOURCE_RANK = {"command": 0, "server_args": 1, "error": 2, "auto_reduce": 3}


@dataclass(frozen=True)
class UvicornRunning:
    kind: ClassVar[str] = "uvicorn_running"
    rank: str | None
    url: str


@dataclass(frozen=True)
class Ready:
    kind: ClassVar[str] = "ready"
    rank: str | None


@dataclass(frozen=True)
class Failure:
    """A failure line; weight ranks lines of one failure: 0 header/consequence, 1 exception, 2 cause."""

    kind: ClassVar[str] = "failure"
    rank: str | None
    failure_kind: str
    line: str
    weight: int
    min_fraction: float | None = None
    exit_code: int | None = None  # a dead rank's, where the line says it ("crashed with exit code -15")


# A child killed by these signals, once the main process has been asked to stop, is the stop itself:
# systemd's default KillMode=control-group sends SIGTERM to every process of the unit, a Ctrl-C SIGINT.
STOP_EXIT_CODES = frozenset({-15, -2})


@dataclass(frozen=True)
class EngineTimings:
    """`Engine startup timings (s): ...` (entrypoints/engine.py _set_startup_time, >= 0.5.2x), printed by the
    main process once every scheduler rank is up: the engine's own seconds, each the maximum over ranks
    (observability/startup_time.py). tokenizer_e2e runs from the engine's launch of its subprocesses."""

    kind: ClassVar[str] = "engine_timings"
    rank: str | None
    load_weight_s: float
    kv_cache_allocation_s: float
    scheduler_e2e_s: float
    cuda_graph_s: tuple[tuple[str, float], ...]  # per capture phase: prefill, decode, target_verify, ...
    tokenizer_e2e_s: float

    @property
    def cuda_graphs_total_s(self) -> float:
        return sum(seconds for _, seconds in self.cuda_graph_s)

    def to_dict(self) -> dict[str, float]:
        """The machine form: the downtime phases' figures (see agent/host/watch/timeline.py)."""
        return {
            "load_weight": self.load_weight_s,
            "kv_cache_allocation": self.kv_cache_allocation_s,
            "scheduler_e2e": self.scheduler_e2e_s,
            "cuda_graph": round(self.cuda_graphs_total_s, 3),
            "tokenizer_e2e": self.tokenizer_e2e_s,
        }


@dataclass(frozen=True)
class Stopping:
    """The main process was asked to stop (managers/tokenizer_manager.py SignalHandler.sigterm_handler)."""

    kind: ClassVar[str] = "stopping"
    rank: str | None
    signal: str


@dataclass(frozen=True)
class Draining:
    """SGLang's own SIGTERM drain, logged every 5 s until nothing is left; `remaining` 0 is its last line,
    right before the process ends (managers/tokenizer_manager.py sigterm_watchdog)."""

    kind: ClassVar[str] = "draining"
    rank: str | None
    remaining: int


@dataclass(frozen=True)
class HostPool:
    """`Allocating <label> hierarchical KV host pool: N tokens, X GB host memory.` (HiCache's host tier, one
    per rank and pool: srt/mem_cache/pool_host/base.py:259-278); draft_layers for the packed-MTP form."""

    kind: ClassVar[str] = "host_pool"
    rank: str | None
    label: str
    tokens: int
    gb: float  # decimal GB, 2 decimals
    draft_layers: int | None = None


@dataclass(frozen=True)
class HostPoolAutoSize:
    """`HiCache auto-sizing: ratio R -> R'; X GiB host memory per rank (fraction F, N ranks on this host),
    host pools Y GiB.` (srt/mem_cache/hicache_auto_size.py:114-123)."""

    kind: ClassVar[str] = "host_pool_auto_size"
    rank: str | None
    requested_ratio: float
    ratio: float
    budget_gib: float
    fraction: float
    ranks_per_host: int
    pools_gib: float


@dataclass(frozen=True)
class HostMemoryHeadroom:
    """`HiCache memory headroom: host X GiB, cgroup Y GiB` (srt/mem_cache/host_memory.py:155-160): printed
    only where a memory cgroup limit is found."""

    kind: ClassVar[str] = "host_memory_headroom"
    rank: str | None
    host_gib: float
    cgroup_gib: float


LogEvent = (
    WeightsBegin
    | WeightsProgress
    | WeightsEnd
    | KvPool
    | SwaPool
    | MemoryPoolEnd
    | GraphBegin
    | GraphEnd
    | Scheduler
    | ServerArgs
    | UvicornRunning
    | Ready
    | EngineTimings
    | Stopping
    | Draining
    | HostPool
    | HostPoolAutoSize
    | HostMemoryHeadroom
    | Failure
)
