"""The weight-cache daemon's own unit, and what the engine's unit gains in client mode.

systemd semantics chosen (systemd.unit(5), systemd.service(5)), for systemd >= 249 and 252 in particular:
- the engine has `Requires=` + `After=` the daemon: a start of the engine starts the daemon first; an
  explicit stop or restart of the daemon (a fingerprint change) stops or restarts the engine after it;
  restarting the engine alone never touches the daemon (dependencies point from the engine to it);
- not `BindsTo=`: a daemon that dies (kill -9, a CUDA fault) passes through "failed" before its own
  `Restart=` (systemd before 254 has no `RestartMode=direct`), and BindsTo= then stops the engine as a
  dependency, which its `Restart=on-failure` never undoes: the service stayed down for good. Under
  Requires= the daemon's automatic restart is a restart job, which try-restarts the engine after it
  (it maps the reloaded weights; `--weight-cache-timeout` covers the daemon's load); `Upholds=` (249)
  would also restart an engine a person stopped on purpose;
- the engine has `PartOf=` the daemon as well (a restart of the daemon restarts the engine after it);
- the daemon names nothing of the engine's (no `PartOf=`, no `BindsTo=`): an engine restart leaves it
  running with the weights resident; `Restart=always`: a daemon that exits for any reason but a stop
  comes back, and the engine with it.
Both units set SGLang's socket and ready templates to one folder under /run that the daemon's
`RuntimeDirectory=` creates (SGLang's default is /tmp, which `PrivateTmp=` would split).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.inventory import HostConfig
from agent.sglang import weight_cache as wc
from agent.sglang.flags import FlagInput, exec_start_lines
from agent.sglang.weight_cache import daemon_unit_name as daemon_unit_name  # its one definition

DAEMON_MODULE = "sglang.srt.weight_cache.daemon"
# The engine's own [Unit] dependencies the daemon needs as much (nvidia-fabricmanager.service, a mount of
# the model's disk, network-online.target): it loads the same weights onto the same GPUs.
DEPENDENCY_KEYS = ("After", "Wants", "Requires", "Requisite", "BindsTo")
# The engine's [Service] lines that are the host's, not the engine's: its resource limits and environment.
SERVICE_PREFIXES = ("Limit", "Environment", "EnvironmentFile")


@dataclass(frozen=True)
class EngineEnvironment:
    """The engine unit's environment as render.py writes it (Environment= words already quoted, the
    secret variables' root-only file): the daemon reads the same model with the same HF_HOME, HF_TOKEN."""

    words: tuple[str, ...] = ()
    environment_file: str | None = None


def runtime_dir(engine_unit: str) -> str:
    return daemon_unit_name(engine_unit).removesuffix(".service")


def engine_flags(host: HostConfig) -> dict[str, FlagInput]:
    """The engine's flags in client mode (srt/arg_groups/fields/model.py)."""
    if not host.weight_cache.enabled:
        return {}
    return {"weight-cache-mode": "client", "weight-cache-timeout": host.weight_cache.timeout_s}


def environment(host: HostConfig) -> dict[str, str]:
    """SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE / _READY_TEMPLATE for both units."""
    if not host.weight_cache.enabled:
        return {}
    return wc.templates(f"/run/{runtime_dir(host.unit.name)}")


def engine_unit_lines(host: HostConfig) -> list[str]:
    """The engine's [Unit] lines that tie it to its daemon."""
    if not host.weight_cache.enabled:
        return []
    daemon = daemon_unit_name(host.unit.name)
    return [f"Requires={daemon}", f"After={daemon}", f"PartOf={daemon}"]


def python_of(executable: list[str]) -> str:
    """The interpreter of the engine's venv: the program itself when it is a python, else `<bin>/python`
    beside a `sglang` script."""
    program = executable[0] if executable else "/usr/bin/python3"
    head, _, name = program.rpartition("/")
    if name.startswith("python"):
        return program
    return f"{head}/python" if head else "python3"


def daemon_flags(flags: Mapping[str, FlagInput]) -> dict[str, FlagInput]:
    """The engine's flags the daemon must share (its fingerprint: protocol.py CacheConfig), and nothing
    that sizes the pool: a re-size keeps the daemon running."""
    keep = set(wc.FINGERPRINT_FLAGS) | {
        "tensor-parallel-size",
        "tp",
        "pipeline-parallel-size",
        "trust-remote-code",
    }
    return {k: v for k, v in flags.items() if k in keep}


def inherited_unit_lines(host: HostConfig) -> list[str]:
    """The engine's verbatim [Unit] dependencies on other units, without the engine and the daemon."""
    own = {host.unit.name, daemon_unit_name(host.unit.name)}
    lines = []
    for line in host.unit.verbatim.get("Unit", []):
        key, sep, value = line.partition("=")
        if not sep or key.strip() not in DEPENDENCY_KEYS:
            continue
        names = [n for n in value.split() if n not in own]
        if names:
            lines.append(f"{key.strip()}={' '.join(names)}")
    return lines


def inherited_service_lines(host: HostConfig) -> list[str]:
    """The engine's verbatim [Service] limits and environment lines, as written."""
    return [
        line
        for line in host.unit.verbatim.get("Service", [])
        if line.partition("=")[0].strip().startswith(SERVICE_PREFIXES) and "=" in line
    ]


def _environment_lines(
    host: HostConfig, gpu_env: Mapping[str, str], engine: EngineEnvironment | None
) -> list[str]:
    """The engine's environment as rendered (engine), else the GPUs' and the cache's own variables."""
    if engine is None:
        return [f'Environment="{k}={v}"' for k, v in {**gpu_env, **environment(host)}.items()]
    words = [f"Environment={word}" for word in engine.words]
    return words + ([f"EnvironmentFile={engine.environment_file}"] if engine.environment_file else [])


def _limit_lines(host: HostConfig) -> list[str]:
    """LimitMEMLOCK=infinity (CUDA IPC pins memory) unless the engine's unit sets it, then its other lines."""
    limits = inherited_service_lines(host)
    return limits if any(x.startswith("LimitMEMLOCK") for x in limits) else ["LimitMEMLOCK=infinity", *limits]


def render_daemon_unit(
    host: HostConfig,
    flags: Mapping[str, FlagInput],
    gpu_env: Mapping[str, str],
    engine: EngineEnvironment | None = None,
) -> str:
    """The daemon's unit: the engine's user, GPUs, fingerprint flags, host dependencies, limits, env."""
    argv = exec_start_lines(
        [python_of(list(host.sglang.executable)), "-m", DAEMON_MODULE], daemon_flags(flags)
    )
    lines = [
        f"# Rendered by deployctl for host {host.name}: SGLang's weight-cache daemon for {host.unit.name}.",
        "# It holds the weights in GPU memory across engine restarts; an engine restart leaves it running.",
        "[Unit]",
        f"Description=SGLang weight cache for {host.unit.name}",
        f"Before={host.unit.name}",
        *inherited_unit_lines(host),
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=simple",
        *([f"User={host.unit.user}"] if host.unit.user else []),
        *_environment_lines(host, gpu_env, engine),
        f"RuntimeDirectory={runtime_dir(host.unit.name)}",
        "ExecStart=" + " \\\n    ".join(argv),
        "Restart=always",
        "RestartSec=10",
        *_limit_lines(host),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def refusal(
    host: HostConfig,
    flags: Mapping[str, FlagInput],
    quant: tuple[str, bool | None] = ("", None),
    device: str = "cuda",
) -> str | None:
    """Why the weight cache cannot serve this service, in SGLang's words (sglang/weight_cache.py refusals);
    quant: (method, block-wise) from config.json, ("", None) before the host's facts are read (the
    fleet's check before any host: speculative decoding and the --quantization flag)."""
    if not host.weight_cache.enabled:
        return None
    private = any(
        key.strip() == "PrivateTmp" and wc.private_tmp(value)
        for key, _, value in (line.partition("=") for line in host.unit.verbatim.get("Service", []))
    )
    speculative = {**flags, **({"speculative-algorithm": host.draft.algorithm} if host.draft else {})}
    said = wc.refusals(speculative, quant[0], quant[1], device, private)
    return (
        f"[weight_cache] enabled cannot serve {host.name}: {said[0]}; nothing was changed" if said else None
    )
