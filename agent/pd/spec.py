"""[pd]: a prefill-decode disaggregated service, declared in one inventory file.

The file's own sections ([ssh], [gpus], [model], [unit], [sglang]) are what every role shares; [pd] names the
transfer, each role's units (their host, GPU subset, ports, TP and flags) and the router in PD mode. What
the roles must agree on (page size, KV dtype, model, release) is checked by agent/pd/refusals.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from agent.protocol.addresses import host_key
from agent.protocol.common import HTTP_URL, UNIT_NAME, find_control

# srt/arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES; mooncake_tcp is mooncake with its TCP transport
# forced (srt/arg_groups/pd_disaggregation_hook.py), fake a decode-only test backend
Backend = Literal["mooncake", "mooncake_tcp", "nixl", "mori", "ascend", "fake"]
Port = Annotated[int, Field(ge=1, le=65535)]
GpuIndex = Annotated[int, Field(ge=0, lt=64)]
FlagValue = str | int | float | bool
# What [pd] renders itself: a role's flags may not set them (one place to keep right, not two).
PD_FLAGS = (
    "disaggregation-mode",
    "disaggregation-transfer-backend",
    "disaggregation-bootstrap-port",
    "disaggregation-ib-device",
    "port",
    "host",
)
ROUTER_PD_FLAGS = ("pd-disaggregation", "prefill", "decode", "worker-urls", "port", "host")
BOOTSTRAP_DEFAULT = 8998  # --disaggregation-bootstrap-port's default (srt/arg_groups/fields/disagg.py)
DEVICE = re.compile(r"[A-Za-z0-9_.:,-]{1,256}")


def _text(value: str) -> str:
    if find_control(value):
        raise ValueError("must not contain control characters (newline, tab, escape...)")
    return value


def _unit(value: str) -> str:
    if not UNIT_NAME.fullmatch(value) or ".." in value:
        raise ValueError("must be a plain unit file name ending in .service (no '/' or '..')")
    return value


def _url(value: str) -> str:
    if not HTTP_URL.fullmatch(value):
        raise ValueError("must be an http:// or https:// URL: host, optional port and path")
    return value


def _device(value: str) -> str:
    if not DEVICE.fullmatch(value):
        raise ValueError("must be RDMA device names (mlx5_0 or mlx5_0,mlx5_1), as ibv_devices lists them")
    return value


Text = Annotated[str, AfterValidator(_text)]
UnitName = Annotated[str, AfterValidator(_unit)]
Url = Annotated[str, AfterValidator(_url)]
Device = Annotated[str, AfterValidator(_device)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class RoleUnit(_Model):
    """One SGLang server of a role: its own GPUs, port, unit and flags over the file's [sglang.flags]."""

    gpus: list[GpuIndex] = Field(min_length=1, max_length=64, description="the host's GPUs it runs on")
    port: Port = Field(description="its HTTP --port")
    target: Text | None = Field(default=None, description="its host's SSH target; unset: [ssh] target")
    url: Url | None = Field(
        default=None,
        description="the URL the router reaches it at; unset: http://127.0.0.1:PORT, for a unit on the "
        "router's host",
    )
    unit: UnitName | None = Field(default=None, description="unset: <[unit] name>-<role>-<n>.service")
    ib_device: Device | None = Field(default=None, description="--disaggregation-ib-device; unset: [pd]'s")
    flags: dict[Text, FlagValue] = Field(default_factory=dict, description="this unit's own flags, no --")
    environment: dict[Text, Text] = Field(default_factory=dict, description="e.g. UCX_NET_DEVICES")

    @model_validator(mode="after")
    def _distinct_gpus(self) -> RoleUnit:
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError("gpus: names a GPU twice")
        for name in PD_FLAGS:
            if name in self.flags:
                raise ValueError(
                    f"flags.{name}: [pd] sets it (port, bootstrap_port, ib_device); leave it out"
                )
        return self


class PrefillUnit(RoleUnit):
    """A prefill: a role unit with the port of its bootstrap server, which its decodes learn from the
    router (a decode has none: [[pd.decode]] refuses the key)."""

    bootstrap_port: Port | None = Field(
        default=None, description="--disaggregation-bootstrap-port (SGLang's default 8998)"
    )


class PdRouter(_Model):
    """sglang-router in PD mode (`python -m sglang_router.launch_router --pd-disaggregation`)."""

    port: Port = Field(description="the router's HTTP port, where clients send requests")
    host: Text = Field(default="0.0.0.0", description="the address the router binds (--host)")
    target: Text | None = Field(default=None, description="its host's SSH target; unset: [ssh] target")
    url: Url | None = Field(
        default=None,
        description="the URL units on other hosts reach the router at (their routed check); unset: its bind "
        "address, or for 0.0.0.0 its SSH target's host name",
    )
    executable: list[Text] = Field(
        default_factory=lambda: ["/usr/bin/python3", "-m", "sglang_router.launch_router"],
        min_length=1,
        description="the router's command, before its flags",
    )
    unit: UnitName | None = Field(default=None, description="unset: <[unit] name>-router.service")
    version: Text = Field(default="0.3.2", description="the sglang-router release its flags follow")
    flags: dict[Text, FlagValue] = Field(default_factory=dict, description="e.g. policy = 'cache_aware'")
    environment: dict[Text, Text] = Field(
        default_factory=dict, description="its unit's Environment= (e.g. RUST_LOG, or PYTHONPATH)"
    )

    @model_validator(mode="after")
    def _no_pd_flags(self) -> PdRouter:
        for name in ROUTER_PD_FLAGS:
            if name in self.flags:
                raise ValueError(f"flags.{name}: [pd] renders it from the roles' units; leave it out")
        return self


class Pd(_Model):
    transfer_backend: Backend = Field(default="mooncake", description="SGLang's default")
    ib_device: Device | None = Field(default=None, description="every unit's, where it sets none")
    prefill_in_flight: int = Field(
        default=1, ge=1, le=4096,
        description="prompts a prefill holds at the target context while the decode pulls their KV",
    )  # fmt: skip
    kv_checksum: bool = Field(
        default=True,
        description="--disaggregation-enable-kv-checksum on every role where the cards compute it (CUDA; "
        "skipped for a --device other than cuda): a routed request whose KV arrives corrupted is aborted",
    )
    prefill: list[PrefillUnit] = Field(
        min_length=1, max_length=64, description="[[pd.prefill]]: the prefill units, one table each"
    )
    decode: list[RoleUnit] = Field(
        min_length=1, max_length=64, description="[[pd.decode]]: the decode units, one table each"
    )
    router: PdRouter = Field(description="sglang-router in PD mode, in front of every unit")

    @model_validator(mode="before")
    @classmethod
    def _bootstrap_on_prefill(cls, data: object) -> object:
        """A decode's bootstrap_port, refused with what it is rather than as an unknown key."""
        decodes = data.get("decode") if isinstance(data, dict) else None
        for i, unit in enumerate(decodes if isinstance(decodes, list) else []):
            if isinstance(unit, dict) and "bootstrap_port" in unit:
                raise ValueError(
                    f"decode.{i}.bootstrap_port: a prefill's port; a decode learns it from the router"
                )
        return data


def unit_name(base: str, role: str, index: int) -> str:
    return f"{base.removesuffix('.service')}-{role}-{index}.service"


def router_unit(base: str, router: PdRouter) -> str:
    return router.unit or f"{base.removesuffix('.service')}-router.service"


@dataclass(frozen=True)
class Held:
    """What a service holds on one host against the host's other services (agent/inventory.py
    check_services)."""

    units: frozenset[str]
    ports: frozenset[int]
    gpus: frozenset[int] | None  # None: unknown (CUDA_VISIBLE_DEVICES of UUIDs), never checked

    def clash(self, other: Held) -> str | None:
        """The first thing both hold, said as a clash; None: nothing."""
        units, ports = sorted(self.units & other.units), sorted(self.ports & other.ports)
        gpus = sorted((self.gpus or frozenset()) & (other.gpus or frozenset()))
        if units:
            return f"both are unit {units[0]}"
        if ports:
            return f"both listen on port {ports[0]}"
        if gpus:
            return f"both use GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}"
        return None


def pd_holdings(pd: Pd, ssh_target: str, base: str, own: Held) -> dict[str, Held]:
    """By host (host_key): what a [pd] file holds: `own` (its [unit] name, [sglang] port and [gpus]) on its
    [ssh] target; the router's unit and port on the router's host; each role unit's unit, port, bootstrap
    port and GPUs on its host. From the spec alone: a file is checked as it loads."""
    found = {host_key(ssh_target): own}

    def hold(target: str | None, unit: str, ports: set[int], gpus: list[int] | None = None) -> None:
        key = host_key(target or ssh_target)
        was = found.get(key, Held(frozenset(), frozenset(), frozenset()))
        more = None if was.gpus is None else was.gpus | set(gpus or ())
        found[key] = Held(was.units | {unit}, was.ports | ports, more)

    hold(pd.router.target, router_unit(base, pd.router), {pd.router.port})
    for role, units in (("prefill", pd.prefill), ("decode", pd.decode)):
        for i, unit in enumerate(units):
            ports = {unit.port}
            if isinstance(unit, PrefillUnit):
                ports.add(unit.bootstrap_port or BOOTSTRAP_DEFAULT)
            hold(unit.target, unit.unit or unit_name(base, role, i), ports, unit.gpus)
    return found
