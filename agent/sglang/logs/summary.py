"""SGLang start-up logs: events per line (parse_line) and what one start said (SummaryBuilder, summarize)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

from agent.sglang.logs import events as ev
from agent.sglang.logs import failures
from agent.sglang.logs.events import LogEvent
from agent.sglang.logs.lines import parse_line

__all__ = ["PHASES", "LogEvent", "StartSummary", "SummaryBuilder", "parse_line", "summarize"]

PHASES = ("starting", "loading_weights", "kv_pool", "cuda_graphs", "ready", "failed")
_PHASE_OF = {
    "weights_begin": 1,
    "weights_progress": 1,
    "weights_end": 2,
    "kv_pool": 2,
    "memory_pool_end": 2,
    "graph_begin": 3,
    "graph_end": 3,
    "scheduler": 3,
    "uvicorn_running": 3,
    "ready": 4,
}

# Lines SGLang prints once per start, before "ready to roll" (every scheduler rank has sized its pool before
# the main process warms up and says so): read after readiness, they would be text of the serving phase.
_START_ONLY = frozenset(
    {
        "weights_begin",
        "weights_end",
        "kv_pool",
        "swa_pool",
        "memory_pool_end",
        "scheduler",
        "server_args",
        "engine_timings",
    }
)


class FailureData(TypedDict):
    kind: str
    line: str


class StartFigures(TypedDict, total=False):
    """A start's figures on the wire: StartSummary.to_dict (the keys are a contract), graph_mem_gb where a
    rank logged its CUDA graphs; the agent's history entries add their transaction's own keys; a log read
    on the laptop adds its other failed starts."""

    kv_tokens: int | None
    kv_size_gb: float | None
    draft_kv_tokens: int | None
    max_total_num_tokens: int | None
    context_len: int | None
    max_running_requests: int | None
    avail_mem_before_weights_gb: float | None
    avail_mem_after_weights_gb: float | None
    avail_mem_before_pool_gb: float | None
    available_gpu_mem_gb: float | None
    mem_fraction_static: float | None
    ready: bool
    failure: FailureData | None
    stopped: bool
    startup_timings: dict[str, float] | None
    graph_mem_gb: float
    # the other starts of the same log that failed, each with its own fraction: they bound the plan's
    # fraction (plan/failed.py), they never calibrate it (agent/sglang/logs/starts.py plan_figures)
    other_failures: list[StartFigures]
    # HiCache's host pool (the smallest rank's `Allocating kv hierarchical KV host pool` line), where logged
    host_pool_tokens: int | None
    host_pool_gb: float | None
    # its auto-size line (hicache_auto_size.py:114-123), where logged: the ratio asked and the ratio cut to
    host_pool_requested_ratio: float
    host_pool_auto_ratio: float
    # SGLang's ranks per host and the host pools pinned there (its server_args line), where logged
    host_ranks: list[int]
    # the explicit --hicache-size (GB per rank) its server_args line gave, where it gave one
    hicache_size: int


@dataclass(frozen=True)
class StartSummary:
    """What one start said; None where the log does not say. Pool figures are per GPU (per DP rank)."""

    kv_tokens: int | None
    kv_size_gb: float | None
    k_size_gb: float | None
    v_size_gb: float | None
    draft_kv_tokens: int | None
    max_total_num_tokens: int | None
    context_len: int | None
    max_running_requests: int | None
    avail_mem_before_weights_gb: float | None
    avail_mem_after_weights_gb: float | None
    avail_mem_before_pool_gb: float | None
    available_gpu_mem_gb: float | None
    mem_fraction_static: float | None
    ready: bool
    failure: ev.Failure | None
    stopped: bool = False  # the main process logged a SIGTERM: the end of this start was asked for
    startup_timings: ev.EngineTimings | None = None
    host_pool: ev.HostPool | None = None  # the smallest rank's HiCache host pool (its "kv" pool)
    host_pool_auto: ev.HostPoolAutoSize | None = None  # the first rank's HiCache auto-size line
    host_ranks: tuple[int, int] | None = None  # SGLang's ranks per host, and the host pools pinned there
    hicache_size: int | None = None  # the explicit --hicache-size the start asked, GB per rank

    def to_dict(self) -> StartFigures:
        """The machine form (the keys are a contract); k/v sizes stay out of it."""
        failure = self.failure
        timings = self.startup_timings
        return StartFigures(
            kv_tokens=self.kv_tokens,
            kv_size_gb=self.kv_size_gb,
            draft_kv_tokens=self.draft_kv_tokens,
            max_total_num_tokens=self.max_total_num_tokens,
            context_len=self.context_len,
            max_running_requests=self.max_running_requests,
            avail_mem_before_weights_gb=self.avail_mem_before_weights_gb,
            avail_mem_after_weights_gb=self.avail_mem_after_weights_gb,
            avail_mem_before_pool_gb=self.avail_mem_before_pool_gb,
            available_gpu_mem_gb=self.available_gpu_mem_gb,
            mem_fraction_static=self.mem_fraction_static,
            ready=self.ready,
            failure=None if failure is None else FailureData(kind=failure.failure_kind, line=failure.line),
            stopped=self.stopped,
            startup_timings=None if timings is None else timings.to_dict(),
            **(
                {}
                if self.host_pool is None
                else {"host_pool_tokens": self.host_pool.tokens, "host_pool_gb": self.host_pool.gb}
            ),
            **(
                {}
                if self.host_pool_auto is None
                else {
                    "host_pool_requested_ratio": self.host_pool_auto.requested_ratio,
                    "host_pool_auto_ratio": self.host_pool_auto.ratio,
                }
            ),
            **({} if self.host_ranks is None else {"host_ranks": list(self.host_ranks)}),
            **({} if self.hicache_size is None else {"hicache_size": self.hicache_size}),
        )


class SummaryBuilder:
    """Feed lines as they arrive (a followed journal or a file); ask for phase or summary at any time."""

    def __init__(self) -> None:
        self._first_begin: dict[str | None, float] = {}
        self._target_end: dict[str | None, float] = {}
        self._before_pool: dict[str | None, float] = {}
        self._draft_weights: set[str | None] = set()
        self._pools: dict[str | None, list[ev.KvPool]] = {}
        self._host_pools: dict[str | None, ev.HostPool] = {}
        self._host_auto: ev.HostPoolAutoSize | None = None
        self._host_ranks: tuple[int, int] | None = None
        self._hicache_size: int | None = None
        self._swa = False
        self._scheduler: ev.Scheduler | None = None
        self._gpu_free: list[float] = []
        self._args: dict[str, tuple[int, float | int]] = {}
        self._ready = False
        self._failure: ev.Failure | None = None  # the root cause among every failure line
        self._crash: ev.Failure | None = None  # ... among those a stop does not explain
        self._stopped = False
        self._timings: ev.EngineTimings | None = None
        self._failed_last = False
        self._args_frame = False  # the traceback being read went through SGLang's argument checks
        self._scheduler_tb = False  # ... is one a scheduler logged ("Scheduler hit an exception: Traceback")
        self._phase = 0
        self._percent: int | None = None

    @property
    def phase(self) -> str:
        """Where the start is: one of PHASES."""
        failed = self._failed_last and (not self._stopped or self._crash is not None)
        return "failed" if failed else PHASES[self._phase]

    @property
    def weights_percent(self) -> int | None:
        """The latest checkpoint-shard progress (global rank 0 prints it), None before the first bar."""
        return self._percent

    def feed(self, text: str) -> list[LogEvent]:
        """Parse one MESSAGE; the events come back with draft/target resolved from earlier lines."""
        return self.feed_events(parse_line(text))

    def feed_events(self, events: list[LogEvent]) -> list[LogEvent]:
        """feed() for a line already parsed (agent/sglang/logs/starts.py parses once to cut the log)."""
        if not events:  # most lines: skip building a resolved copy
            return events
        events = [self._resolve(e) for e in events]
        for e in events:
            self._apply(e)
        return events

    def _resolve(self, e: LogEvent) -> LogEvent:
        """A rank's second weights load is a draft; its second pool too, unless SWA sub-pools explain it."""
        if isinstance(e, ev.WeightsEnd) and not e.is_draft and e.rank in self._target_end:
            return dataclasses.replace(e, is_draft=True)
        earlier = [p for p in self._pools.get(e.rank, ()) if p.label != "index"]  # MiniMax's index pool
        if isinstance(e, ev.KvPool) and e.label is None and earlier:
            draft = e.rank in self._draft_weights or not self._swa
            return dataclasses.replace(e, is_draft=draft)
        return e

    def _apply(self, e: LogEvent) -> None:  # noqa: C901 - one branch per event kind
        if self._ready and e.kind in _START_ONLY:
            return  # the start's figures are final once it is ready; later lines are the serving phase's
        self._phase = max(self._phase, _PHASE_OF.get(e.kind, 0))
        if isinstance(e, ev.WeightsBegin):
            self._first_begin.setdefault(e.rank, e.avail_gb)
        elif isinstance(e, ev.WeightsProgress):
            self._percent = e.percent
        elif isinstance(e, ev.WeightsEnd):
            if e.is_draft:
                self._draft_weights.add(e.rank)
            else:
                self._target_end.setdefault(e.rank, e.avail_gb)
                if e.usage_gb is not None:  # weights mapped from the weight-cache daemon log no begin line
                    # model_runner.py load_model: mem usage = avail before the load - avail after it
                    self._first_begin.setdefault(e.rank, round(e.avail_gb + e.usage_gb, 2))
            if e.rank not in self._pools:
                self._before_pool[e.rank] = e.avail_gb
        elif isinstance(e, ev.KvPool):
            self._swa = self._swa or e.label in ("SWA", "Full")
            self._pools.setdefault(e.rank, []).append(e)
        elif isinstance(e, ev.SwaPool):
            self._swa = True
        elif isinstance(e, (ev.HostPool, ev.HostPoolAutoSize)):
            self._apply_host(e)
        elif isinstance(e, ev.Scheduler):
            self._scheduler = self._scheduler or e
            if e.available_gpu_mem_gb is not None:
                self._gpu_free.append(e.available_gpu_mem_gb)
        elif isinstance(e, ev.ServerArgs):
            self._apply_args(e)
        elif isinstance(e, ev.Ready):
            self._ready, self._failed_last = True, False
        elif isinstance(e, ev.Stopping):
            self._stopped = True
        elif isinstance(e, ev.EngineTimings):
            self._timings = self._timings or e
        elif isinstance(e, ev.Failure):
            self._apply_failure(e)

    def _apply_host(self, e: ev.HostPool | ev.HostPoolAutoSize) -> None:
        """HiCache's host pool (the "kv" pool, per rank) and its auto-size line (the first rank's)."""
        if isinstance(e, ev.HostPoolAutoSize):
            self._host_auto = self._host_auto or e
        elif e.label == "kv":
            self._host_pools.setdefault(e.rank, e)

    def _apply_args(self, e: ev.ServerArgs) -> None:
        rank = ev.SOURCE_RANK[e.source]
        self._host_ranks = self._host_ranks or e.host_ranks
        self._hicache_size = self._hicache_size or e.hicache_size
        for key, value in (
            ("mem_fraction_static", e.mem_fraction_static),
            ("context_length", e.context_length),
            ("max_running_requests", e.max_running_requests),
        ):
            if value is not None and (key not in self._args or self._args[key][0] < rank):
                self._args[key] = (rank, value)

    def _apply_failure(self, e: ev.Failure) -> None:
        e = self._refused(e)
        self._failed_last = True
        self._failure = _root_cause(self._failure, e)
        if not _stop_consequence(e):
            self._crash = _root_cause(self._crash, e)

    def _refused(self, e: ev.Failure) -> ev.Failure:
        """The exception that ends a traceback through SGLang's argument checks, before any scheduler ran
        (no weights, no scheduler line): a start refusal, not a scheduler's exception."""
        if e.failure_kind != ev.SCHEDULER_EXCEPTION:
            return e
        if "Traceback (most recent call last)" in e.line:
            self._args_frame, self._scheduler_tb = False, "hit an exception" in e.line
        elif failures.in_arguments(e.line):
            self._args_frame = self._args_frame or (not self._scheduler_tb and self._phase == 0)
        elif e.weight == failures.EXCEPTION:
            refused, self._args_frame = self._args_frame, False
            if refused:
                return dataclasses.replace(e, failure_kind=ev.START_REFUSED, weight=failures.CAUSE)
        return e

    def summary(self) -> StartSummary:
        """The summary of everything fed so far."""
        targets, drafts = self._split_pools()
        target = min(targets, key=lambda p: p.tokens) if targets else None
        sched = self._scheduler
        kv_tokens = sched.max_total_num_tokens if sched else None
        return StartSummary(
            kv_tokens=kv_tokens if kv_tokens is not None else (target.tokens if target else None),
            kv_size_gb=target.size_gb if target else None,
            k_size_gb=target.k_gb if target else None,
            v_size_gb=target.v_gb if target else None,
            draft_kv_tokens=min(p.tokens for p in drafts) if drafts else None,
            max_total_num_tokens=sched.max_total_num_tokens if sched else None,
            context_len=sched.context_len if sched and sched.context_len else self._arg_int("context_length"),
            max_running_requests=(
                sched.max_running_requests
                if sched and sched.max_running_requests
                else self._arg_int("max_running_requests")
            ),
            avail_mem_before_weights_gb=_min(self._first_begin.values()),
            avail_mem_after_weights_gb=_min(self._target_end.values()),
            avail_mem_before_pool_gb=_min(self._before_pool.values()),
            available_gpu_mem_gb=_min(self._gpu_free),
            mem_fraction_static=self._arg_float("mem_fraction_static"),
            ready=self._ready,
            failure=self._crash if self._stopped else self._failure,
            stopped=self._stopped,
            startup_timings=self._timings,
            host_pool=min(self._host_pools.values(), key=lambda p: p.tokens) if self._host_pools else None,
            host_pool_auto=self._host_auto,
            host_ranks=self._host_ranks,
            hicache_size=self._hicache_size,
        )

    def _split_pools(self) -> tuple[list[ev.KvPool], list[ev.KvPool]]:
        """Per rank: the target pool (a post-capture resize wins) and the draft pool, if any."""
        targets: list[ev.KvPool] = []
        drafts: list[ev.KvPool] = []
        for rank, pools in self._pools.items():
            post = [p for p in pools if p.label == "post_capture"]
            main = [p for p in pools if p.label != "index"] or pools  # MiniMax's index pool is not the pool
            targets.append(post[-1] if post else main[0])
            # SWA seen only after a rank's second line (older builds print SWAKVPool last) still counts.
            rank_drafts = [p for p in main[1:] if p.is_draft]
            if rank_drafts and (rank in self._draft_weights or not self._swa):
                drafts.append(rank_drafts[0])
        return targets, drafts

    def _arg_int(self, key: str) -> int | None:
        return int(self._args[key][1]) if key in self._args else None

    def _arg_float(self, key: str) -> float | None:
        return float(self._args[key][1]) if key in self._args else None


def summarize(lines: Iterable[str]) -> StartSummary:
    """The summary of a whole log, one MESSAGE (or pasted line) per item."""
    builder = SummaryBuilder()
    for line in lines:
        builder.feed(line)
    return builder.summary()


def _min(values: Iterable[float]) -> float | None:
    return min(values, default=None)


def start_figures(lines: Iterable[str]) -> StartFigures:
    """A start's summary plus the CUDA-graph memory one rank logged (the planner credits it per request)."""
    builder = SummaryBuilder()
    graphs: dict[str | None, float] = {}
    for line in lines:
        for event in builder.feed(line):
            if isinstance(event, ev.GraphEnd) and event.usage_gb is not None:
                graphs[event.rank] = graphs.get(event.rank, 0.0) + event.usage_gb
    figures = builder.summary().to_dict()
    if graphs:
        figures["graph_mem_gb"] = round(max(graphs.values()), 3)
    return figures


def _root_cause(current: ev.Failure | None, e: ev.Failure) -> ev.Failure:
    """Keep the first failure line, except that a line of higher weight replaces it (a named cause beats a
    bare exception line, which beats a traceback header or a "child died" consequence such as sigquit), so
    "Traceback ..." then "torch.OutOfMemoryError" ends as cuda_oom. One refinement among causes: "Capture
    cuda graph failed: CUDA out of memory" wraps the OOM printed just before it, and names the phase whose
    flags are the fix."""
    if (
        current is None
        or e.weight > current.weight
        or (current.failure_kind == ev.CUDA_OOM and e.failure_kind == ev.CUDA_GRAPH_FAILED)
    ):
        return e
    return current


def _stop_consequence(e: ev.Failure) -> bool:
    """A line that a stop explains: a child dead of the stop's signal, and the SIGQUIT its death triggers
    (utils/watchdog.py SubprocessWatchdog). Whether a stop was asked is known only at the summary: the
    watchdog's 1 s poll may log the dead child before the event loop runs the SIGTERM handler. The main
    process's own end (systemd's "Main process exited") follows every stop: SGLang kills itself last."""
    return e.failure_kind in (ev.SIGQUIT, ev.PROCESS_EXITED) or (
        e.failure_kind == ev.RANK_DIED and e.exit_code in ev.STOP_EXIT_CODES
    )
