"""What a [pd] service is refused for before any unit is touched: a pure function of the inventory, each
host's facts and the decode plans. Each refusal is one line that names the fix.

Sources (SGLang 0.5.23): the decode's handshake refuses a prefill whose page size or KV dtype differs, and
compares the dtype's *text* (srt/disaggregation/common/conn.py, "Page size mismatch" / "KV cache dtype
mismatch"; kv_cache_dtype_str): `auto` against `bf16` is refused though both are bfloat16. NIXL's UCX
picks a device itself when neither UCX_NET_DEVICES nor --disaggregation-ib-device chooses one
(srt/arg_groups/fields/disagg.py), and on a host with several that hangs each transfer to the 300 s
timeout. A decode reserves --num-reserved-decode-tokens (default 512) per running request
(srt/disaggregation/decode.py _active_reserved_tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent.inventory import VISIBLE, HostConfig
from agent.pd.pagesize import effective_page_size, said_page_size
from agent.pd.router import router_argv, unnamed_bootstraps
from agent.pd.routerflags import router_flag_problems
from agent.pd.starthook import start_refusals
from agent.pd.units import (
    CHECKSUM_FLAG,
    PdUnit,
    Role,
    pd_units,
    routed_url,
    router_target,
    router_unit_name,
    spec,
)
from agent.protocol.addresses import host_key, loopback, same_host
from agent.sglang import server_args

# The module a backend's transfer engine imports (srt/disaggregation/<backend>/conn.py); fake needs none.
BACKEND_MODULES = {
    "mooncake": "mooncake",
    "mooncake_tcp": "mooncake",
    "nixl": "nixl",
    "mori": "mori",
    "ascend": "memfabric_hybrid",
}
DEFAULT_RESERVED = 512  # --num-reserved-decode-tokens


@dataclass(frozen=True)
class PdHostFacts:
    """What a PD check needs of one host. None: the facts do not say (yet): the check is not made.

    The agent's facts (host/roles/pdfacts.py) fill them: the SGLang version, the transfer modules installed
    for the units' Python, the RDMA devices, and the engine's import where it failed."""

    sglang_version: str | None = None
    importable: frozenset[str] | None = None
    rdma_devices: tuple[str, ...] | None = None
    engine_error: str | None = None  # installed, but its engine's import failed: the error's last line


@dataclass(frozen=True)
class DecodeNeed:
    """A decode's pool against what it must hold: --max-running-requests x (context + reserved tokens)."""

    label: str
    running: int
    context: int
    reserved: int
    pool_tokens: int  # the plan's low end of the predicted pool (one DP rank's)
    dp: int = 1  # its attention DP ranks: `running` is one rank's share of --max-running-requests

    @property
    def need(self) -> int:
        return self.running * (self.context + self.reserved)


@dataclass(frozen=True)
class Verdict:
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]


def _text(flags: Mapping[str, object], *names: str, default: str) -> str:
    for name in names:
        if name in flags and flags[name] is not False:
            return str(flags[name])
    return default


def page_size(unit: PdUnit) -> str:
    """Its page size as SGLang resolves it: an attention backend that supports only some sizes forces one."""
    return effective_page_size(unit.host.sglang.flags)


def _page_said(unit: PdUnit) -> str:
    return said_page_size(unit.host.sglang.flags)


def kv_dtype(unit: PdUnit) -> str:
    return _text(unit.host.sglang.flags, "kv-cache-dtype", default="auto")


# --dtype as SGLang reads it, lower-cased (srt/configs/model_config.py:2274-2280, 2302); "auto": the
# checkpoint's own dtype, unknown offline
DTYPE_WORDS = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32"}


def model_dtype(unit: PdUnit) -> str:
    said = _text(unit.host.sglang.flags, "dtype", default="auto").lower()
    return DTYPE_WORDS.get(said, said)


def tp_size(unit: PdUnit) -> int:
    return int(
        _text(
            unit.host.sglang.flags,
            "tp-size",
            "tensor-parallel-size",
            "tp",
            default=str(len(unit.host.gpus.indices or ()) or 1),
        )
    )


def model_path(unit: PdUnit) -> str:
    return _text(unit.host.sglang.flags, "model-path", "model", default=unit.host.model.path)


def check(
    host: HostConfig,
    facts: Mapping[str, PdHostFacts] | None = None,
    decodes: Sequence[DecodeNeed] = (),
) -> Verdict:
    """Every refusal of the service, in the order a person would fix them; warnings after. Flags SGLang's
    own table refuses come first, alone: the units are not built from them (a tp-size of "two")."""
    unread = table_problems(host)
    if unread:
        return Verdict(tuple(unread), ())
    units = pd_units(host)
    found = [
        *_owned(host, units),
        *_parity(units),
        *_placement(host, units),
        *_platform(host, units),
        *start_refusals(host, units),
        *_transfer(host, units, facts or {}),
        *_routing(host, units),
        *router_flag_problems(host),
        *_reach(host, units),
        *_binds(host, units),
        *_releases(host, units, facts or {}),
        *_decode_targets(units),
        *_pools(decodes),
    ]
    return Verdict(tuple(found), tuple(_tp_warning(host, units)))


def table_problems(host: HostConfig) -> list[str]:
    """The file's [sglang.flags], then each role's own flags, against SGLang's flag table: the check a plain
    service's flags get before it is planned (plan/effective.py check_table); a role's are read as numbers
    (its TP, page size, concurrency) before any unit is rendered."""
    pd = spec(host)
    tables = [("sglang.flags", host.sglang.flags)] + [
        (f"pd.{role}.{i}.flags", unit.flags)
        for role, units in (("prefill", pd.prefill), ("decode", pd.decode))
        for i, unit in enumerate(units)
    ]
    return [
        f"{where}.{name}: {said}"
        for where, flags in tables
        for name, said in server_args.problems(host.sglang.version, flags)
    ]


def _owned(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """What [pd] sets for every role, set again by hand: the KV checksum (on one engine only, the metadata
    buffers pair up misaligned: srt/disaggregation/common/conn.py:617-634) and a role's GPUs: the check a
    plain file gets at its load (inventory.py HostConfig._one_gpu_setting), which a role's unit, built by
    model_copy, skips."""
    pd = spec(host)
    roles = list(zip(units, (*pd.prefill, *pd.decode), strict=True))  # pd_units' order
    tables = [("sglang.flags", host.sglang.flags)] + [(f"{u.where}.flags", role.flags) for u, role in roles]
    found = [
        f"{where}.{CHECKSUM_FLAG}: [pd] kv_checksum sets it on every role or none; leave it out (set "
        "kv_checksum = false in [pd] to run without it)"
        for where, flags in tables
        if CHECKSUM_FLAG in flags
    ]
    for unit, role in roles:
        if unit.host.gpus.indices is not None and VISIBLE in unit.host.unit.environment:
            own = VISIBLE in role.environment
            where, whose = (
                (f"{unit.where}.environment", f"{unit.label}'s")
                if own
                else ("unit.environment", "each unit's")
            )
            said = f"{where}.{VISIBLE}: {whose} gpus set it; keep gpus and leave it out"
            found += [] if said in found else [said]
    return found


def _parity(units: Sequence[PdUnit]) -> list[str]:
    found = []
    first = units[0]
    for name, of, how in (
        ("--page-size", page_size, "set the same --page-size on every prefill and decode (what its "
         "attention backend takes, where one forces it)"),
        ("--kv-cache-dtype", kv_dtype,
         "write one --kv-cache-dtype text on every unit (SGLang compares the words: auto is not bf16)"),
        ("--disaggregation-decode-allocation-policy",
         lambda u: _text(u.host.sglang.flags, "disaggregation-decode-allocation-policy", default="early"),
         "set the same policy on both roles"),
    ):  # fmt: skip
        for unit in units[1:]:
            if of(unit) != of(first):
                shown = _page_said if of is page_size else of
                found.append(
                    f"{name} differs: {first.label} has {shown(first)}, {unit.label} has {shown(unit)} "
                    f"(SGLang refuses the transfer at the first request): {how}"
                )
                break
    found += _pool_dtype(units)
    for unit in units[1:]:
        if model_path(unit) != model_path(first):
            found.append(
                f"the roles serve different models: {first.label} {model_path(first)}, {unit.label} "
                f"{model_path(unit)}: serve one model (leave model-path out of the roles' flags)"
            )
            break
    return found


def _pool_dtype(units: Sequence[PdUnit]) -> list[str]:
    """--kv-cache-dtype auto on every role: each pool holds its model's --dtype (mem_cache/kv_cache_dtype.py
    :49-59), while the handshake compares the text "auto" only (common/conn.py:1327-1335): float16 KV is
    read as bfloat16 without a word. "auto" against a named dtype is refused too: the checkpoint's dtype is
    not known offline."""
    first = units[0]
    if any(kv_dtype(u) != "auto" for u in units):
        return []  # a named KV dtype fixes the pool's; a differing text is refused above
    other = next((u for u in units[1:] if model_dtype(u) != model_dtype(first)), None)
    if other is None:
        return []
    return [
        f"--dtype differs under --kv-cache-dtype auto: {first.label} has {model_dtype(first)}, {other.label} "
        f"has {model_dtype(other)} (each KV pool holds its --dtype, and SGLang compares only the text auto): "
        "set one --dtype on every role, or one --kv-cache-dtype other than auto"
    ]


def _placement(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """Per host (however its target is spelled: agent/protocol/addresses.py): no two units, the router
    included, share a unit name, an HTTP port or a GPU; bootstrap ports are the prefills' own, and none is an
    HTTP port (the router's included) on that host."""
    found: list[str] = []
    by_host: dict[str, list[PdUnit]] = {}
    for unit in units:
        by_host.setdefault(host_key(unit.target), []).append(unit)
    for group in by_host.values():
        http = {u.host.sglang.port: u.label for u in group}
        for i, a in enumerate(group):
            found += [
                f"{a.label} and {b.label} on {a.target!r} {c}" for b in group[i + 1 :] for c in _clashes(a, b)
            ]
            bound = a.bound_bootstrap
            if bound is not None and bound in http:
                found.append(
                    f"{a.label}'s bootstrap port {bound} on {a.target!r} is an HTTP port of "
                    f"{http[bound]}: choose a free bootstrap_port"
                )
    return [*found, *_router_clashes(host, units), *_held_gpus(host, units), *_urls(host, units)]


def _router_clashes(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """The router's unit file and port are its host's too: a role there must not take either."""
    router, where = spec(host).router, router_target(host)
    name = router_unit_name(host, router)
    found = []
    for a in (u for u in units if same_host(u.target, where)):
        if a.host.unit.name == name:
            found.append(f"{a.label} and the router on {where!r} are both unit {name}: name each its own")
        if a.host.sglang.port == router.port:
            found.append(f"{a.label} on {where!r} listens on the router's port {router.port}: move one")
        if a.bound_bootstrap == router.port:
            found.append(
                f"{a.label}'s bootstrap port {a.bound_bootstrap} on {where!r} is an HTTP port of the router: "
                "choose a free bootstrap_port"
            )
    return found


def _held_gpus(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    held = set(host.gpu_set or ())  # what this file holds against the other files of its [ssh] target
    found = []
    for unit in units:
        mine = same_host(unit.target, host.ssh.target)
        outside = sorted(set(unit.host.gpus.indices or ()) - held) if mine else []
        if outside:
            found.append(
                f"{unit.where}.gpus: GPU {', '.join(map(str, outside))} is not in [gpus] indices, which this "
                "file holds against the host's other services: add it there"
            )
    return found


def _urls(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """Each unit's url names its own port, and a loopback host only where every host that dials it is the
    unit's own: the router (by the url) and, for a prefill, each decode, which sglang-router hands the
    prefill url's host as bootstrap_host (sglang_router 0.3.2 mini_lb.py:391-411; the decode dials it,
    srt/disaggregation/decode.py:153-155)."""
    found = []
    for u in units:
        parts = urlsplit(u.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if port != u.host.sglang.port:
            whose = next((f", {o.label}'s" for o in units if o.host.sglang.port == port and o is not u), "")
            found.append(
                f"{u.where}.url: {u.url} names port {port}{whose}, and {u.label} listens on "
                f"{u.host.sglang.port}: name its own port (the router sends its requests there)"
            )
        if not loopback(parts.hostname or ""):
            continue
        if not same_host(u.target, router_target(host)):
            found.append(
                f"{u.where}.url: the router runs on another host than {u.target!r}: "
                "give the URL it reaches this unit at"
            )
        found += [
            f"{u.where}.url: {u.url} is loopback, and the router hands its host to {d.label} on "
            f"{d.target!r} as the bootstrap host, where it is {d.label}'s own: give {u.label} the URL of an "
            "address other hosts reach it at"
            for d in units
            if u.role is Role.PREFILL and d.role is Role.DECODE and not same_host(d.target, u.target)
        ]
    return found


def _clashes(a: PdUnit, b: PdUnit) -> list[str]:
    """What two units of one host must not share, each with its fix."""
    shared = sorted(set(a.host.gpus.indices or ()) & set(b.host.gpus.indices or ()))
    same = {
        f"are both unit {a.host.unit.name}: name each its own": a.host.unit.name == b.host.unit.name,
        f"both listen on port {a.host.sglang.port}: give each its own port": a.host.sglang.port
        == b.host.sglang.port,
        f"share GPU {', '.join(map(str, shared))}: give each its own gpus": bool(shared),
        f"share bootstrap port {a.bound_bootstrap}: give each its own bootstrap_port (a prefill, or a decode "
        "with enable-pd-role-switch: both bind one)": (
            a.bound_bootstrap is not None and a.bound_bootstrap == b.bound_bootstrap
        ),
    }
    return [said for said, clash in same.items() if clash]


# Ascend NPU only (srt/arg_groups/choices.py "Other platforms"; srt/disaggregation/ascend imports
# AscendTransferEngine from memfabric_hybrid)
NPU_ONLY = "ascend"
BACKEND_FLAGS = ("attention-backend", "prefill-attention-backend", "decode-attention-backend")


def _platform(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """An Ascend NPU backend on a unit whose [gpus] card is NVIDIA's: SGLang fails at its start."""
    found = []
    if spec(host).transfer_backend == NPU_ONLY and "NVIDIA" in host.gpus.name.upper():
        found.append(
            f"[pd] transfer_backend ascend runs on Ascend NPUs only, and the card is {host.gpus.name!r} "
            "(NVIDIA): choose mooncake (or nixl)"
        )
    for unit in units:
        named = [f for f in BACKEND_FLAGS if str(unit.host.sglang.flags.get(f, "")) == NPU_ONLY]
        if named and "NVIDIA" in unit.host.gpus.name.upper():
            found.append(
                f"{unit.label}: --{named[0]} ascend runs on Ascend NPUs only, and its card is "
                f"{unit.host.gpus.name!r} (NVIDIA): leave it out (SGLang picks the card's) or name a CUDA "
                "backend (fa3, flashinfer, triton)"
            )
    return found


def _transfer(host: HostConfig, units: Sequence[PdUnit], facts: Mapping[str, PdHostFacts]) -> list[str]:
    backend = spec(host).transfer_backend
    module = BACKEND_MODULES.get(backend)
    found = []
    if backend == "fake":  # srt/arg_groups/pd_disaggregation_hook.py: a prefill asserts it away
        found.append(
            "transfer_backend fake: SGLang's prefill refuses it (a decode-only test backend): choose mooncake"
        )
    for target in dict.fromkeys(u.target for u in units):
        seen = facts.get(target)
        if module and seen and seen.importable is not None and module not in seen.importable:
            found.append(
                f"host {target!r} cannot import {module!r}, which the {backend} transfer backend needs: "
                "install it in the SGLang venv or choose another [pd] transfer_backend"
            )
        elif module and seen and seen.engine_error:
            found.append(
                f"host {target!r} has {module!r} installed but does not import it for the {backend} transfer "
                f"backend ({seen.engine_error}): install what it links on the host (mooncake's engine.so: "
                "libibverbs, libnuma, libcurl), reinstall it in the SGLang venv, or choose another backend"
            )
    if backend == "nixl":
        for unit in units:
            seen = facts.get(unit.target)
            many = seen is not None and seen.rdma_devices is not None and len(seen.rdma_devices) > 1
            chosen = unit.host.sglang.flags.get("disaggregation-ib-device") or unit.host.unit.environment.get(
                "UCX_NET_DEVICES"
            )
            if many and not chosen:
                assert seen is not None and seen.rdma_devices is not None
                found.append(
                    f"{unit.label} on {unit.target!r}: NIXL with no RDMA device chosen on a host with "
                    f"{len(seen.rdma_devices)} ({', '.join(seen.rdma_devices)}) hangs each transfer to the "
                    "300 s timeout: set ib_device or UCX_NET_DEVICES"
                )
    return found


def _reach(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """A unit on another host than the router sends its routed check to the router's reachable address."""
    return [
        f"{u.where}: it runs on {u.target!r}, the router on {router_target(host)!r}, which no other host "
        "can reach (it binds loopback, or runs on 'local'): set [pd.router] url to an address this unit "
        "reaches it at (its routed check goes there)"
        for u in units
        if not same_host(u.target, router_target(host)) and routed_url(host, u.target) is None
    ]


def _binds(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """A unit another host reaches (the router, by its url; a peer role, at its bootstrap server) must
    listen beyond loopback: SGLang binds its HTTP and bootstrap servers on --host (srt/managers/
    disagg_service.py), rendered from [sglang] host, 127.0.0.1 unless set."""
    found = []
    targets = {host_key(u.target) for u in units}
    for u in units:
        if not loopback(u.host.sglang.host):
            continue
        url_host = urlsplit(u.url).hostname or ""
        why = (
            f"the router reaches it at {u.url}" if not loopback(url_host)
            else f"the router runs on {router_target(host)!r}" if not same_host(u.target, router_target(host))
            else "its peer roles run on other hosts" if len(targets) > 1
            else None
        )  # fmt: skip
        if why is not None:
            found.append(
                f"{u.where}: it listens on [sglang] host {u.host.sglang.host} (loopback only), but {why}: "
                "set [sglang] host = \"0.0.0.0\" (or each host's address; a role's flags may not set --host)"
            )
    return found


def _routing(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    return [
        f"router: {p}: leave --prefill and --decode out of [pd.router] executable ([pd] names each unit, "
        "a prefill with its bootstrap port)"
        for p in unnamed_bootstraps(router_argv(host, units), units)
    ]


def _releases(host: HostConfig, units: Sequence[PdUnit], facts: Mapping[str, PdHostFacts]) -> list[str]:
    versions = {
        u.target: (facts[u.target].sglang_version if u.target in facts else None) or host.sglang.version
        for u in units
    }
    if len(set(versions.values())) > 1:
        said = ", ".join(f"{t} {v}" for t, v in sorted(versions.items()))
        return [
            f"the roles' hosts run different SGLang releases ({said}): install {host.sglang.version} on each"
        ]
    return []


def _decode_targets(units: Sequence[PdUnit]) -> list[str]:
    return [
        f"{u.where}.flags.max-running-requests: required: a decode's pool is planned for its concurrency "
        "at the target context"
        for u in units
        if u.role is Role.DECODE and not str(u.host.sglang.flags.get("max-running-requests", "")).isdigit()
    ]


def _pools(decodes: Sequence[DecodeNeed]) -> list[str]:
    return [_short(d) for d in decodes if d.pool_tokens < d.need]


def _short(d: DecodeNeed) -> str:
    held = (
        f"--max-running-requests {d.running}"
        if d.dp == 1
        else f"{d.running} requests per DP rank (of {d.dp})"
    )
    fits = max(d.pool_tokens // (d.context + d.reserved), 0) * d.dp
    if fits == 0:  # not one request: fewer requests is no fix, more memory per rank is
        more = "give it more GPUs (a higher tp-size in its [pd] flags) or a smaller or quantized model"
        if d.pool_tokens <= 0:
            return f"{d.label}: its weights do not fit its GPUs (no KV pool left): {more}"
        return (
            f"{d.label}: its pool holds about {d.pool_tokens:,} tokens, less than one request's "
            f"{d.context:,} context + {d.reserved:,} reserved: {more}, or a shorter context"
        )
    return (
        f"{d.label}: its pool holds about {d.pool_tokens:,} tokens, below {held} x ({d.context:,} context + "
        f"{d.reserved:,} reserved) = {d.need:,}: lower its max-running-requests to {fits}, the context, "
        "or add a decode"
    )


def _tp_warning(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    sizes = {tp_size(u) for u in units}
    if len(sizes) > 1 and host.model.attention != "mla":
        return [
            f"the roles run different TP sizes ({', '.join(map(str, sorted(sizes)))}) for a non-MLA model: "
            "SGLang transfers it, but says performance is not guaranteed; crashes under load are reported"
        ]
    return []


def set_refusals(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """Parity and placement over units as they would run (a rollback's set, its flags parsed from each unit's
    ExecStart), not as the inventory renders them."""
    return [*_parity(units), *_placement(host, units)]
