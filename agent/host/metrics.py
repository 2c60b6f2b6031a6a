"""Metrics for alerting: a node_exporter textfile (`.prom`) written atomically after every run.

node_exporter's textfile collector reads every `*.prom` file of its folder at each scrape; a file it reads
half-written would be dropped, so the file is written to a temp name and renamed. Counters (rollbacks) and
the last success survive between runs in the agent's own state.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from agent.host.watch.timeline import downtime
from agent.protocol.events import Event, Outcome, Stage
from agent.protocol.requests import Request

SUCCESS = (Outcome.APPLIED, Outcome.UP_TO_DATE)
# A phase lasts from its stage's first event to the next phase's first event.
PHASES = (Stage.BACKUP, Stage.WRITE, Stage.RELOAD, Stage.RESTART, Stage.WATCH, Stage.READY, Stage.SMOKE)


@dataclass(frozen=True)
class Run:
    """What one run came to, read off its outcome and its events."""

    host: str
    unit: str
    outcome: Outcome
    at: float  # seconds since the epoch
    target_tokens: int | None = None
    predicted_tokens: int | None = None
    pool_tokens: int | None = None
    unit_sha256: str | None = None
    downtime_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    drain: dict[str, float] = field(default_factory=dict)  # in_flight, finished, cut, seconds
    downtime_phases: dict[str, float] = field(default_factory=dict)  # timeline's: drain, stop, weights, ...
    host_pool_tokens: int | None = None  # HiCache: the host pool per rank the last start logged
    host_pool_gb: float | None = None
    planned_host_pool: int | None = None  # ... and the one the plan sized
    host_budget_pinned: int | None = None  # the host memory the plan's budget pins (bytes), all services
    host_budget_capacity: int | None = None  # ... of what the host (or its slice) has for it


def timings(events: Iterable[Event]) -> tuple[float | None, dict[str, float]]:
    """(restart downtime, seconds per transaction stage) from a transaction's events.

    The downtime is timeline's: from the restart job to the new server's smoke answer, or to the old
    server's return after a rollback.
    """
    events = list(events)
    first: dict[str, float] = {}
    for e in events:
        with contextlib.suppress(ValueError):
            first.setdefault(e.stage, datetime.fromisoformat(e.ts.replace("Z", "+00:00")).timestamp())
    seen: list[tuple[str, float]] = [(s.value, first[s.value]) for s in PHASES if s.value in first]
    ends = [t for _, t in seen[1:]] + ([max(first.values())] if seen else [])
    phases = {name: round(max(0.0, end - start), 3) for (name, start), end in zip(seen, ends, strict=True)}
    return downtime(events).seconds, phases


class _Textfile:
    """The textfile's lines: each metric's HELP and TYPE once, before its first sample."""

    def __init__(self, labels: str) -> None:
        self.labels = labels
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, value: float | None, extra: str = "") -> None:
        if value is None:
            return
        if not any(line.startswith(f"# HELP {name} ") for line in self.lines):
            self.lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"))
        number = str(int(value)) if float(value).is_integer() else repr(float(value))  # full precision
        self.lines.append(f"{name}{{{self.labels}{extra}}} {number}")


def _host_budget_metrics(out: _Textfile, run: Run) -> None:
    """HiCache's host budget as the plan counted it (where the host's memory was read)."""
    out.metric(
        "deployctl_host_budget_pinned_bytes",
        "gauge",
        "The host memory the plan's budget pins: every service's host pools, processes, daemons, headroom.",
        run.host_budget_pinned,
    )
    out.metric(
        "deployctl_host_budget_capacity_bytes",
        "gauge",
        "The host memory (or its slice's limit) the plan's budget had for it.",
        run.host_budget_capacity,
    )


def prom_text(run: Run, rollbacks_total: int, last_success: float | None) -> str:
    """The textfile, metric names and help texts after Prometheus' conventions."""
    out = _Textfile(f'host="{_escape(run.host)}",unit="{_escape(run.unit)}"')
    _outcome_metrics(out, run, rollbacks_total, last_success)
    _pool_metrics(out, run)
    _drain_metrics(out, run)
    return "\n".join(out.lines) + "\n"


def _outcome_metrics(out: _Textfile, run: Run, rollbacks_total: int, last_success: float | None) -> None:
    metric = out.metric
    metric("deployctl_last_run_timestamp_seconds", "gauge", "When deployctl last ran on this unit.", run.at)
    for o in Outcome:
        if o is not Outcome.LOCKED:
            metric(
                "deployctl_last_run_outcome",
                "gauge",
                "1 for the outcome of the last run, 0 for the others.",
                float(o is run.outcome),
                f',outcome="{o.value}"',
            )
    metric(
        "deployctl_last_run_exit_code",
        "gauge",
        "The exit code of the last run.",
        int(run.outcome.exit_code),
    )
    metric(
        "deployctl_last_success_timestamp_seconds",
        "gauge",
        "When a run last ended applied or up to date.",
        last_success,
    )
    metric("deployctl_rollbacks_total", "counter", "Changes rejected and rolled back.", rollbacks_total)


def _pool_metrics(out: _Textfile, run: Run) -> None:
    metric = out.metric
    metric(
        "deployctl_kv_pool_tokens", "gauge", "The KV pool the last verified start logged.", run.pool_tokens
    )
    metric(
        "deployctl_target_context_tokens",
        "gauge",
        "The context the last change had to reach.",
        run.target_tokens,
    )
    metric("deployctl_predicted_pool_tokens", "gauge", "The pool the plan predicted.", run.predicted_tokens)
    metric(
        "deployctl_host_pool_tokens",
        "gauge",
        "HiCache's host pool per rank the last start logged (its smallest rank).",
        run.host_pool_tokens,
    )
    metric("deployctl_host_pool_gigabytes", "gauge", "The same host pool per rank, in GB.", run.host_pool_gb)
    metric(
        "deployctl_planned_host_pool_tokens",
        "gauge",
        "The host pool per rank the plan sized.",
        run.planned_host_pool,
    )
    _host_budget_metrics(out, run)
    metric(
        "deployctl_restart_downtime_seconds",
        "gauge",
        "From the restart to the first ready start in the last run.",
        run.downtime_s,
    )


def _drain_metrics(out: _Textfile, run: Run) -> None:
    """The drain's figures, the phases' seconds and the installed unit's sha256."""
    metric = out.metric
    for state in ("in_flight", "finished", "cut"):
        metric(
            "deployctl_drain_requests",
            "gauge",
            "Requests of the old server at the last restart's drain: in flight when it began, finished, cut.",
            run.drain.get(state),
            f',state="{state}"',
        )
    metric(
        "deployctl_drain_seconds",
        "gauge",
        "From the last drain's start until the old server stopped answering.",
        run.drain.get("seconds"),
    )
    _phase_metrics(out, run)


def _phase_metrics(out: _Textfile, run: Run) -> None:
    """Where the downtime went, deployctl's own stages, and the installed unit's sha256."""
    metric = out.metric
    for phase, seconds in run.downtime_phases.items():
        metric(
            "deployctl_downtime_phase_seconds",
            "gauge",
            "Seconds of the last restart's downtime per phase (drain, stop, weights, pool, ...).",
            seconds,
            f',phase="{phase}"',
        )
    for phase, seconds in run.phases.items():
        metric(
            "deployctl_phase_seconds",
            "gauge",
            "Seconds per phase of the last run.",
            seconds,
            f',phase="{phase}"',
        )
    if run.unit_sha256:
        metric(
            "deployctl_unit_info",
            "gauge",
            "The installed unit's sha256 (1 for the current one).",
            1,
            f',sha256="{run.unit_sha256}"',
        )


def record_run(state_file: Path, prom_file: Path, run: Run) -> None:
    """Update the counters kept in `state_file`, then write the textfile atomically (0644)."""
    try:
        kept = json.loads(state_file.read_text())
        kept = kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        kept = {}
    rollbacks = int(kept.get("rollbacks_total") or 0) + (run.outcome is Outcome.ROLLED_BACK)
    last_success = run.at if run.outcome in SUCCESS else kept.get("last_success")
    if run.pool_tokens is None:  # a run that started nothing (a no-op): the running start's pool stands
        run = replace(run, pool_tokens=_int(kept.get("pool_tokens")))
    state = {"rollbacks_total": rollbacks, "last_success": last_success, "pool_tokens": run.pool_tokens}
    _write(state_file, json.dumps(state), 0o600)
    _write(prom_file, prom_text(run, rollbacks, last_success), 0o644)


def run_from(
    req: Request, outcome: Outcome, at: float, data: Mapping[str, object], events: Iterable[Event]
) -> Run:
    summary = data.get("summary")
    pool = summary.get("kv_tokens") if isinstance(summary, dict) else None
    events = list(events)
    seconds, phases = timings(events)
    return Run(
        req.host_name,
        req.unit,
        outcome,
        at,
        _int(data.get("target_context")),
        _int(data.get("planned_pool")),
        _int(pool),
        str(data["unit_sha256"]) if data.get("unit_sha256") else None,
        seconds,
        phases,
        _drain_figures(data.get("drain")),
        downtime(events).phases,
        _int(summary.get("host_pool_tokens")) if isinstance(summary, dict) else None,
        _float(summary.get("host_pool_gb")) if isinstance(summary, dict) else None,
        _int(data.get("planned_host_pool")),
        _int(data.get("host_budget_pinned")),
        _int(data.get("host_budget_capacity")),
    )


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _drain_figures(drain: object) -> dict[str, float]:
    if not isinstance(drain, dict) or drain.get("end") in ("off", "no_load"):
        return {}
    keys = ("in_flight", "finished", "cut", "seconds")
    return {k: float(drain[k]) for k in keys if isinstance(drain.get(k), (int, float))}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _write(path: Path, text: str, mode: int) -> None:
    """A temp file beside `path`, then a rename, all relative to the folder's fd: never through a link.

    The textfile folder may have other writers (Debian gives /var/lib/prometheus to `prometheus`), and
    this runs as root: the temp name is unpredictable and opened exclusively without following links, the
    folder itself is opened without following a link and refused unless root owns it.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700 if mode == 0o600 else 0o755)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        owner = os.fstat(dfd).st_uid
        if owner != os.geteuid():
            raise PermissionError(
                errno.EPERM,
                f"{path.parent} is not owned by root (uid {owner}): its owner could redirect the write",
            )
        tmp = f".{path.name}.tmp.{os.getpid()}.{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            with open(fd, "w", encoding="utf-8", closefd=False) as f:
                f.write(text)
            os.fchmod(fd, mode)
            os.fsync(fd)
            os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)  # replaces a link, never follows it
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        finally:
            os.close(fd)
        os.fsync(dfd)
    finally:
        os.close(dfd)
