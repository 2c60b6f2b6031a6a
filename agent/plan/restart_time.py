"""Pure: what the next restart will cost, from the last start's own phases, before it happens.

The last verified start's downtime phases (agent/host/watch/timeline.py, SGLang's own `Engine startup timings`
where it logged them) are the base; each part is then corrected for what will differ at the next start:
the page cache (warm after pre-warm, or cold), SGLang's weight-cache daemon (weights over CUDA IPC), and
the compile caches a unit can lose. The cache preconditions are checked from the units, one warning each
with its cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum

from agent.protocol.answers import HostFacts
from agent.sglang.logs.events import LogEvent, ServerArgs, WeightsBegin, WeightsEnd
from agent.sglang.logs.summary import SummaryBuilder
from agent.sglang.unitfile import AdoptError, HandUnit, read_unit

GIB = 1 << 30
# Weights from the page cache against the same weights from disk: 8.06 s -> 2.34 s (vLLM PR#52462; the
# field notes' only published pair for one checkpoint and one reader). Used only to move a known warm or
# cold weights phase to the other side; an unknown side is kept as measured.
PAGE_CACHE_SPEEDUP = 8.06 / 2.34
# An engine in --weight-cache-mode client maps the daemon's weights over CUDA IPC instead of loading them:
# ~0.63 s for Qwen3-235B FP8 on 4 x H20 (LMSYS blog, July 2026); rounded up for the socket handshake.
WEIGHT_CACHE_LOAD_S = 1.0
# What SGLang itself says a cold DeepGEMM cache costs (its log line, sglang PR#5580): "10-20 mins".
DEEPGEMM_COLD_S = (600.0, 1200.0)
# The phases a restart pays for (drain depends on the load of the moment, smoke on the prompt: kept apart).
RESTART_PHASES = ("stop", "init", "weights", "pool", "cuda_graphs", "ready")
# SGLang 0.5.23 puts Triton/Inductor under SGLANG_CACHE_DIR and DeepGEMM under SGLANG_DG_CACHE_DIR, both
# in the service user's ~/.cache/sglang unless set (srt/environ.py SGLANG_CACHE_DIR, SGLANG_DG_CACHE_DIR).
CACHE_VARIABLES = ("SGLANG_CACHE_DIR", "SGLANG_DG_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
_VOLATILE = ("/tmp/", "/run/", "/dev/shm/", "/var/tmp/")
DROP_CACHE_FLAG = "weight-loader-drop-cache-after-load"


class WeightSource(str, Enum):
    """Where the next start's weights come from."""

    PAGE_CACHE = "page_cache"  # pre-warm will have them resident
    DISK = "disk"
    UNKNOWN = "unknown"  # as the last start found them
    WEIGHT_CACHE = "weight_cache"  # SGLang's daemon holds them (client mode, fingerprint kept)


@dataclass(frozen=True)
class LastStart:
    """The last verified start: its downtime phases (seconds) and where its weights came from."""

    phases: Mapping[str, float]
    weights: WeightSource = WeightSource.UNKNOWN


@dataclass(frozen=True)
class PageCache:
    """The host's memory and the checkpoint, as the facts saw them (None: not known)."""

    weights_bytes: int | None
    mem_available_bytes: int | None
    prewarm: bool = True
    margin_bytes: int = 8 * GIB

    def fits(self) -> bool | None:
        if self.weights_bytes is None or self.mem_available_bytes is None:
            return None
        return self.weights_bytes <= self.mem_available_bytes - self.margin_bytes


@dataclass(frozen=True)
class RestartEstimate:
    seconds: float | None  # None: no verified start of this unit to estimate from
    parts: dict[str, float]
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    none_why: str = "no verified start of this unit yet"  # what `lines` says when seconds is None

    def to_dict(self) -> dict[str, object]:
        return {
            "restart_estimate_s": None if self.seconds is None else round(self.seconds, 1),
            "restart_estimate_parts": {k: round(v, 1) for k, v in self.parts.items()},
            "restart_estimate_notes": list(self.notes),
            "restart_warnings": list(self.warnings),
        }

    def lines(self) -> list[str]:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.parts.items())
        out = (
            [f"  restart estimate  {self.seconds:.0f} s ({parts})"]
            if self.seconds is not None
            else [f"  restart estimate  none: {self.none_why}"]
        )
        out += [f"    {n}" for n in self.notes]
        return out + [f"  warning: {w}" for w in self.warnings]


def next_weights(cache: PageCache, weight_cache_kept: bool) -> WeightSource:
    """Where the next start will read its weights from."""
    if weight_cache_kept:
        return WeightSource.WEIGHT_CACHE
    fits = cache.fits()
    if fits is None:
        return WeightSource.UNKNOWN
    return WeightSource.PAGE_CACHE if fits and cache.prewarm else WeightSource.DISK


def weights_seconds(measured: float, was: WeightSource, will: WeightSource) -> tuple[float, str | None]:
    """The last start's weights phase moved to the next start's source, and a note when it moved."""
    if will is WeightSource.WEIGHT_CACHE:
        return WEIGHT_CACHE_LOAD_S, (
            f"weights: mapped from the weight-cache daemon (~{WEIGHT_CACHE_LOAD_S:.0f} s) instead of "
            f"{measured:.1f} s loaded"
        )
    if was is WeightSource.DISK and will is WeightSource.PAGE_CACHE:
        return (
            measured / PAGE_CACHE_SPEEDUP,
            f"weights: {measured:.1f} s from disk last time, from page cache now",
        )
    if was is WeightSource.PAGE_CACHE and will is WeightSource.DISK:
        return (
            measured * PAGE_CACHE_SPEEDUP,
            f"weights: {measured:.1f} s from page cache last time, from disk now",
        )
    return measured, None


def estimate(
    last: LastStart, cache: PageCache, weight_cache_kept: bool = False, daemon_restart: bool = False
) -> RestartEstimate:
    """The next restart's seconds by part. daemon_restart: the daemon reloads the weights first (the
    fingerprint changed), then the engine maps them: both times are counted."""
    parts = {p: float(last.phases[p]) for p in RESTART_PHASES if p in last.phases}
    notes: list[str] = []
    measured = parts.get("weights", 0.0)
    will = next_weights(cache, weight_cache_kept or daemon_restart)
    if "weights" in parts:
        parts["weights"], note = weights_seconds(measured, last.weights, will)
        notes += [note] if note else []
    if daemon_restart:
        disk, _ = weights_seconds(measured, last.weights, next_weights(cache, False))
        parts = {"daemon": disk, **parts}
        notes.append(f"the weight-cache daemon restarts too and loads the weights first ({disk:.1f} s)")
    return RestartEstimate(sum(parts.values()), parts, tuple(notes))


def from_facts(
    facts: HostFacts, new_text: str, flags: Mapping[str, object], cache: PageCache, **restart: bool
) -> RestartEstimate:
    """The estimate and the warnings from a facts answer; restart: weight_cache_kept, daemon_restart."""
    last = last_start(facts.get("history") or []) or from_engine_timings(facts.get("last_start"))
    doc = facts.get("model_facts")
    model = doc.get("model") if doc else None
    cache = replace(cache, weights_bytes=model.get("weights_bytes") if model else None,
                    mem_available_bytes=facts.get("mem_available_bytes"))  # fmt: skip
    warnings = tuple(cache_warnings(facts.get("unit_text"), new_text, flags, cache, last))
    if last is None:
        return RestartEstimate(None, {}, (), warnings)
    return replace(estimate(last, cache, **restart), warnings=warnings)


def last_start(history: Sequence[Mapping[str, object]]) -> LastStart | None:
    """The newest verified start that logged its downtime phases, and where its weights came from."""
    for entry in reversed(history):
        down = entry.get("downtime")
        phases = down.get("phases") if isinstance(down, Mapping) else None
        if isinstance(phases, Mapping) and phases:
            prewarm = entry.get("prewarm")
            return LastStart({str(k): float(v) for k, v in phases.items()}, _source(prewarm))
    return None


def from_engine_timings(start: Mapping[str, object] | None) -> LastStart | None:
    """A start deployctl did not make (an adopted host): SGLang's own `Engine startup timings` line
    (entrypoints/engine.py), its engine phases only; init is the rest of tokenizer_e2e, the engine's whole."""
    timings = start.get("startup_timings") if start else None
    if not isinstance(timings, Mapping) or not timings:
        return None
    t = {str(k): float(v) for k, v in timings.items()}
    phases = {"weights": t.get("load_weight", 0.0), "pool": t.get("kv_cache_allocation", 0.0),
              "cuda_graphs": t.get("cuda_graph", 0.0)}  # fmt: skip
    phases["init"] = max(0.0, t.get("tokenizer_e2e", 0.0) - sum(phases.values()))
    return LastStart({p: phases[p] for p in RESTART_PHASES if p in phases})


def from_log(lines: Iterable[str], where: str = "the log") -> RestartEstimate:
    """The next restart's seconds from one start's own log (the start a plan reads from --from-log): its
    `Engine startup timings` where SGLang logged them (as from_engine_timings), else the time between the
    lines at which the log summary's phase moved (weights, pool, graphs, ready: the phases the host's
    timeline measures, agent/host/watch/timeline.py), by SGLang's own logger timestamps. A log does not hold
    the old server's stop nor the answer to /health: they are left out, and said so."""
    builder = SummaryBuilder()
    first, began, draft = _read_phases(lines, builder)
    summary = builder.summary()
    if not summary.ready:
        return RestartEstimate(None, {}, none_why=f"the start in {where} never became ready")
    timings = summary.startup_timings
    last = from_engine_timings(summary.to_dict()) if timings is not None else _timed(first, began, draft)
    if last is None:
        return RestartEstimate(None, {}, none_why=f"the start in {where} has no timestamps to time it by")
    left_out = "the old server's stop and the answer to /health after it are not in it"
    said = "SGLang's own startup timings" if timings is not None else "its lines' timestamps"
    return replace(
        estimate(last, PageCache(None, None)), notes=(f"from the start in {where} ({said}); {left_out}",)
    )


def _read_phases(
    lines: Iterable[str], builder: SummaryBuilder
) -> tuple[float | None, dict[str, float], float]:
    """Feed the start's lines to `builder`: when its init began, and when each phase did. Init begins at the
    launch (the command or its server_args line, srt/entrypoints/engine.py), not at a line before it: a
    restarted compose service's log, or one cut mid-run, puts the old process's last lines, hours older,
    ahead of the launch in the same start. A draft model's weights, loaded after the target's, are weights:
    the pool begins at the last `Load weight end` before it; one loaded after the target's graphs (an EAGLE
    draft worker) is weights too: its seconds, the third value, are moved out of the graphs."""
    began: dict[str, float] = {}
    first: float | None = None
    launched = False
    draft = _DraftLoad()
    for line in lines:
        at = _logged_at(line)
        events = builder.feed(line)
        if not launched and not began and any(_launch(e) for e in events):
            launched, first = True, None  # timed from here (or the next stamped line: a paste has none)
        first = at if first is None else first
        phase = builder.phase
        if at is not None and phase in _PHASE_PART and phase not in began:
            began[phase] = at
        elif at is not None and phase == "kv_pool" and any(isinstance(e, WeightsEnd) for e in events):
            began[phase] = at  # a draft model loads after the target (its own weights end): still weights
        elif at is not None and phase == "cuda_graphs":
            draft.feed(events, at)
    return first, began, draft.seconds


class _DraftLoad:
    """The seconds between a `Load weight begin` and its end logged while the graphs are the phase."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began: float | None = None

    def feed(self, events: Iterable[LogEvent], at: float) -> None:
        for event in events:
            if isinstance(event, WeightsBegin):
                self._began = at
            elif isinstance(event, WeightsEnd) and self._began is not None:
                self.seconds, self._began = self.seconds + max(0.0, at - self._began), None


def _launch(event: LogEvent) -> bool:
    return isinstance(event, ServerArgs) and event.source in ("command", "server_args")


def from_start(figures: Mapping[str, object] | None, where: str) -> RestartEstimate:
    """The estimate from a start's figures alone (a facts file's last start): SGLang's own startup
    timings, where that start logged them."""
    last = from_engine_timings(figures)
    if last is None:
        return RestartEstimate(None, {}, none_why=f"{where} has no startup timings")
    note = f"from {where} (SGLang's own startup timings); the old server's stop is not in them"
    return replace(estimate(last, PageCache(None, None)), notes=(note,))


# The downtime part each phase of the log summary begins (host/watch/timeline.py reads the journal alike).
_PHASE_PART = {"loading_weights": "weights", "kv_pool": "pool", "cuda_graphs": "cuda_graphs", "ready": ""}
# SGLang's logger prefix (srt/utils/common.py configure_logger): "[2026-12-01 09:59:59.020 TP0] ".
_LOGGED_AT = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)[\] ]")


def _logged_at(line: str) -> float | None:
    m = _LOGGED_AT.search(line[:200])  # the prefix is near the start, after a journal's or docker's own
    if m is None:
        return None
    try:
        return datetime.fromisoformat(m[1].replace(",", ".")).timestamp()
    except ValueError:
        return None


def _timed(first: float | None, began: Mapping[str, float], draft: float = 0.0) -> LastStart | None:
    """init from the first line to the weights, then each part until the next one began; ready ends them. A
    draft's load inside the graphs' span (`draft` seconds) is weights."""
    marks = [(began[p], part) for p, part in _PHASE_PART.items() if p in began]  # in the start's order
    if first is None or not marks or marks[-1][1] != "":
        return None
    phases: dict[str, float] = {}
    for (at, part), (end, _) in zip([(first, "init"), *marks], marks, strict=False):
        if part:
            phases[part] = phases.get(part, 0.0) + max(0.0, end - at)
    moved = min(draft, phases.get("cuda_graphs", 0.0))
    if moved and "weights" in phases:
        phases["weights"] += moved
        phases["cuda_graphs"] -= moved
    return LastStart(phases)


def _source(prewarm: object) -> WeightSource:
    """A pre-warm that read every weight file, or found them resident, left the start a warm cache."""
    if not isinstance(prewarm, Mapping) or not prewarm.get("total_bytes"):
        return WeightSource.UNKNOWN
    skip = prewarm.get("skip")
    if skip is None or "already in the page cache" in str(skip):
        return WeightSource.PAGE_CACHE
    return WeightSource.DISK if "do not fit" in str(skip) else WeightSource.UNKNOWN


def cache_warnings(
    old_text: str | None, new_text: str, flags: Mapping[str, object], cache: PageCache, last: LastStart | None
) -> list[str]:
    """The cache preconditions of the next start, one line each with what breaking it costs."""
    new = _read(new_text)
    if new is None:
        return []
    old = _read(old_text) if old_text else None
    weights = last.phases.get("weights") if last else None
    cost = f"~{weights:.0f} s of weights" if weights else "the weights' load"
    out = _compile_cache_warnings(new)
    if old is not None and _program(old) and _program(new) and _venv(old) != _venv(new):
        out.append(
            f"SGLang runs from {_venv(new)} now, {_venv(old)} before: DeepGEMM's cache is keyed to the "
            f"install path (vLLM PR#48190), so its kernels compile again: {_deepgemm()}"
        )
    if cache.fits() is False:
        assert cache.weights_bytes is not None and cache.mem_available_bytes is not None
        out.append(
            f"the checkpoint ({cache.weights_bytes / GIB:.1f} GiB) does not fit in page cache "
            f"({cache.mem_available_bytes / GIB:.1f} GiB available): every start reads it from disk ({cost})"
        )
    if flags.get(DROP_CACHE_FLAG) not in (None, False, "false") and cache.prewarm:
        out.append(
            f"--{DROP_CACHE_FLAG} evicts what pre-warm loaded once SGLang has read it: a rollback or the "
            f"next restart reads the weights from disk again ({cost}, x{PAGE_CACHE_SPEEDUP:.1f} a warm load)"
        )
    return out


def _compile_cache_warnings(unit: HandUnit) -> list[str]:
    """SGLANG_CACHE_DIR / SGLANG_DG_CACHE_DIR on a volatile path, or under another user's home."""
    out = []
    dynamic = any(d.key == "DynamicUser" and d.value.lower() in ("yes", "true", "1") for d in unit.other)
    for name in CACHE_VARIABLES:
        path = unit.environment.get(name)
        if path is None:
            continue
        if any((path.rstrip("/") + "/").startswith(v) for v in _VOLATILE):
            out.append(f"{name}={path} is not persistent: compile caches are lost on reboot: {_deepgemm()}")
        elif _owner_home(path) not in (None, unit.user or "root"):
            out.append(
                f"{name}={path} is under another user's home than the service user "
                f"{unit.user or 'root'}: it may not write there: {_deepgemm()}"
            )
    if dynamic and not any(n in unit.environment for n in CACHE_VARIABLES):
        out.append(f"DynamicUser= gives the service no persistent ~/.cache/sglang: {_deepgemm()}")
    return out


def _deepgemm() -> str:
    low, high = DEEPGEMM_COLD_S
    return f"DeepGEMM's JIT warm-up may take {low / 60:.0f}-{high / 60:.0f} min (SGLang's own log text)"


def _owner_home(path: str) -> str | None:
    if path.startswith("/root/") or path == "/root":
        return "root"
    if path.startswith("/home/"):
        return path.split("/")[2] or None
    return None


def _read(text: str) -> HandUnit | None:
    try:
        return read_unit(text)
    except AdoptError:
        return None


def _program(unit: HandUnit) -> str | None:
    if not unit.exec_start:
        return None
    word = unit.exec_start[-1].split()[0] if unit.exec_start[-1].split() else ""
    return word.lstrip("-@:+!") or None


def _venv(unit: HandUnit) -> str:
    """The folder SGLang is installed in: the interpreter's (or the sglang script's) bin/ parent."""
    program = _program(unit) or ""
    head, _, _ = program.rpartition("/bin/")
    return head or program
