"""The inventory: one TOML file per host under units/, validated into frozen pydantic models."""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.errors import InventoryError, UsageError
from agent.pd.spec import Held, Pd, pd_holdings, role_problem
from agent.protocol import textrules
from agent.protocol.addresses import host_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Bounds of the figures a file gives: far beyond any real host, small enough that arithmetic stays exact
# and finite (an int() of an infinite size, a range() of 1e21 layers).
MAX_GIB = 65536.0  # memory per GPU, weights per GPU, floors and margins
MAX_LAYERS = 4096
MAX_DIM = 65536  # heads, head dimensions, ranks
MAX_TOKENS = 2**31  # context lengths, prompt sizes
HOUR, WEEK = 3600.0, 7 * 86400.0  # timeouts
VISIBLE = "CUDA_VISIBLE_DEVICES"


Text = Annotated[str, AfterValidator(textrules.no_control)]
GroupName = Annotated[str, AfterValidator(textrules.group_name)]
AbsPath = Annotated[str, AfterValidator(textrules.no_control), AfterValidator(textrules.absolute)]
FlagValue = str | int | float | bool


class _Model(BaseModel):
    # allow_inf_nan: TOML spells inf and nan, and no figure of a host is either
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Ssh(_Model):
    target: Text = Field(description="an alias from ~/.ssh/config, or user@host[:port]; 'local' runs here")
    sudo: bool = False
    connect_attempts: int = Field(default=3, ge=1, le=20)
    connect_timeout_s: float = Field(default=10.0, gt=0, le=HOUR)
    agent_dir: AbsPath = "/var/lib/deployctl"
    python: AbsPath = "/usr/bin/python3"


MAX_GPUS = 64
GpuIndex = Annotated[int, Field(ge=0, lt=MAX_GPUS)]


class Gpus(_Model):
    count: int = Field(
        ge=1, le=MAX_GPUS,
        description="the GPUs this service runs on (all of the host's when it is the host's only service); "
        "may be left out when `indices` is given, and must equal their number when both are",
    )  # fmt: skip
    memory_gib: float = Field(gt=0, le=MAX_GIB, description="per GPU, as the driver reports it")
    name: Text = "GPU"
    indices: list[GpuIndex] | None = Field(
        default=None, min_length=1, max_length=MAX_GPUS,
        description="the host's GPUs this service runs on, as nvidia-smi numbers them: the unit gets "
        "`CUDA_VISIBLE_DEVICES` (in this order) and `CUDA_DEVICE_ORDER=PCI_BUS_ID`; unset: GPUs 0 to "
        "count-1, and no variable",
    )  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _count_from_indices(cls, data: object) -> object:
        """`count` left out follows `indices`: one figure to keep right, not two."""
        if isinstance(data, dict) and isinstance(data.get("indices"), list):
            if not data["indices"]:
                raise ValueError("indices: must name at least one GPU (leave it out for GPUs 0 to count-1)")
            if "count" not in data:
                return {**data, "count": len(data["indices"])}
        return data

    @model_validator(mode="after")
    def _indices_agree(self) -> Gpus:
        if self.indices is None:
            return self
        if len(set(self.indices)) != len(self.indices):
            raise ValueError("indices: names a GPU twice")
        if self.count != len(self.indices):
            raise ValueError(
                f"count: {self.count}, but indices name {len(self.indices)} GPUs "
                "(leave count out: it follows indices)"
            )
        return self


class Model(_Model):
    path: AbsPath
    served_name: Text | None = None
    attention: Literal["mla", "gqa"] | None = Field(
        default=None,
        description="`mla` (DeepSeek/Kimi: `kv_lora_rank` + `qk_rope_head_dim`) or `gqa` (Llama/Qwen: "
        "`kv_heads` × `head_dim`); no default, since a guess plans another model's KV: read from config.json "
        "where the plan has one, else asked for by name",
    )
    layers: int | None = Field(default=None, ge=1, le=MAX_LAYERS)
    kv_lora_rank: int | None = Field(default=None, ge=1, le=MAX_DIM)
    qk_rope_head_dim: int | None = Field(default=None, ge=1, le=MAX_DIM)
    kv_heads: int | None = Field(default=None, ge=1, le=MAX_DIM)
    head_dim: int | None = Field(default=None, ge=1, le=MAX_DIM)
    v_head_dim: int | None = Field(default=None, ge=1, le=MAX_DIM)
    dtype_bytes: int = Field(
        default=2, ge=1, le=4, description="bytes per KV element for --kv-cache-dtype auto"
    )
    weights_gib_per_gpu: float | None = Field(default=None, gt=0, le=MAX_GIB)
    max_context: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="the model's derived context length"
    )
    trained_context: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="the length the model was trained at, from which a YaRN override scales (its "
        "original_max_position_embeddings); null: max_context's (Qwen3's 40,960 is 32,768)",
    )
    rope_scaled: bool = Field(
        default=False,
        description="config.json scales RoPE itself (rope_scaling / rope_parameters beyond `default`): "
        "no YaRN override is offered over it",
    )
    config_json: AbsPath | None = Field(
        default=None, description="read the architecture from here on the host"
    )


class Draft(_Model):
    algorithm: Literal["DFLASH", "DSPARK", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "FROZEN_KV_MTP", "NGRAM"]
    path: AbsPath
    layers: int | None = Field(default=None, ge=1, le=MAX_LAYERS)
    kv_heads: int | None = Field(default=None, ge=1, le=MAX_DIM)
    head_dim: int | None = Field(default=None, ge=1, le=MAX_DIM)
    weights_gib_per_gpu: float | None = Field(default=None, ge=0, le=MAX_GIB)


class Unit(_Model):
    name: Annotated[str, AfterValidator(textrules.unit_name)] = "sglang.service"
    template: Annotated[str, AfterValidator(textrules.no_control)] = "sglang.service.j2"
    directory: AbsPath = "/etc/systemd/system"
    description: Text = "SGLang server"
    user: Text | None = None
    environment: dict[str, Text] = Field(default_factory=dict)
    secret_environment: list[Text] = Field(
        default_factory=list, description="names whose values are redacted"
    )
    secrets_directory: AbsPath = Field(
        default="/etc/deployctl/secrets", description="root-only folder of secret values on the host"
    )
    secret_environment_on_host: list[Text] = Field(
        default_factory=list,
        description="secret variables whose values stay on the host (adopt): the agent moves them from the "
        "unit it replaces into the root-only file",
    )
    verbatim: dict[Literal["Unit", "Service", "Install"], list[Text]] = Field(
        default_factory=dict,
        description="directives the template does not model, per section, kept as written (adopt)",
    )
    keep_backups: int = Field(default=10, ge=1, le=1000)
    cache_directory: Text = Field(
        default="",
        description="SGLang's compile caches under /var/cache (CacheDirectory=); '' = the unit's name",
    )
    start_timeout_s: int = Field(default=3600, ge=10, le=WEEK)


class Sglang(_Model):
    executable: list[Text] = Field(default_factory=lambda: ["/usr/bin/python3", "-m", "sglang.launch_server"])
    version: Text = "0.5.23"
    host: Text = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    flags: dict[Text, FlagValue] = Field(
        default_factory=dict, description="baseline SGLang flags, no leading --"
    )


class Smoke(_Model):
    enabled: bool = True
    prompt_tokens: int = Field(default=60000, ge=1, le=MAX_TOKENS)
    sentence: Text = "The quick brown fox jumps over the lazy dog. "
    question: Text = "In one word, what animal is mentioned?"
    expect: Annotated[Text, AfterValidator(textrules.not_blank)] = (
        "dog"  # "" is in every answer: a test of nothing
    )
    random_weights: bool = Field(
        default=False,
        description="a test model whose answers are noise: judge on usage alone (the prompt arrived whole, a "
        "token came back), not on `expect`",
    )
    timeout_s: float = Field(default=900.0, gt=0, le=WEEK)
    load: int = Field(
        default=0, ge=0, le=256,
        description="the load check before a commit: this many prompts of the chunked-prefill size at once, "
        "with one at the target context; an error or a cut reply rolls back (0: off)",
    )  # fmt: skip


class Timeouts(_Model):
    weights_s: float = Field(default=1800.0, gt=0, le=WEEK, description="restart to the last weight shard")
    pool_s: float = Field(default=600.0, gt=0, le=WEEK, description="weights loaded to the pool logged")
    ready_s: float = Field(default=900.0, gt=0, le=WEEK, description="pool logged to the server ready")
    no_progress_s: float = Field(default=600.0, gt=0, le=WEEK, description="no new log line for this long")


class Planning(_Model):
    margin: float = Field(default=0.02, ge=0, lt=0.5, description="pool above the target, as a fraction")
    reserve_floor_gib: float | None = Field(
        default=None, gt=0, le=MAX_GIB,
        description="memory left per GPU after the pool (CUDA graphs, activations); unset: derived from the "
        "model's shapes and the card class (docs/planning.md)",
    )  # fmt: skip


class Metrics(_Model):
    enabled: bool = True
    # "": deployctl_<unit>.prom in node_exporter's textfile folder (Debian's prometheus-node-exporter)
    path: Text = Field(default="", description="the .prom file the agent writes after every run")

    def file_for(self, unit: str) -> str | None:
        if not self.enabled:
            return None
        return self.path or f"/var/lib/prometheus/node-exporter/deployctl_{unit}.prom"


class Prewarm(_Model):
    enabled: bool = Field(default=True, description="read the new weights into the page cache first")
    margin_gib: float = Field(
        default=8.0, ge=0, le=MAX_GIB, description="host memory that pre-warming leaves free"
    )


class WeightCache(_Model):
    enabled: bool = Field(
        default=False,
        description="run SGLang's weight-cache daemon as its own unit and the engine in --weight-cache-mode "
        "client: a restart that keeps the daemon's fingerprint maps the weights instead of loading them",
    )
    timeout_s: int = Field(
        default=1800, ge=1, le=86400,
        description="--weight-cache-timeout: how long the engine waits for the daemon's ready file",
    )  # fmt: skip


class Drain(_Model):
    enabled: bool = Field(default=True, description="wait for requests in flight before a restart")
    # 15 minutes: a long reasoning answer (32k tokens at ~40 tokens/s) runs ~14 minutes, which is how long
    # a stream ran when a restart cut it in the report behind this feature. Without a router in front, a
    # busy server is never idle, so a restart of a busy host waits this long.
    timeout_s: float = Field(
        default=900.0, ge=0, le=86400, description="the longest a restart waits for requests in flight"
    )
    stop_allowance_s: float = Field(
        default=120.0, ge=10, le=3600,
        description="SGLang's own shutdown after its drain (schedulers, GPU memory): TimeoutStopSec = "
        "timeout_s + this",
    )  # fmt: skip


class Router(_Model):
    url: Annotated[str, AfterValidator(textrules.http_url)] | None = Field(
        default=None,
        description="the SGLang model gateway in front of this server: taken out before a restart's drain, "
        "put back after its checks",
    )
    worker_url: Annotated[str, AfterValidator(textrules.http_url)] | None = Field(
        default=None, description="the URL the router knows this server by (required with url)"
    )
    timeout_s: float = Field(default=60.0, gt=0, le=HOUR, description="each change the router makes")

    @model_validator(mode="after")
    def _both(self) -> Router:
        if self.url is not None and self.worker_url is None:
            raise ValueError("worker_url: required with url (the address the router reaches this server at)")
        if self.url is None and self.worker_url is not None:
            raise ValueError("url: required with worker_url (the router's own address)")
        return self


NODE_FLAGS = ("nnodes", "node-rank", "dist-init-addr")  # what [nodes] renders, per node
DIST_ADDR = re.compile(r"(?P<host>[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>\d{1,5})")


def _dist_addr(value: str) -> str:
    m = DIST_ADDR.fullmatch(value)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise ValueError("must be HOST:PORT (node 0's address as the other nodes reach it, and a free port)")
    return value


class Nodes(_Model):
    """One SGLang server over several hosts (--nnodes): [ssh] target is node rank 0, the one that serves
    HTTP; each node gets the same unit with its own --node-rank."""

    others: list[Text] = Field(
        min_length=1, max_length=63,
        description="the SSH targets of node ranks 1, 2, ... in this order ([ssh] target is rank 0)",
    )  # fmt: skip
    dist_init_addr: Annotated[str, AfterValidator(_dist_addr)] = Field(
        description="--dist-init-addr: node 0's HOST:PORT for the ranks' rendezvous"
    )
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = Field(
        default=None,
        description="the --port of node ranks 1, 2, ... where it is not [sglang] port (nodes that share "
        "one machine's network, as the test hosts do); their placeholder /health listens there",
    )
    wait_s: float = Field(
        default=3600.0, gt=0, le=WEEK,
        description="how long a node waits for deployctl's next word (start, commit) before it rolls "
        "itself back: a change whose laptop is gone ends with every node on its old unit",
    )  # fmt: skip

    @model_validator(mode="after")
    def _distinct_nodes(self) -> Nodes:
        if len(set(self.others)) != len(self.others):
            raise ValueError("others: names a node twice")
        if self.ports is not None and len(self.ports) != len(self.others):
            raise ValueError(f"ports: {len(self.ports)} given for {len(self.others)} nodes in others")
        return self


class HostConfig(_Model):
    name: Text = ""
    # Inventory groups for a fleet rollout (deployctl fleet, the Ansible inventory plugin).
    groups: Annotated[list[GroupName], AfterValidator(textrules.distinct)] = Field(default_factory=list)
    ssh: Ssh
    gpus: Gpus
    model: Model
    draft: Draft | None = None
    unit: Unit = Field(default_factory=Unit)
    sglang: Sglang = Field(default_factory=Sglang)
    smoke: Smoke = Field(default_factory=Smoke)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    planning: Planning = Field(default_factory=Planning)
    metrics: Metrics = Field(default_factory=Metrics)
    prewarm: Prewarm = Field(default_factory=Prewarm)
    weight_cache: WeightCache = Field(default_factory=WeightCache)
    drain: Drain = Field(default_factory=Drain)
    router: Router = Field(default_factory=Router)
    nodes: Nodes | None = None
    pd: Pd | None = Field(
        default=None, description="a prefill-decode service: its roles' units and its router (docs/pd.md)"
    )

    @model_validator(mode="after")
    def _one_gpu_setting(self) -> HostConfig:
        if self.gpus.indices is not None and VISIBLE in self.unit.environment:
            raise ValueError(f"unit.environment.{VISIBLE}: gpus.indices sets it; keep one of the two")
        return self

    @model_validator(mode="after")
    def _nodes_set_their_flags(self) -> HostConfig:
        if self.nodes is None:
            return self
        if self.ssh.target in self.nodes.others:
            raise ValueError(f"nodes.others: names [ssh] target {self.ssh.target!r}, which is node rank 0")
        for flag in (*NODE_FLAGS, "port"):  # the port: [sglang] port, and [nodes] ports for ranks >= 1
            if flag in self.sglang.flags:
                raise ValueError(f"sglang.flags.{flag}: [nodes] sets it for each node; leave it out")
        return self

    @model_validator(mode="after")
    def _no_weight_cache_in_a_group(self) -> HostConfig:
        if self.nodes is not None and self.weight_cache.enabled:
            raise ValueError(
                "weight_cache.enabled: not with [nodes]: a group's change does not run the weight-cache "
                "daemon on its nodes yet; turn one of the two off"
            )
        return self

    @model_validator(mode="after")
    def _pd_alone(self) -> HostConfig:
        other = "nodes" if self.nodes else "weight_cache" if self.weight_cache.enabled else None
        other = other or ("router" if self.router.url else None)
        if self.pd is not None and other:
            raise ValueError(f"{other}: not with [pd] yet (its units and router are [pd]'s); leave one out")
        return self

    @property
    def node_targets(self) -> tuple[str, ...]:
        """The SSH targets this service runs on, node rank 0 first (one for a single-host service)."""
        return (self.ssh.target, *(self.nodes.others if self.nodes else ()))

    def port_on(self, target: str) -> int:
        """The --port this service listens on at one of its node targets ([nodes] ports for ranks >= 1)."""
        rank = self.node_targets.index(target)
        ports = self.nodes.ports if self.nodes else None
        return ports[rank - 1] if ports and rank > 0 else self.sglang.port

    @property
    def unit_path(self) -> str:
        return f"{self.unit.directory.rstrip('/')}/{self.unit.name}"

    @property
    def gpu_set(self) -> tuple[int, ...] | None:
        """The host's GPUs this service runs on: gpus.indices, else a CUDA_VISIBLE_DEVICES of plain numbers
        in unit.environment (an adopted unit), else 0..count-1; None when that variable names GPUs some
        other way (UUIDs, MIG): unknown, so never checked against another service."""
        if self.gpus.indices is not None:
            return tuple(self.gpus.indices)
        visible = self.unit.environment.get(VISIBLE)
        return tuple(range(self.gpus.count)) if visible is None else visible_devices(visible)


def visible_devices(value: str) -> tuple[int, ...] | None:
    """A CUDA_VISIBLE_DEVICES of plain GPU numbers ("4,5"); None for UUIDs or MIG instances."""
    words = [w.strip() for w in value.split(",")]
    return tuple(int(w) for w in words) if all(w.isdigit() for w in words) else None


def units_dir(explicit: str | None) -> Path:
    """--units DIR, else $DEPLOYCTL_UNITS, else ./units."""
    return Path(explicit or os.environ.get("DEPLOYCTL_UNITS") or "units")


def known_hosts(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.toml"))


def check_host_name(name: str) -> None:
    """A service is named by its inventory file's stem: a path to the file (units/pd-1p1d.toml, the file a
    newcomer just read) is answered with the stem to type, for every command that names a service."""
    stem = Path(name).stem if name.endswith(".toml") else None
    if stem and HOST_NAME.fullmatch(stem):
        raise UsageError(
            f"{name!r} is an inventory file: name the service by its stem, {stem!r} (its folder: --units)"
        )
    if not HOST_NAME.fullmatch(name):
        raise UsageError(f"host {name!r} is not a valid host name (letters, digits, '.', '_', '-')")


def load_host(name: str, directory: Path) -> HostConfig:
    """Read units/<name>.toml; an unknown name suggests the closest known ones."""
    check_host_name(name)
    path = directory / f"{name}.toml"
    if not path.is_file():
        names = known_hosts(directory) if directory.is_dir() else []
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean: {', '.join(close)}?" if close else f"known hosts: {', '.join(names) or 'none'}"
        raise InventoryError(f"unknown host {name!r}: no {path}", hint=hint)
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{path}: not valid TOML: {exc}") from None
    data.setdefault("name", name)
    try:
        host = HostConfig.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(f"{path}: {_first_error(exc)}") from None
    problem = flag_rules_problem(host) or (role_problem(host.pd, host.sglang.version) if host.pd else None)
    if problem:
        raise InventoryError(f"{path}: {problem}")
    return host


def flag_rules_problem(host: HostConfig) -> str | None:
    """[sglang.flags] by the rules --set and facts follow too (sglang/flagrules.py), or None. A file's check:
    the views built from a host's facts carry its running unit's --port and --host as facts."""
    from agent.sglang import flagrules

    try:
        flags = flagrules.canonical_flags(host.sglang.flags, host.sglang.version, "sglang.flags")
    except ValueError as exc:
        return str(exc)
    # What the unit renders from the inventory's own keys may stand in the flags (adopt keeps a hand-written
    # unit's order) only with the very value it renders; model-path is checked by the renderer.
    rendered = {"host": host.sglang.host, "port": host.sglang.port, "nnodes": 1, "node-rank": 0}
    for name, value in flags.items():
        same = name in ("model-path", "model") or (name in rendered and str(value) == str(rendered[name]))
        elsewhere = None if same or host.nodes is not None else flagrules.set_elsewhere(name)
        problem = elsewhere or flagrules.value_problem(name, value)
        if problem:
            return f"sglang.flags.{name}: {problem}"
    return None


@dataclass(frozen=True)
class Service:
    """One inventory file: one SGLang unit on the host its ssh.target names (several may share a host)."""

    path: Path
    config: HostConfig


def load_service(name: str, directory: Path) -> HostConfig:
    """units/<name>.toml, checked against the other services of its host (the same ssh.target)."""
    host = load_host(name, directory)
    me = Service(directory / f"{name}.toml", host)
    # A sibling file that does not load is left out: it cannot be deployed, and its own commands say why.
    siblings = [s for s in load_services(directory, skip_broken=True) if s.path != me.path]
    mine = set(holdings(host))
    check_services([me, *(s for s in siblings if mine & set(holdings(s.config)))])
    return host


def load_services(directory: Path, skip_broken: bool = False) -> list[Service]:
    """Every inventory file of the folder, in name order."""
    found = []
    for name in known_hosts(directory):
        try:
            found.append(Service(directory / f"{name}.toml", load_host(name, directory)))
        except UsageError:  # InventoryError included
            if not skip_broken:
                raise
    return found


def holdings(host: HostConfig) -> dict[str, Held]:
    """By host (agent/protocol/addresses.py host_key: one machine however its target is spelled): what the
    service holds there: its unit, port and GPUs on each node; a [pd] file's router's and roles' too."""
    gpus = None if host.gpu_set is None else frozenset(host.gpu_set)
    own = {
        host_key(t): Held(frozenset({host.unit.name}), frozenset({host.port_on(t)}), gpus)
        for t in host.node_targets
    }
    if host.pd is None:
        return own
    return pd_holdings(host.pd, host.ssh.target, host.unit.name, own[host_key(host.ssh.target)])


def check_services(services: Sequence[Service]) -> None:
    """Services of one host (however its target is spelled) must not share a unit, a port, a GPU or a
    metrics file: the first clash is refused in one line naming both files, before anything is touched."""
    by_host: dict[str, list[tuple[Service, Held]]] = {}
    for service in sorted(services, key=lambda s: s.path):  # the same line whichever file was asked for
        for key, held in holdings(service.config).items():  # a multi-node service is on each of its nodes
            by_host.setdefault(key, []).append((service, held))
    for key, group in by_host.items():
        for (a, held_a), (b, held_b) in combinations(group, 2):
            metrics = a.config.metrics.file_for(a.config.unit.name)
            same = metrics is not None and metrics == b.config.metrics.file_for(b.config.unit.name)
            clash = held_a.clash(held_b) or (f"both write metrics to {metrics}" if same else None)
            if clash:
                raise InventoryError(
                    f"{a.path} and {b.path}: {clash} on host {key!r}",
                    hint="each service of a host needs its own [unit] name, [sglang] port and [gpus] indices "
                    "(a [pd] file: its router's and roles' too)",
                )


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if not err["loc"] and err["type"] == "value_error":  # a check across sections names its own keys
        return f"{msg}{more}"
    return f"{where}: {msg}{more}"
