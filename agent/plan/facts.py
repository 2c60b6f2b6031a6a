"""The facts format (deployctl-facts/1): what a host knows, enough to plan offline.

A file other tools may write by hand; `deployctl facts HOST --json` prints it. It is validated here with
pydantic (unknown keys are kept, not refused: the format grows) and turned into one PlanInput, the value
the pool model takes. The inventory becomes the same value (plan/from_inventory.py), so one planner
plans both.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, model_validator

from agent.errors import UsageError
from agent.inventory import MAX_GIB, FlagValue, HostConfig, Planning
from agent.plan.hostbudget import RamShare, ServiceNeed
from agent.plan.model import StartFigures
from agent.plan.overhead import GpuProcess
from agent.plan.startcheck import StartIdentity, alike, identity
from agent.protocol.answers import CgroupLevelData, HostMemoryData
from agent.sglang import flagrules, server_args
from agent.sglang.config_json import ModelConfig
from agent.sglang.logs.decor import split_lines
from agent.sglang.logs.starts import evidence, plan_figures, split
from agent.sglang.logs.summary import start_figures

FORMAT = "deployctl-facts/1"
MIB = 2**20


class _Open(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)


class GpuProcessFact(_Open):
    pid: int = Field(ge=0)
    name: str = ""
    used_mib: float = Field(ge=0, le=MAX_GIB * 1024)
    unit: str | None = None
    service: bool = False
    # what it held when the last start measured its free memory, where the host recorded it
    at_start_mib: float | None = Field(default=None, ge=0, le=MAX_GIB * 1024)


class GpuFact(_Open):
    name: str = "GPU"
    # strict, as the inventory's TOML is typed: "81559" or true is a mistake, not a number
    memory_total_mib: StrictFloat = Field(gt=0, le=MAX_GIB * 1024)
    memory_free_mib: StrictFloat | None = Field(default=None, ge=0, le=MAX_GIB * 1024)
    compute_capability: str | None = Field(default=None, pattern=r"^[0-9]+\.[0-9]+$")
    index: StrictInt | None = Field(
        default=None, ge=0
    )  # nvidia-smi's: a service keeps its own ([gpus] indices)
    processes: list[GpuProcessFact] = Field(default_factory=list)  # nvidia-smi --query-compute-apps


class SglangFact(_Open):
    version: str


class ModelFact(_Open):
    config: dict[str, object]  # config.json as decoded: ModelConfig reads it
    weights_bytes: StrictInt | None = Field(
        default=None, ge=0, le=2**46
    )  # 64 TiB: a whole checkpoint, all ranks
    path: str | None = None


class LoadFact(_Open):
    """The last load check's long-prompt figures ([smoke] load; agent/host/watch/loadcheck.py)."""

    decode_ms_per_token: float | None = Field(default=None, gt=0)
    long_prompt_tokens: int | None = Field(default=None, gt=0)


class CgroupLevelFact(_Open):
    """One level of the unit's memory cgroup, as the facts verb reports it (agent/host/hostmem.py)."""

    path: str
    max: StrictInt | None = Field(ge=0)
    high: StrictInt | None = Field(ge=0)
    current: StrictInt = Field(ge=0)
    file: StrictInt = Field(ge=0)


class HostMemoryFact(_Open):
    """The host's RAM and the unit's cgroup (the facts verb's host_memory): HiCache's host pool is sized
    and checked against it (plan/hostplan.py). Bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    total: StrictInt = Field(gt=0, le=2**50)
    available: StrictInt = Field(ge=0, le=2**50)
    hugepages_total: StrictInt = Field(default=0, ge=0)
    hugepages_free: StrictInt = Field(default=0, ge=0)
    numa_nodes: StrictInt = Field(default=1, ge=1)
    cgroup: list[CgroupLevelFact] = Field(default_factory=list)
    siblings: dict[str, Annotated[int, Field(strict=True, ge=0)]] | None = None

    @model_validator(mode="after")
    def _within_total(self) -> HostMemoryFact:
        """/proc/meminfo cannot say more available (or huge pages) than MemTotal: a hand-edited or mixed-up
        file is refused, not planned against."""
        if self.available > self.total:
            raise ValueError(f"available ({self.available}) is more than total ({self.total})")
        if self.hugepages_free > self.hugepages_total or self.hugepages_total > self.total:
            raise ValueError("hugepages_free <= hugepages_total <= total, in bytes")
        return self

    def data(self) -> HostMemoryData:
        out = cast(HostMemoryData, self.model_dump(exclude_none=True, exclude={"cgroup", "siblings"}))
        out["cgroup"] = [cast(CgroupLevelData, lv.model_dump()) for lv in self.cgroup]
        if self.siblings is not None:
            out["siblings"] = dict(self.siblings)
        return out


class FactsFile(_Open):
    format: Literal["deployctl-facts/1"]
    gpus: list[GpuFact] = Field(min_length=1)
    sglang: SglangFact
    model: ModelFact
    draft: ModelFact | None = None
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    last_start: str | None = None
    device: Literal["cuda", "cpu"] | None = None  # "cpu": gpus[0] is the host's RAM (MemTotal, MemAvailable)
    load: LoadFact | None = None  # the last load check, where one ran
    # The flags the host's starts ran under, where --set changed `flags` since (agent/apply.py with_set_flags)
    started_flags: dict[str, FlagValue] | None = None
    planning: Planning | None = None  # the margin and the memory floor, where the person states them
    host_memory: HostMemoryFact | None = None  # the host's RAM and the unit's cgroup (HiCache's host pool)


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_total_mib: float
    compute_capability: tuple[int, int] | None = None
    memory_free_mib: float | None = None
    processes: tuple[GpuProcess, ...] = ()  # what holds memory on it now

    @property
    def memory_gib(self) -> float:
        return self.memory_total_mib / 1024


@dataclass(frozen=True)
class ModelInput:
    """One checkpoint: its config.json and its tensors' bytes (whole checkpoint, all ranks together)."""

    config: ModelConfig
    weights_bytes: int | None
    path: str | None = None
    # False: the config does not state the model's context (an inventory without model.max_context), so
    # SGLang's refusal of a longer one is not predicted (its 2048 fallback would be a guess)
    context_known: bool = True

    def __post_init__(self) -> None:
        # A config.json handed in as decoded (a tool's, a test's) is wrapped here, once.
        if not isinstance(self.config, ModelConfig):
            object.__setattr__(self, "config", ModelConfig.of(self.config))


@dataclass(frozen=True)
class PlanInput:
    """Everything the pool model needs about one host, and where each figure came from."""

    name: str
    gpus: tuple[Gpu, ...]
    sglang_version: str
    model: ModelInput
    draft: ModelInput | None
    flags: Mapping[str, FlagValue]
    env: Mapping[str, str] = field(default_factory=dict)
    starts: tuple[StartFigures, ...] = ()  # earlier starts, oldest first
    sources: Mapping[str, str] = field(default_factory=dict)  # figure -> where it came from
    device: str | None = None  # "cpu": SGLang's CPU backend, gpus[0] is the host's RAM
    planning: Planning = field(default_factory=Planning)  # the margin and the memory floor
    # Figures the source lacks (an inventory without model.kv_heads...): an earlier start must stand in.
    gaps: tuple[str, ...] = ()
    # What the first starts' logs say they ran (plan/evidence.py checks them against the plan), and the flags
    # they ran under (a facts file's own, before --set): a cell-changing flag since then is scaled.
    start_ids: tuple[StartIdentity, ...] = ()
    start_flags: Mapping[str, FlagValue] | None = None
    decode: tuple[float, int | None] | None = None  # the last load check's decode ms/token, at its context
    host_memory: HostMemoryData | None = None  # the host's RAM and the unit's cgroup (HiCache's host pool)
    neighbours: tuple[ServiceNeed, ...] = ()  # the other services of the host, for the host's memory budget
    weight_cache: bool = False  # the service runs SGLang's weight-cache daemon ([weight_cache] enabled)
    unit_memory_limit: int | RamShare | None = (
        None  # a MemoryMax=/MemoryHigh= of the unit's own [Service] lines
    )

    @property
    def gpu(self) -> Gpu:
        """The smallest card: SGLang's figures are minima over ranks (get_available_gpu_memory)."""
        return min(self.gpus, key=lambda g: g.memory_total_mib)

    @property
    def sm_major(self) -> int | None:
        caps = [g.compute_capability for g in self.gpus if g.compute_capability is not None]
        return min(caps)[0] if caps else None


def _capability(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    major, minor = text.split(".")
    return int(major), int(minor)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{where}: {err['msg'].removeprefix('Value error, ')}"


def parse_facts(data: Any, name: str = "facts") -> PlanInput:
    """A decoded facts document -> PlanInput; a bad one is a usage error naming the first bad key."""
    if isinstance(data, Mapping) and data.get("format") not in (None, FORMAT):
        raise UsageError(f"{name}: format {data.get('format')!r} is not {FORMAT!r}")
    try:
        facts = FactsFile.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"{name}: {_first_error(exc)}") from None
    _check_flags(facts, name)
    starts: tuple[StartFigures, ...] = ()
    ids: tuple[StartIdentity, ...] = ()
    if facts.last_start:
        # the host's last start, pasted or as the agent read it: the one start it holds is the evidence
        held = split(split_lines(facts.last_start))
        start = evidence(held)
        lines = start.lines if start is not None else ()
        starts = (plan_figures(alike(held, start), start) if start is not None else start_figures(lines),)
        ids = (identity(lines),)
    device = facts.flags.get("device")
    return PlanInput(
        name=name,
        gpus=tuple(_gpu(g) for g in facts.gpus),
        sglang_version=facts.sglang.version,
        model=_model(facts.model, "config.json"),
        draft=_model(facts.draft, "the draft's config.json") if facts.draft is not None else None,
        flags=dict(facts.flags),
        env=dict(facts.env),
        starts=starts,
        sources=_sources(facts, name),
        device=facts.device or (str(device).lower() if device else None),
        start_ids=ids,
        start_flags=dict(facts.started_flags) if facts.started_flags is not None else _ran(facts, ids),
        decode=_decode(facts.load),
        planning=facts.planning or Planning(),
        host_memory=facts.host_memory.data() if facts.host_memory is not None else None,
    )


def _check_flags(facts: FactsFile, name: str) -> None:
    """The flags by the rules the inventory's [sglang.flags] and --set follow: SGLang's own table, then the
    values its start cannot run with (sglang/flagrules.py). The running unit's --port, --host and
    --model-path are facts here, not settings: they are kept."""
    try:
        flagrules.canonical_flags(facts.flags, facts.sglang.version, f"{name}: flags")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    table = server_args.table_for(facts.sglang.version)
    for flag, said in server_args.problems(facts.sglang.version, facts.flags):
        # bad input, but for a flag this release removed: a unit written for an earlier one may carry it,
        # and the plan's verdict names it
        if table is None or flag not in table.removed:
            raise UsageError(f"{name}: flags.{flag}: {said}")
    for flag, value in facts.flags.items():
        problem = flagrules.value_problem(flagrules.canonical(flag, facts.sglang.version), value)
        if problem:
            raise UsageError(f"{name}: flags.{flag}: {problem}")


def _gpu(g: GpuFact) -> Gpu:
    processes = tuple(
        GpuProcess(p.pid, p.name, p.used_mib, p.unit, p.service, p.at_start_mib) for p in g.processes
    )
    return Gpu(g.name, g.memory_total_mib, _capability(g.compute_capability), g.memory_free_mib, processes)


def _ran(facts: FactsFile, ids: tuple[StartIdentity, ...]) -> dict[str, FlagValue] | None:
    """The flags a facts file's own last start ran under: the file's."""
    return dict(facts.flags) if ids else None


def _decode(load: LoadFact | None) -> tuple[float, int | None] | None:
    if load is None or load.decode_ms_per_token is None:
        return None
    return load.decode_ms_per_token, load.long_prompt_tokens


def _model(m: ModelFact, where: str) -> ModelInput:
    return ModelInput(config=ModelConfig(m.config, where), weights_bytes=m.weights_bytes, path=m.path)


def _sources(facts: FactsFile, name: str) -> dict[str, str]:
    """Where each figure of a facts file came from, for the plan's notes."""
    sources = {
        "gpus": f"{name}: gpus ({_cards(facts.gpus)})",
        "architecture": f"{name}: model.config",
        "weights": f"{name}: model.weights_bytes" if facts.model.weights_bytes is not None else "absent",
        "flags": f"{name}: flags",
    }
    if facts.last_start:
        sources["calibration"] = f"{name}: last_start"
    return sources


def _cards(gpus: Sequence[GpuFact]) -> str:
    """The cards by kind; mixed kinds name the smallest, which sizes the plan (SGLang's figures are minima
    over ranks, get_available_gpu_memory)."""
    counts = Counter(g.name for g in gpus)
    kinds = " + ".join(f"{n} x {kind}" for kind, n in counts.items())
    if len(counts) == 1:
        return kinds
    smallest = min(gpus, key=lambda g: g.memory_total_mib)
    return f"{kinds}: mixed cards, sized from the smallest, {smallest.name} (SGLang takes the minimum)"


def service_gpus(rows: Sequence[object], host: HostConfig) -> list[object]:
    """The host's GPU rows (nvidia-smi's, with their index) that this service runs on, in its order: a
    service of a shared host plans on its own GPUs, their count and their memory. A GPU that gpus.indices
    names and nvidia-smi does not list is bad input; rows without an index (a facts file written by hand,
    the CPU backend's RAM) are kept as they are."""
    pinned = host.gpu_set
    indexed = [r for r in rows if isinstance(r, Mapping) and isinstance(r.get("index"), int)]
    if pinned is None or not rows or len(indexed) != len(rows):
        return list(rows)
    by_index = {r["index"]: r for r in indexed}
    missing = [i for i in pinned if i not in by_index]
    if missing and host.gpus.indices is None:  # the default 0..count-1: what the host has of it
        return [by_index[i] for i in pinned if i in by_index] or list(rows)
    if missing:
        listed = ", ".join(str(i) for i in sorted(by_index))
        raise UsageError(
            f"{host.name}: gpus.indices names GPU {', '.join(map(str, missing))}, "
            f"but nvidia-smi on the host lists GPUs {listed}"
        )
    return [by_index[i] for i in pinned]


def load_facts(path: Path) -> PlanInput:
    """Read a facts file; unreadable or not JSON is a usage error."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--facts {str(path)!r}: cannot read: {exc.strerror or exc}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raise UsageError(
            f"--facts {str(path)!r}: starts with a UTF-8 BOM (byte order mark): save it without one"
        )
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"--facts {str(path)!r}: not JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"--facts {str(path)!r}: not a facts file: JSON nested too deeply") from None
    return parse_facts(data, name=path.name)
