"""A [pd] service as one ordinary service per unit: the inventory each prefill and decode unit renders from.

Each unit is the file's own service with its [pd] unit's host, GPUs, port, unit name, flags and environment
over it, and the disaggregation flags (srt/arg_groups/fields/disagg.py) added; the planner and the renderer
then treat it as any other service.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agent.inventory import HostConfig
from agent.pd.spec import Pd, PdRouter, RoleUnit

BOOTSTRAP_DEFAULT = 8998  # --disaggregation-bootstrap-port's default (srt/arg_groups/fields/disagg.py)


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class PdUnit:
    """One unit of a role: where it runs, how the router reaches it, and its service as a plain one."""

    role: Role
    index: int
    target: str
    url: str
    bootstrap_port: int | None  # a prefill's; None for a decode
    host: HostConfig  # the unit as an ordinary service: plan and render it as one

    @property
    def label(self) -> str:
        return f"{self.role.value}[{self.index}]"

    @property
    def where(self) -> str:
        return f"pd.{self.role.value}.{self.index}"


def spec(host: HostConfig) -> Pd:
    if host.pd is None:
        raise ValueError(f"{host.name}: not a [pd] service")
    return host.pd


def pd_units(host: HostConfig) -> list[PdUnit]:
    """Every unit of the service, prefills first (the order a change restarts them in)."""
    pd = spec(host)
    return [
        _unit(host, pd, role, i, unit)
        for role, units in ((Role.PREFILL, pd.prefill), (Role.DECODE, pd.decode))
        for i, unit in enumerate(units)
    ]


def unit_name(base: str, role: str, index: int) -> str:
    return f"{base.removesuffix('.service')}-{role}-{index}.service"


def router_unit_name(host: HostConfig, router: PdRouter) -> str:
    return router.unit or f"{host.unit.name.removesuffix('.service')}-router.service"


def router_target(host: HostConfig) -> str:
    return spec(host).router.target or host.ssh.target


def _unit(host: HostConfig, pd: Pd, role: Role, index: int, unit: RoleUnit) -> PdUnit:
    target = unit.target or host.ssh.target
    bootstrap = (unit.bootstrap_port or BOOTSTRAP_DEFAULT) if role is Role.PREFILL else None
    disagg: dict[str, str | int | float | bool] = {
        "disaggregation-mode": role.value,
        "disaggregation-transfer-backend": pd.transfer_backend,
    }
    if bootstrap is not None:
        disagg["disaggregation-bootstrap-port"] = bootstrap
    device = unit.ib_device or pd.ib_device
    if device:
        disagg["disaggregation-ib-device"] = device
    name = unit.unit or unit_name(host.unit.name, role.value, index)
    served = host.model_copy(
        update={
            "name": f"{host.name}.{role.value}{index}",
            "ssh": host.ssh.model_copy(update={"target": target}),
            "gpus": host.gpus.model_copy(update={"indices": list(unit.gpus), "count": len(unit.gpus)}),
            "unit": host.unit.model_copy(
                update={
                    "name": name,
                    "description": f"{host.unit.description} ({role.value} {index})",
                    "environment": {**host.unit.environment, **unit.environment},
                }
            ),
            "sglang": host.sglang.model_copy(
                update={"port": unit.port, "flags": {**host.sglang.flags, **unit.flags, **disagg}}
            ),
            "pd": None,
        }
    )
    url = unit.url or f"http://127.0.0.1:{unit.port}"
    return PdUnit(role, index, target, url, bootstrap, served)
