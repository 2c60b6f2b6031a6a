"""Pure: SGLang 0.5.23's weight-cache daemon as deployctl runs it: its fingerprint, what a change restarts,
what it refuses, and the pool with weights held by another process.

A daemon (`python -m sglang.srt.weight_cache.daemon`, srt/weight_cache/daemon.py) holds the TP-sharded
weights in GPU memory and hands them to an engine in `--weight-cache-mode client` over CUDA IPC. Only a
daemon of its own survives an engine restart: the engine-spawned `daemon` mode "does NOT persist across
restarts" (srt/arg_groups/fields/model.py, the flag's help), so deployctl runs the daemon as its own unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

# srt/weight_cache/protocol.py CacheConfig: the fields an engine's request must match, else the daemon
# refuses and the engine loads from disk. As flags (and the version, for torch_version: a SGLang upgrade
# is where torch moves). mem-fraction-static, context-length, max-running-requests and chunked-prefill-size
# are not in it: a re-size keeps the daemon's weights.
FINGERPRINT_FLAGS = (
    "model-path", "tp-size", "pp-size", "dp-size", "ep-size", "moe-dense-tp-size", "moe-a2a-backend",
    "enable-dp-attention", "enable-dp-lm-head", "attn-cp-size", "quantization", "dtype", "revision",
    "load-format",
)  # fmt: skip
# Spellings SGLang accepts for the same field (server_args aliases).
_ALIASES = {"tensor-parallel-size": "tp-size", "tp": "tp-size", "pipeline-parallel-size": "pp-size"}
# protocol.py IPC_QUANT_ALLOWLIST: "" (unquantized) and "fp8" only when weight_block_size is set.
SHARED_QUANTIZATIONS = ("", "fp8")
SPECULATIVE_FLAGS = ("speculative-algorithm", "speculative-draft-model-path")
# srt/environ.py: both default under /tmp (/tmp/sglang_weight_cache_{device_uuid}.sock|.ready); protocol.py
# refuses a template without {device_uuid}.
SOCKET_TEMPLATE = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"
READY_TEMPLATE = "SGLANG_WEIGHT_CACHE_READY_TEMPLATE"


def daemon_unit_name(engine_unit: str) -> str:
    """The one name of an engine's weight-cache daemon: sglang.service -> sglang-weight-cache.service.

    The renderer writes it into the engine's unit, the host agent derives it from the engine's unit name
    and touches no other unit as the daemon (an adopted unit's own BindsTo= is never taken for it)."""
    return f"{engine_unit.removesuffix('.service')}-weight-cache.service"


def ranks(flags: Mapping[str, object]) -> int:
    """How many daemon processes, each with its own ready file, a one-node daemon runs: pp_size x tp_size
    (srt/weight_cache/daemon.py: "For single-node (nnodes=1): spawns pp_size * tp_size daemons")."""
    named = {_ALIASES.get(k, k): v for k, v in flags.items()}

    def size(key: str) -> int:
        try:
            return max(1, int(str(named.get(key) or 1)))
        except ValueError:
            return 1

    return size("tp-size") * size("pp-size")


class RestartClass(str, Enum):
    """What a change restarts when the weight cache is on."""

    ENGINE = "engine"  # the fingerprint is kept: the daemon's weights serve the new engine
    BOTH = "both"  # the fingerprint changes: the daemon reloads from disk, then the engine maps them
    NO_CACHE = "no_cache"  # the weight cache is off for this service


@dataclass(frozen=True)
class Fingerprint:
    """The part of protocol.py's CacheConfig that a unit's flags and the SGLang version decide."""

    fields: tuple[tuple[str, str], ...]

    def differs(self, other: Fingerprint) -> list[str]:
        mine, theirs = dict(self.fields), dict(other.fields)
        return [k for k in sorted(mine.keys() | theirs.keys()) if mine.get(k) != theirs.get(k)]


def fingerprint(flags: Mapping[str, object], version: str, quant_block: bool | None = None) -> Fingerprint:
    """The fingerprint a daemon started with these flags holds (what the engine must match)."""
    named = {_ALIASES.get(k, k): v for k, v in flags.items()}
    fields = [(k, _text(named.get(k))) for k in FINGERPRINT_FLAGS]
    fields.append(("sglang-version", version))  # torch_version and the kernels move with it
    if quant_block is not None:
        fields.append(("weight-block-size", str(quant_block)))
    return Fingerprint(tuple(fields))


NO_DAEMON = "no daemon runs yet"  # restart_class's reason when the running unit is not in client mode


def restart_class(old: Fingerprint | None, new: Fingerprint, enabled: bool) -> tuple[RestartClass, list[str]]:
    """What this change restarts, and the fingerprint fields that changed (why both restart)."""
    if not enabled:
        return RestartClass.NO_CACHE, []
    changed = [NO_DAEMON] if old is None else old.differs(new)
    return (RestartClass.BOTH, changed) if changed else (RestartClass.ENGINE, [])


def quant_of(config: object) -> tuple[str, bool | None]:
    """(quant_method, block-wise) from a checkpoint's config.json (its quantization_config); a config not
    read (None) gives ("", None): block-wise unknown, so an fp8 flag is not refused on a guess."""
    if not isinstance(config, Mapping):
        return "", None
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return "", False
    return str(quant.get("quant_method") or ""), quant.get("weight_block_size") is not None


def private_tmp(value: str) -> bool:
    """Whether a PrivateTmp= value turns it on (systemd.exec(5): a boolean, or "disconnected" since 257)."""
    return value.strip().lower() not in ("no", "false", "0", "off", "")


def refusals(
    flags: Mapping[str, object],
    quant_method: str,
    block_fp8: bool | None,
    device: str,
    units_private_tmp: bool,
) -> list[str]:
    """Why the weight cache cannot serve this service; each line cites the SGLang rule it follows.

    The one rule set: the laptop's apply, fleet and group paths (plan/weight_cache_unit.py refusal) and
    the host agent (host/roles/daemon.py) all ask it. block_fp8 None: the checkpoint was not read."""
    out = []
    if any(flags.get(f) not in (None, False) for f in SPECULATIVE_FLAGS):
        out.append(
            "speculative decoding: SGLang refuses --weight-cache-mode with --speculative-algorithm, "
            "the daemon does not export the draft model's weights (srt/arg_groups/model_path_hook.py)"
        )
    quant = str(flags.get("quantization") or quant_method or "")
    if quant not in SHARED_QUANTIZATIONS or (quant == "fp8" and block_fp8 is False):
        out.append(
            f"quantization {quant!r}: not on SGLang's CUDA IPC allowlist (unquantized, block-wise fp8; "
            "srt/weight_cache/protocol.py IPC_QUANT_ALLOWLIST)"
        )
    if device not in ("cuda", "rocm"):
        out.append(
            f"device {device!r}: the daemon needs a CUDA-alike platform for CUDA IPC "
            "(srt/weight_cache/daemon.py, is_cuda_alike)"
        )
    if units_private_tmp:
        out.append(
            "PrivateTmp= on the engine's or the daemon's unit: each would see its own /tmp, and SGLang's "
            f"{SOCKET_TEMPLATE} / {READY_TEMPLATE} default there (srt/environ.py)"
        )
    return out


def templates(directory: str) -> dict[str, str]:
    """The socket and ready templates both units set: one folder both see, keyed by GPU as SGLang wants."""
    return {
        SOCKET_TEMPLATE: f"{directory}/{{device_uuid}}.sock",
        READY_TEMPLATE: f"{directory}/{{device_uuid}}.ready",
    }


def pre_model_load_gib(free_at_dist_init_gib: float, preloaded_bytes: int) -> float:
    """The free memory SGLang sizes the pool from when the daemon already holds the weights.

    model_runner.py account_preloaded_weights (PR#34053): dist-init sampled free memory after the daemon
    took its weights, so the slack B x (1 - fraction) was too small; SGLang adds the preloaded bytes back
    onto that baseline. The planner's `pre` for a client engine is this figure, not the sampled one.
    """
    if preloaded_bytes <= 0:
        return free_at_dist_init_gib
    return free_at_dist_init_gib + preloaded_bytes / (1 << 30)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else ""
    return str(value)
