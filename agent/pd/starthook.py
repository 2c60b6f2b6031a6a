"""The start refusals of SGLang 0.5.23's PD hook that a role's flags and environment show: each role would
die at its start (srt/arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation and
_validate_prefill_complete, run before any model loads). One line per role and rule, naming the fix.

Not checked here: what needs the model's config or the machine (DCP's relayout backends are every backend
[pd] takes; the fake backend is refused in refusals.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.inventory import HostConfig
from agent.pd.spec import BOOTSTRAP_DEFAULT
from agent.pd.switch import SWITCHING_BACKENDS
from agent.pd.units import PdUnit, Role, spec

HOOK = "srt/arg_groups/pd_disaggregation_hook.py"
ENV_TRUE = ("true", "1", "yes", "y")  # srt/environ.py EnvBool


def _get(flags: Mapping[str, object], *names: str) -> object:
    return next((flags[n] for n in names if n in flags), None)


def _on(flags: Mapping[str, object], *names: str) -> bool:
    value = _get(flags, *names)
    return value is True or str(value).lower() in ("true", "1", "yes")


def _num(flags: Mapping[str, object], *names: str, default: float) -> float:
    value = _get(flags, *names)
    try:
        return default if value is None or isinstance(value, bool) else float(str(value))
    except ValueError:
        return default


def _env(unit: PdUnit, name: str) -> bool:
    return str(unit.host.unit.environment.get(name, "")).lower() in ENV_TRUE


def threshold(flags: Mapping[str, object]) -> float:
    """--disaggregation-decode-host-receive-threshold, 1 (host receive off) when unset."""
    return _num(flags, "disaggregation-decode-host-receive-threshold", default=1.0)


def host_receive(unit: PdUnit) -> list[str]:
    """pd_disaggregation_hook.py:64-75: the threshold is a fraction; below 1 it needs host_pool retraction
    and neither HiSparse nor role switching."""
    flags, where = unit.host.sglang.flags, unit.where
    value = threshold(flags)
    if not 0 <= value <= 1:
        return [f"{where}: --disaggregation-decode-host-receive-threshold {value:g} is not between 0 and 1 "
                f"(SGLang refuses it at the start, {HOOK}:64): give a fraction, or leave it out"]  # fmt: skip
    if value == 1:
        return []
    found = []
    if _on(flags, "enable-hisparse") or _on(flags, "enable-pd-role-switch"):
        found.append(
            f"{where}: decode host receive (threshold {value:g}) does not support --enable-hisparse or "
            f"--enable-pd-role-switch ({HOOK}:69-72): drop one"
        )
    if str(flags.get("disaggregation-decode-retraction-backup")) == "cpu_tensor":
        found.append(
            f"{where}: decode host receive (threshold {value:g}) requires host_pool retraction, and "
            f"--disaggregation-decode-retraction-backup is cpu_tensor (SGLang refuses it at the start, "
            f"{HOOK}:74-75): set it to host_pool (or leave it out), or leave the threshold at 1"
        )
    return found


def decode_radix(unit: PdUnit, backend: str) -> list[str]:
    """pd_disaggregation_hook.py:98-109: a decode's radix cache refuses HiSparse and the fake backend."""
    flags = unit.host.sglang.flags
    if unit.role is not Role.DECODE or not _on(flags, "disaggregation-decode-enable-radix-cache"):
        return []
    clash = "--enable-hisparse" if _on(flags, "enable-hisparse") else None
    clash = clash or ("transfer_backend fake" if backend == "fake" else None)
    if clash is None:
        return []
    return [f"{unit.where}: --disaggregation-decode-enable-radix-cache is incompatible with {clash} "
            f"({HOOK}:99-109): drop one"]  # fmt: skip


def environment(unit: PdUnit, backend: str) -> list[str]:
    """pd_disaggregation_hook.py:153-162 and 273-283: the staging buffer is Mooncake's and NIXL's; the Rust
    server serves the bootstrap registry on a prefill's HTTP port (every built-in backend's server is
    CommonKVBootstrapServer's, disagg_service.py:54-66)."""
    found = []
    if _env(unit, "SGLANG_DISAGG_STAGING_BUFFER") and backend not in ("mooncake", "mooncake_tcp", "nixl"):
        found.append(f"{unit.where}: SGLANG_DISAGG_STAGING_BUFFER needs transfer_backend mooncake or nixl, "
                     f"not {backend} ({HOOK}:154-162): drop it or change the backend")  # fmt: skip
    port = unit.bootstrap_port
    if _env(unit, "SGLANG_RUST_SERVER") and port not in (None, BOOTSTRAP_DEFAULT, unit.host.sglang.port):
        found.append(
            f"{unit.where}: SGLANG_RUST_SERVER serves the bootstrap registry on its HTTP port "
            f"{unit.host.sglang.port}, and its bootstrap_port is {port} ({HOOK}:273-283): leave "
            "bootstrap_port out or set it to its port"
        )
    return found


SPEC_HOOK = "srt/arg_groups/speculative_hook.py"
RADIX_SPEC = ("DSPARK", "EAGLE", "EAGLE3", "NEXTN")  # NEXTN is EAGLE's alias (speculative_hook.py:109-116)


def speculation(unit: PdUnit) -> list[str]:
    """speculative_hook.py:163-172: a decode's radix cache takes no speculation but DSPARK and the EAGLE
    family; :713-718: DSpark with pipeline parallelism runs only on a prefill."""
    flags = unit.host.sglang.flags
    algo = str(_get(flags, "speculative-algorithm") or "none").upper()
    if unit.role is not Role.DECODE or algo == "NONE":
        return []
    found = []
    if _on(flags, "disaggregation-decode-enable-radix-cache") and algo not in RADIX_SPEC:
        found.append(
            f"{unit.where}: --disaggregation-decode-enable-radix-cache is incompatible with speculative "
            f"decoding --speculative-algorithm {algo} (SGLang refuses it at the start, {SPEC_HOOK}:163-172): "
            "drop the radix cache, or use EAGLE, EAGLE3, NEXTN or DSPARK"
        )
    if algo == "DSPARK" and _num(flags, "pp-size", "pipeline-parallel-size", "pp", default=1) != 1:
        found.append(f"{unit.where}: DSpark with pipeline parallelism runs only on a prefill (SGLang refuses "
                     f"it at the start, {SPEC_HOOK}:713-718): set pp-size 1 on the decode")  # fmt: skip
    return found


ROLE_SWITCH = (
    (("ep-size", "expert-parallel-size", "ep"), "expert parallelism"),
    (("pp-size", "pipeline-parallel-size", "pp"), "pipeline parallelism"),
    (("dcp-size",), "decode context parallelism"),
)


def role_switch(unit: PdUnit) -> list[str]:
    """pd_disaggregation_hook.py:164-196: role switching does not rebuild what these features keep."""
    flags = unit.host.sglang.flags
    if not _on(flags, "enable-pd-role-switch"):
        return []
    said = [what for names, what in ROLE_SWITCH if _num(flags, *names, default=1) > 1]
    if str(_get(flags, "moe-a2a-backend") or "none") != "none":
        said.append("MoE all-to-all")
    if _on(flags, "enable-dp-attention-local-control-broadcast"):
        said.append("DP attention local control broadcast")
    if _get(flags, "speculative-algorithm") not in (None, False, "None", "none"):
        said.append("speculative decoding")
    if not said:
        return []
    return [
        f"{unit.where}: --enable-pd-role-switch does not rebuild role state for {', '.join(said)} (SGLang "
        f"refuses it at the start, {HOOK}:164-196): drop those or --enable-pd-role-switch"
    ]


SWITCHERS = SWITCHING_BACKENDS  # one list: what the plan lets switch, the apply switches


def switch_backend(unit: PdUnit, backend: str) -> list[str]:
    """Not a start refusal: the role starts, and SGLang refuses each switch (role_switch.py:205-211) on a
    backend whose KV manager keeps supports_role_switch False (base/conn.py:160; True in mooncake/conn.py:258,
    mori/conn.py:375). Refused here, since the flag could only ever buy a restart in place of a switch."""
    if not _on(unit.host.sglang.flags, "enable-pd-role-switch") or backend in SWITCHERS or backend == "fake":
        return []  # the fake backend is refused on its own (refusals.py)
    return [
        f"{unit.where}: --enable-pd-role-switch on transfer_backend {backend} can never switch: its KV "
        "manager does not support runtime role switch (SGLang refuses every switch, "
        "srt/disaggregation/role_switch.py:205-211; only mooncake and mori switch): drop "
        "--enable-pd-role-switch, or use mooncake or mori"
    ]


def prefill_complete(unit: PdUnit, backend: str) -> list[str]:
    """pd_disaggregation_hook.py:199-242, what the allocation policy prefill_complete does not yet support.
    Its attention-DP test reads --enable-dp-attention, which parallel_hook.py:39-61 has cleared before
    (pipeline.py:45 against :147): any TP above one is refused, however attention DP is spelled."""
    flags = unit.host.sglang.flags
    said = [what for names, what in PREFILL_COMPLETE if any(_cond(unit, flags, n) for n in names)]
    if backend not in ("mooncake", "mooncake_tcp"):  # mooncake_tcp is rewritten to mooncake first (:30-41)
        said.insert(0, f"transfer backends other than Mooncake ({backend})")
    if not said:
        return []
    return [
        f"{unit.where}: --disaggregation-decode-allocation-policy prefill_complete does not yet support "
        f"{', '.join(said)} (SGLang refuses it at the start, {HOOK}:199-242): set the policy to early on "
        "every role, or drop those"
    ]


def _cond(unit: PdUnit, flags: Mapping[str, object], name: str) -> bool:
    if name in NUMERIC:
        return _num(flags, *NUMERIC[name], default=1) != 1
    if name == "decoupled-spec-role":
        return str(flags.get(name) or "null") != "null"
    if name == "host-receive":
        return threshold(flags) < 1
    if name == "decode-cache":
        on = _on(flags, "disaggregation-decode-enable-radix-cache") or _on(flags, "enable-hierarchical-cache")
        return unit.role is Role.DECODE and on
    if name == "prefill-hicache":
        policy = str(flags.get("hicache-write-policy") or "write_through")  # its default (fields/memory.py)
        other = flags.get("hicache-storage-backend") is not None or policy != "write_back"
        return unit.role is Role.PREFILL and _on(flags, "enable-hierarchical-cache") and other
    if name.startswith("env:"):
        return _env(unit, name[4:])
    return _on(flags, name)


NUMERIC = {
    "tp": ("tp-size", "tensor-parallel-size", "tp"),
    "pp": ("pp-size", "pipeline-parallel-size", "pp"),
    "attn-cp": ("attn-cp-size",),
    "dcp": ("dcp-size",),
}
PREFILL_COMPLETE = (
    (("pp", "attn-cp", "dcp"), "pipeline or attention context parallelism"),
    (("tp",), "attention tensor parallelism greater than one (--tp-size above 1)"),
    (("enable-pdmux", "decoupled-spec-role"), "PD multiplexing or decoupled speculation"),
    (("enable-pd-role-switch",), "runtime PD role switching"),
    (("encoder-only", "language-only"), "encoder disaggregation"),
    (("enable-hisparse",), "HiSparse"),
    (("host-receive",), "decode host KV buffering"),
    (("decode-cache",), "decode radix cache or decode HiCache"),
    (("prefill-hicache",), "prefill HiCache other than L2 write_back"),
    (("env:SGLANG_DISAGG_STAGING_BUFFER",), "staging buffers"),
    (("env:SGLANG_RUST_SERVER",), "the Rust bootstrap registry"),
)


def start_refusals(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """Every role's start refusals from the PD hook, in the roles' order."""
    backend = spec(host).transfer_backend
    found: list[str] = []
    for unit in units:
        policy = str(unit.host.sglang.flags.get("disaggregation-decode-allocation-policy") or "early")
        found += host_receive(unit) + decode_radix(unit, backend) + environment(unit, backend)
        found += role_switch(unit) + switch_backend(unit, backend) + speculation(unit)
        if policy == "prefill_complete":
            found += prefill_complete(unit, backend)
    return found
