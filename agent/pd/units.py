"""A [pd] service as one ordinary service per unit: the inventory each prefill and decode unit renders from.

Each unit is the file's own service with its [pd] unit's host, GPUs, port, unit name, flags and environment
over it, and the disaggregation flags (srt/arg_groups/fields/disagg.py) added; the planner and the renderer
then treat it as any other service.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

from agent.inventory import HostConfig
from agent.pd.spec import BOOTSTRAP_DEFAULT, Pd, PdRouter, PrefillUnit, RoleUnit, router_unit, unit_name
from agent.plan.effective import at_layout
from agent.protocol.addresses import host_key, loopback, same_host

# each role's /metrics counts the requests it finished (sglang:num_requests_total): the routed check of a
# change proves by it which unit served (agent/host/roles/pdrouter.py served_here); a file may set it off
METRICS: dict[str, str | int | float | bool] = {"enable-metrics": True}


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


CHECKSUM_FLAG = "disaggregation-enable-kv-checksum"


def kv_checksum_skipped(host: HostConfig) -> str | None:
    """None: every role runs with SGLang's KV checksum (an Adler-32 over each request's KV pages on the
    prefill, verified on the decode; a mismatch aborts the request: srt/disaggregation/decode.py
    _verify_kv_checksums, its `KV checksum mismatch req=...` line). Else why not. Both roles or neither:
    with it on one engine only the metadata buffers misalign (srt/disaggregation/common/conn.py
    check_peer_aux_buffer_count). The digest is computed on CUDA tensors only (checksum.py
    KvChecksumComputer.compute asserts is_cuda; a CPU prefill dies at its warmup)."""
    pd = spec(host)
    if not pd.kv_checksum:
        return "[pd] kv_checksum = false"
    units = (*pd.prefill, *pd.decode)
    devices = {str({**host.sglang.flags, **u.flags}.get("device") or "cuda").lower() for u in units}
    other = sorted(devices - {"cuda"})
    return f"--device {other[0]}: SGLang computes the KV checksum on CUDA only" if other else None


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


def router_unit_name(host: HostConfig, router: PdRouter) -> str:
    return router_unit(host.unit.name, router)


def router_target(host: HostConfig) -> str:
    return spec(host).router.target or host.ssh.target


WILDCARD = ("0.0.0.0", "::")


def _url_host(url: str) -> str:
    return urlsplit(url).hostname or ""


def router_reach(host: HostConfig) -> str | None:
    """The URL a unit on another host reaches the router at (its routed check goes there): [pd.router] url;
    else the address the router binds, where it names one; else, bound to every address, its SSH target's
    host name (user@ and :port dropped). None: nothing another host can reach (a loopback bind or URL, or a
    router on 'local')."""
    router = spec(host).router
    if router.url is not None:
        return None if loopback(_url_host(router.url)) else router.url.rstrip("/")
    if loopback(router.host):
        return None
    if router.host not in WILDCARD:
        return f"http://{_bracket(router.host)}:{router.port}"
    name = host_key(router_target(host))
    if name in ("", "local") or loopback(name):
        return None
    return f"http://{_bracket(name)}:{router.port}"


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def routed_url(host: HostConfig, target: str) -> str | None:
    """Where a unit on `target` sends the routed check: the router's loopback on its own host, else
    router_reach (None: the router cannot be reached from there)."""
    router = spec(host).router
    if same_host(target, router_target(host)):
        where = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(router.host, _bracket(router.host))
        return f"http://{where}:{router.port}"
    return router_reach(host)


def _unit(host: HostConfig, pd: Pd, role: Role, index: int, unit: RoleUnit) -> PdUnit:
    target = unit.target or host.ssh.target
    bootstrap = (unit.bootstrap_port or BOOTSTRAP_DEFAULT) if isinstance(unit, PrefillUnit) else None
    disagg: dict[str, str | int | float | bool] = {
        "disaggregation-mode": role.value,
        "disaggregation-transfer-backend": pd.transfer_backend,
    }
    if bootstrap is not None:
        disagg["disaggregation-bootstrap-port"] = bootstrap
    if kv_checksum_skipped(host) is None:
        disagg[CHECKSUM_FLAG] = True
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
                update={"port": unit.port, "flags": {**METRICS, **host.sglang.flags, **unit.flags, **disagg}}
            ),
            "pd": None,
        }
    )
    url = unit.url or f"http://127.0.0.1:{unit.port}"
    # model.weights_gib_per_gpu is written for the file's [sglang.flags] TP x PP: restated at the role's own,
    # as `plan --set tp-size=` restates a plain service's
    return PdUnit(role, index, target, url, bootstrap, at_layout(served, host))
