"""What the read-only verbs answer (facts, status, backups, inspect, signal): one JSON object each,
and the records those answers carry (the lock's holder, a start in history, the facts document).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from agent.protocol.events import DowntimeData, EventJson, PrewarmData
from agent.sglang.flags import FlagInput, FlagValue
from agent.sglang.logs.summary import StartFigures


class Holder(TypedDict, total=False):
    """What the lock file records about the runner holding it (JSON): a re-run of the same apply
    re-attaches by it, and LOCKED outcomes and status answers carry it as it is."""

    pid: int | str  # "?": a runner systemd runs that has not taken the lock yet
    since: str
    verb: str
    txn: str | None
    unit: str
    unit_sha256: str | None
    target_context: int | None
    group: str  # a group's node: its group's key (protocol/requests.py Group.key)


class HistoryEntry(StartFigures, total=False):
    """One verified start in history.jsonl (facts send the last ten): its figures and its transaction's."""

    txn: str
    at: str  # ISO 8601
    sha256: str  # the unit's
    invocation: str
    start_seconds: float
    downtime: DowntimeData
    prewarm: PrewarmData | None  # the pre-warm before this start: whether its weights came from page cache


class _GpuProcessRequired(TypedDict):
    pid: int
    name: str
    used_mib: float
    unit: str | None  # its systemd unit (cgroup), None when it has none or cannot be read
    service: bool  # the service's own unit: its memory goes with the restart


class GpuProcess(_GpuProcessRequired, total=False):
    """A process on a card as the facts document carries it (card["processes"])."""

    # What it held when the running start logged its pool (host/watch/gpu_at_start.py); 0 for one that came
    # after; absent when the agent has no record of that start (the plan then takes off all it holds).
    at_start_mib: float


class GpuCard(TypedDict, total=False):
    """A card of the facts document (nvidia-smi's; the host's RAM for SGLang's CPU backend)."""

    name: str
    memory_total_mib: float
    memory_free_mib: float
    compute_capability: str  # where nvidia-smi gives one
    index: int  # nvidia-smi's index: a service's [gpus] indices name these
    processes: list[GpuProcess]  # what holds memory on it (nvidia-smi --query-compute-apps)


class ModelFact(TypedDict):
    """A local checkpoint folder: its config.json as published and its tensors' bytes."""

    config: dict[str, object]  # json.loads of config.json: read_config parses it
    weights_bytes: int | None
    path: str


class FactsDoc(TypedDict, total=False):
    """The facts document (deployctl-facts/1) that plan/facts.py reads; `device` only for the CPU backend."""

    format: str
    device: str
    gpus: list[GpuCard]
    sglang: dict[str, str | None]
    model: ModelFact
    draft: ModelFact | None
    flags: Mapping[str, FlagInput]  # the unit's (secret ones left out); deployctl's --set over them
    started_flags: Mapping[str, FlagInput]  # the unit's, where --set changed `flags` (plan/evidence.py)
    env: dict[str, str]
    last_start: str | None


class GpuRow(TypedDict):
    """A GPU as the facts verb reads nvidia-smi: the figures as it prints them."""

    index: str
    name: str
    total_mib: str
    used_mib: str


class UnitView(TypedDict):
    """The installed unit as it may leave the host: secret values replaced by ***; the real text's sha256."""

    unit_text: str | None
    unit_sha256: str | None
    flags: dict[str, FlagValue] | None


class UnitStateData(TypedDict):
    """systemd's view of a unit (host/systemd.py UnitState)."""

    unit: str
    load_state: str
    active_state: str
    sub_state: str
    invocation_id: str
    need_daemon_reload: bool
    n_restarts: int
    exec_main_status: int
    exec_main_code: int
    fragment_path: str
    active_enter_timestamp_us: int
    drop_in_paths: tuple[str, ...]


class TxnStatus(TypedDict):
    """A re-attach's question: does the host know the transaction it chose, and how did it end?"""

    id: str
    known: bool
    outcome: EventJson | None


class SignalAnswer(TypedDict, total=False):
    """The signal verb's answer: what the node's transaction has been told, and the decision that stands
    (the coordinator's, or the node's own when it gave up waiting)."""

    known: bool
    go: bool
    decision: str | None
    by: str
    reason: str
    orphan: bool


class StatusAnswer(TypedDict, total=False):
    """The status verb's answer (`deployctl status --json` prints it; followed_outcome after --follow)."""

    state: UnitStateData | None
    daemon: UnitStateData | None  # the engine's weight-cache daemon, when its unit is on the host
    running: Holder | None
    last_txn: str | None
    last_outcome: EventJson | None
    last_events: list[EventJson]
    pending: bool
    record: str
    txn: TxnStatus
    orphan: bool
    followed_outcome: object


class _BackupRowRequired(TypedDict):
    name: str
    taken: str  # ISO 8601
    size: int
    same_as_installed: bool
    changes: list[list[FlagValue | None]]


class BackupRow(_BackupRowRequired, total=False):
    """A backup of the unit, with its flag differences against the installed one: [name, backup, now]."""

    group: str  # the key of the [pd] group change that took it; absent: none (one host, [nodes], older)
    flags: dict[str, FlagValue] | None  # its SGLang flags, secret values as ***; None: unreadable


class BackupsAnswer(TypedDict, total=False):
    """The backups verb's answer, newest first (`deployctl backups --json` prints it)."""

    unit: str
    installed_sha256: str | None
    flags: dict[str, FlagValue] | None  # the installed unit's, secret values as ***
    backups: list[BackupRow]
    orphan: bool


class HomeData(TypedDict):
    """The service user's home, and whether that user can write it (SGLang's caches default to ~/.cache)."""

    path: str | None
    writable: bool


class DropInData(TypedDict, total=False):
    """A drop-in's directives as they may leave the host (secret values replaced)."""

    path: str
    lines: list[str]
    problem: str  # why it could not be read
    sets_exec_start: bool


class InspectedUnit(TypedDict, total=False):
    """What `deployctl adopt` needs of one unit (host/adopt.py); only name, fragment_path and problems
    when its file cannot be read."""

    name: str
    fragment_path: str
    problems: list[str]
    description: str | None
    user: str | None
    environment: list[list[str]]  # [name, value]: a list, as the reply's keys are sorted
    secret_environment: list[str]
    directives: list[list[str]]  # [section, key, value]
    secret_directives: list[str]
    exec_start_raw_count: int
    exec_start_prefix: str
    exec_path: str
    exec_argv: list[str]
    secret_flags: list[str]
    config_json: str | None
    sglang_version: str | None
    drop_ins: list[DropInData]
    home: HomeData | None


class InspectAnswer(TypedDict, total=False):
    """The inspect verb's answer: the units that run SGLang, and each (and the asked one) described."""

    candidates: list[str]
    units: dict[str, InspectedUnit]
    orphan: bool


class CgroupLevelData(TypedDict):
    """One level of the unit's memory cgroup (v2), from the unit's own up to the root's child."""

    path: str  # under /sys/fs/cgroup
    max: int | None  # memory.max; None: "max" (no limit)
    high: int | None  # memory.high; None: "max"
    current: int  # memory.current
    file: int  # memory.stat's active_file + inactive_file: the page cache SGLang does not count as used


class _HostMemoryBase(TypedDict):
    """The host's RAM and the service's memory cgroup, as SGLang's host-pool rule reads them
    (host/hostmem.py; plan/hostplan.py reads them back)."""

    total: int  # MemTotal, bytes
    available: int  # MemAvailable, bytes
    hugepages_total: int  # HugePages_Total x Hugepagesize, bytes (reserved: not available to a host pool)
    hugepages_free: int
    numa_nodes: int
    cgroup: list[CgroupLevelData]  # the unit's levels, innermost first; [] when it has none (not running)


class HostMemoryData(_HostMemoryBase, total=False):
    """The facts' host_memory; `siblings`: what each other service of the unit's slice holds now (its
    cgroup's memory.current less page cache, bytes, by unit name), so the host's budget gives back what a
    running neighbour holds instead of counting it twice (plan/hostplan.py)."""

    siblings: dict[str, int]


class EngineImportData(TypedDict):
    """Whether the unit's backend's engine imports with its Python (host/roles/pdfacts.py): verdict
    `importable`, `not_importable` (detail: the error's last line) or `skipped` (detail: why)."""

    backend: str
    verdict: str
    detail: str


class _PdFactsBase(TypedDict):
    importable: list[str] | None
    rdma_devices: list[str] | None


class PdFactsData(_PdFactsBase, total=False):
    """A [pd] unit's host: the transfer modules installed for the unit's Python (None: its Python is not
    known), the RDMA devices of /sys/class/infiniband (None: unreadable), and whether its backend's engine
    imports (an older agent does not say)."""

    engine: EngineImportData


class HostFacts(TypedDict, total=False):
    """The facts verb's answer: what the laptop plans from (deployctl's --set flags go over `flags`)."""

    agent_version: str
    unit_text: str | None
    unit_sha256: str | None
    flags: Mapping[str, Any] | None  # the unit's (a repeated flag's values a list), --set's over them
    state: UnitStateData | None
    last_start: StartFigures | None
    history: list[HistoryEntry]
    gpus: list[GpuRow]
    lock: Holder | None
    last_txn: str | None
    backups: list[str]
    model_facts: FactsDoc | None  # plan/facts.py reads it
    mem_available_bytes: int | None  # /proc/meminfo MemAvailable: whether the checkpoint fits in page cache
    host_memory: (
        HostMemoryData | None
    )  # the RAM and the unit's cgroup: the host pool's plan (plan/hostplan.py)
    orphan: bool
    pd: PdFactsData | None  # a prefill's or decode's unit (host/roles/pdfacts.py)


def as_facts(answer: Mapping[str, Any]) -> HostFacts:
    """A facts answer (a JSON object, as the client checked) as the agent writes it."""
    return cast(HostFacts, answer)
