"""Render a host's unit from its template: every value checked and quoted first, output deterministic."""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import jinja2

from agent.errors import RenderError
from agent.inventory import VISIBLE, HostConfig
from agent.plan import weight_cache_unit
from agent.plan.effective import check_table
from agent.plan.hostplan import memory_max_of
from agent.plan.unitlimit import sets_memory_max
from agent.protocol.common import CONTROL, SECRET_CREDENTIAL, SURROGATE, UNPRINTABLE, secret_path
from agent.protocol.requests import stop_timeout_s
from agent.sglang import server_args, version_flags
from agent.sglang.flagrules import canonical
from agent.sglang.flags import FlagInput, FlagsError, exec_start_lines
from agent.sglang.redact import SECRET_FLAG, is_secret_env
from agent.sglang.redact import redact as redact  # re-exported: the laptop's callers redact from here
from agent.sglang.redact import redact_changes as redact_changes
from agent.sglang.redact import redact_flags as redact_flags

FLAG_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRETS_DIR = re.compile(r"/[A-Za-z0-9_./-]*")  # written into EnvironmentFile= and LoadCredential= as is
CACHE_DIR = re.compile(r"[A-Za-z0-9_@-][A-Za-z0-9_.@-]*(/[A-Za-z0-9_@-][A-Za-z0-9_.@-]*)*")
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def template_dir() -> Path:
    """The packaged templates: agent/templates, a link to the top-level templates/ in a source tree."""
    return Path(__file__).parent / "templates"


def check_text(field: str, value: str) -> str:
    """Refuse a value with a control character or a lone surrogate, naming the field."""
    label = UNPRINTABLE.sub(lambda c: _escaped(c.group()), field)  # a flag name can carry one too
    bad = SURROGATE.search(value)
    if bad:
        raise RenderError(
            f"{label}: is not valid UTF-8 ({_escaped(bad.group())}: bytes that are not text, "
            "e.g. from a command line in another encoding)"
        )
    m = CONTROL.search(value)
    if m:
        raise RenderError(
            f"{label}: contains a control character ({_escaped(m.group())}); "
            "a newline must never reach a unit file"
        )
    return value


def _escaped(char: str) -> str:
    return ascii(char)[1:-1]


def check_flag(name: str, value: FlagInput, field: str = "flags") -> None:
    """A flag name and value that can be written to ExecStart=."""
    check_text(f"{field}.{name}", name)
    if not FLAG_NAME.fullmatch(name):
        raise RenderError(f"{field}.{name}: a flag name must match {FLAG_NAME.pattern} (no leading --)")
    words = value if isinstance(value, tuple) else (value,)
    for word in words:
        if isinstance(word, str):
            check_text(f"{field}.{name}", word)
        elif isinstance(word, float) and not math.isfinite(word):
            raise RenderError(f"{field}.{name}: {word!r} is not a finite number")


def secret_env(host: HostConfig) -> dict[str, str]:
    """The environment variables whose values go to the root-only file, never into the unit."""
    return {k: v for k, v in host.unit.environment.items() if is_secret_env(k, host.unit.secret_environment)}


def split_secret_flags(
    flags: Mapping[str, FlagInput], unit: str
) -> tuple[dict[str, FlagInput], dict[str, str]]:
    """(flags for ExecStart=, secret flags for the root-only --config file): no secret in argv, which
    any user reads in /proc/<pid>/cmdline, `ps` and `systemctl show`."""
    public: dict[str, FlagInput] = {}
    secret: dict[str, str] = {}
    for name, value in flags.items():
        if not SECRET_FLAG.search(name) or value is True:
            public[name] = value
        elif isinstance(value, tuple):
            raise RenderError(f"flags.{name}: a secret flag takes one value")
        else:
            secret[name] = str(value)
    if secret and "config" in public:
        raise RenderError(
            "flags.config: secret flags (" + ", ".join(f"--{n}" for n in secret) + ") reach SGLang through "
            "its --config file; move your own --config settings into [sglang.flags]"
        )
    if secret:
        public["config"] = f"/run/credentials/{unit}/{SECRET_CREDENTIAL}"  # systemd's own place for it
    return public, secret


def secret_values(host: HostConfig, flags: Mapping[str, FlagInput]) -> tuple[dict[str, str], dict[str, str]]:
    """The secret environment and secret flags the unit rendered for `flags` refers to."""
    return secret_env(host), split_secret_flags(effective_flags(host, flags), host.unit.name)[1]


def secrets_line(host: HostConfig, env: Mapping[str, str], flags: Mapping[str, str]) -> str:
    """What is said about secrets: their names and where they live, never their values."""
    names = ", ".join([*env, *(f"--{f}" for f in flags)])
    return f"secrets (values never shown): {names}: root-only files under {host.unit.secrets_directory}"


def effective_flags(host: HostConfig, flags: Mapping[str, FlagInput]) -> dict[str, FlagInput]:
    """The inventory's baseline flags updated by `flags`, with the model, draft and listen address added."""
    merged: dict[str, FlagInput] = {}
    version = host.sglang.version
    # An adopted baseline lists --model-path (or its alias --model) where the hand-written unit had it: keep
    # that order.
    if "model-path" not in {canonical(k, version) for k in host.sglang.flags}:
        merged["model-path"] = host.model.path
    if host.model.served_name and "served-model-name" not in host.sglang.flags:
        merged["served-model-name"] = host.model.served_name
    merged.update(host.sglang.flags)
    _over(merged, weight_cache_unit.engine_flags(host), version)  # [weight_cache]: client mode
    _over(merged, flags, version)
    tail: dict[str, FlagInput] = {}
    if host.draft:
        tail["speculative-algorithm"] = host.draft.algorithm
        tail["speculative-draft-model-path"] = host.draft.path
    tail.update({"host": host.sglang.host, "port": host.sglang.port})
    for name, value in tail.items():
        merged.setdefault(name, value)
    # False: leave the flag out; a list flag's text ("1 2 4") is written as its words
    return server_args.as_words(version, {k: v for k, v in merged.items() if v is not False})


def _over(merged: dict[str, FlagInput], flags: Mapping[str, FlagInput], version: str) -> None:
    """`flags` over `merged`, each replacing every spelling of its flag (--tp-size drops a baseline's
    --tensor-parallel-size, its alias in SGLang's argparse: srt/arg_groups/fields/parallel.py:49) as the
    planner does (plan/effective.py): both rendered, SGLang would run whichever comes last."""
    names = {canonical(k, version) for k in flags}
    for key in [k for k in merged if k not in flags and canonical(k, version) in names]:
        del merged[key]
    merged.update(flags)


def _host_fields(host: HostConfig) -> Iterator[tuple[str, str]]:
    """Every text of the inventory that reaches the unit file, with its field name."""
    yield "name", host.name
    yield "model.path", host.model.path
    yield "model.served_name", host.model.served_name or ""
    if host.draft:
        yield "draft.path", host.draft.path
    yield "unit.name", host.unit.name
    yield "unit.template", host.unit.template
    yield "unit.description", host.unit.description
    yield "unit.user", host.unit.user or ""
    yield "sglang.host", host.sglang.host
    for i, word in enumerate(host.sglang.executable):
        yield f"sglang.executable[{i}]", word


def validate(host: HostConfig, flags: Mapping[str, FlagInput]) -> None:
    """Check every value before anything is rendered; the first bad one raises RenderError."""
    for field, value in _host_fields(host):
        check_text(field, value)
    validate_environment(host.unit.environment)
    for flag, baseline_value in host.sglang.flags.items():
        check_flag(flag, baseline_value, "sglang.flags")
    for flag, flag_value in flags.items():
        check_flag(flag, flag_value)
    for refusal in version_flags.refused(host.sglang.version, {**host.sglang.flags, **flags}):
        raise RenderError(refusal)
    check_with_sglang_table(host, flags)
    if host.unit.user is not None and not USER_NAME.fullmatch(host.unit.user):
        raise RenderError(f"unit.user: {host.unit.user!r} is not a user name")
    _validate_cache_directory(host)
    if host.unit.description.endswith("\\"):
        raise RenderError("unit.description: must not end with a backslash (it would continue the line)")
    if not SECRETS_DIR.fullmatch(host.unit.secrets_directory):
        raise RenderError(
            f"unit.secrets_directory: {host.unit.secrets_directory!r} must match {SECRETS_DIR.pattern}"
        )
    if not host.sglang.executable or not host.sglang.executable[0].startswith("/"):
        raise RenderError("sglang.executable[0]: must be an absolute path")
    _validate_adopted(host)
    if "/" in host.unit.template or host.unit.template.startswith("."):
        raise RenderError(f"unit.template: {host.unit.template!r} must be a file name in the template folder")


def check_with_sglang_table(host: HostConfig, flags: Mapping[str, FlagInput]) -> None:
    """The flags against SGLang's own table (plan/effective.py check_table): the render's own check of the
    unit it writes, after the one made when the command built its effective configuration."""
    check_table(host, flags)


def _validate_cache_directory(host: HostConfig) -> None:
    if not CACHE_DIR.fullmatch(cache_directory(host)) or ".." in cache_directory(host).split("/"):
        raise RenderError(
            f"unit.cache_directory: {host.unit.cache_directory!r} must be a folder name under /var/cache "
            "(letters, digits, _ . @ -, no '..')"
        )


def validate_environment(environment: Mapping[str, str], where: str = "unit.environment") -> None:
    for name, env_value in environment.items():
        check_text(f"{where}.{name}", name)
        if not ENV_NAME.fullmatch(name):
            raise RenderError(f"{where}.{name}: a variable name must match {ENV_NAME.pattern}")
        check_text(f"{where}.{name}", env_value)


_DIRECTIVE_LINE = re.compile(r"[A-Z][A-Za-z0-9]*=.*")


def _validate_adopted(host: HostConfig) -> None:
    """The verbatim directives and the kept secret names of an adopted unit."""
    if host.unit.verbatim and host.unit.template == "sglang.service.j2":
        raise RenderError(
            "unit.verbatim: only templates/sglang-adopted.service.j2 renders it (unit.template)"
        )
    for section, lines in host.unit.verbatim.items():
        for i, line in enumerate(lines):
            field = f"unit.verbatim.{section}[{i}]"
            check_text(field, line)
            if not _DIRECTIVE_LINE.fullmatch(line):
                raise RenderError(f"{field}: {line!r} is not a Key=value directive")
            if (len(line) - len(line.rstrip("\\"))) % 2:
                raise RenderError(f"{field}: must not end with a backslash (it would continue the line)")
    for name, value in host.sglang.flags.items():  # --model is its alias (server_args.py)
        if canonical(name, host.sglang.version) == "model-path" and value != host.model.path:
            raise RenderError(f"sglang.flags.{name}: must be the same as model.path")
    for name in host.unit.secret_environment_on_host:
        if not ENV_NAME.fullmatch(name) or name in host.unit.environment:
            raise RenderError(
                f"unit.secret_environment_on_host: {name!r} must be a variable name not in unit.environment"
            )


# SGLang's compile caches, all under SGLANG_CACHE_DIR (default ~/.cache/sglang of the service user):
# DeepGEMM (srt/layers/deep_gemm_wrapper/compile_utils.py: SGLANG_DG_CACHE_DIR), Triton, Inductor, CUDA,
# TileLang and FlashInfer (srt/environ.py third_party_cache_defaults, applied by sglang/__init__.py), CuTe
# AOT -- except its JIT kernel builds, which default to ~/.cache/sglang/jit whatever SGLANG_CACHE_DIR says
# (kernels/jit/utils/compile/cache.py cache_root): that one is set too.
CACHE_ENV = ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR")


def cache_directory(host: HostConfig) -> str:
    """The unit's folder under /var/cache: the inventory's, else the unit's name without .service."""
    return host.unit.cache_directory or host.unit.name.removesuffix(".service")


def cache_environment(host: HostConfig) -> dict[str, str]:
    """SGLANG_CACHE_DIR and SGLANG_JIT_CACHE_DIR in the persistent folder, unless the inventory sets them."""
    if any(name in host.unit.environment for name in CACHE_ENV):
        return {}
    base = f"/var/cache/{cache_directory(host)}"
    return {"SGLANG_CACHE_DIR": base, "SGLANG_JIT_CACHE_DIR": f"{base}/jit"}


def gpu_environment(host: HostConfig) -> dict[str, str]:
    """The service's GPUs (gpus.indices) as CUDA sees them: CUDA_VISIBLE_DEVICES in the inventory's order,
    and PCI-bus order, so that the indices mean what nvidia-smi numbers (CUDA's own default order, fastest
    first, differs on a host with mixed GPUs) unless the inventory sets CUDA_DEVICE_ORDER itself."""
    if host.gpus.indices is None:
        return {}
    env = {VISIBLE: ",".join(str(i) for i in host.gpus.indices)}
    if "CUDA_DEVICE_ORDER" not in host.unit.environment:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def _specifiers(text: str) -> str:
    """Escape systemd's specifier character in free text (Description=, User=)."""
    return text.replace("%", "%%")


def env_word(name: str, value: str) -> str:
    """One Environment= assignment, always quoted; it expands specifiers but never $VAR."""
    text = f"{name}={value}".replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _environment_words(host: HostConfig) -> list[str]:
    """The unit's public Environment= words: GPUs, the weight cache's folder, then the inventory's."""
    env = {**gpu_environment(host), **weight_cache_unit.environment(host), **host.unit.environment}
    return [env_word(k, v) for k, v in env.items() if k not in secret_env(host)]


def daemon_environment(host: HostConfig) -> weight_cache_unit.EngineEnvironment:
    """[weight_cache]: the engine's environment as its unit has it, for the daemon's unit."""
    secrets_dir, unit = host.unit.secrets_directory, host.unit.name
    has_file = bool(secret_env(host) or host.unit.secret_environment_on_host)
    path = _specifiers(secret_path(secrets_dir, unit, "env")) if has_file else None
    return weight_cache_unit.EngineEnvironment(tuple(_environment_words(host)), path)


def template_context(host: HostConfig, flags: Mapping[str, FlagInput]) -> dict[str, object]:
    """The values the template sees, every one already quoted or escaped for its directive."""
    public, secret = split_secret_flags(effective_flags(host, flags), host.unit.name)
    try:
        exec_start = exec_start_lines(host.sglang.executable, public)
    except FlagsError as exc:
        raise RenderError(f"flags: {exc}") from None
    secrets_dir, unit = host.unit.secrets_directory, host.unit.name
    return {
        "host_name": host.name,
        "template_name": host.unit.template,
        "description": _specifiers(host.unit.description),
        "user": _specifiers(host.unit.user) if host.unit.user else None,
        "environment": _environment_words(host),
        "cache_environment": [env_word(k, v) for k, v in cache_environment(host).items()],
        "cache_directory": _specifiers(cache_directory(host)) if cache_environment(host) else None,
        "environment_file": (
            _specifiers(secret_path(secrets_dir, unit, "env"))
            if secret_env(host) or host.unit.secret_environment_on_host
            else None
        ),
        "verbatim": host.unit.verbatim,
        "weight_cache_lines": weight_cache_unit.engine_unit_lines(host),
        "load_credential": (
            _specifiers(f"{SECRET_CREDENTIAL}:{secret_path(secrets_dir, unit, 'flags.yaml')}")
            if secret
            else None
        ),
        "exec_start": exec_start,
        "start_timeout_s": host.unit.start_timeout_s,
        "stop_timeout_s": stop_timeout_s(host.drain.timeout_s, host.drain.stop_allowance_s),
        "drain_timeout_s": f"{host.drain.timeout_s:g}",
        "memory_max": (
            None  # the unit's own MemoryMax= holds (the plan sized the pool under it): one line, not two
            if sets_memory_max(host.unit.verbatim.get("Service", []))
            else _memory_max(effective_flags(host, flags))
        ),
    }


def _memory_max(flags: Mapping[str, FlagInput]) -> str | None:
    """MemoryMax= for a HiCache unit with an explicit --hicache-size (plan/hostplan.py memory_max_of)."""
    plain = {k: v for k, v in flags.items() if not isinstance(v, (list, tuple))}
    limit = memory_max_of(plain)
    return None if limit is None else f"{limit // 2**20}M"


def render_unit(host: HostConfig, flags: Mapping[str, FlagInput], template_dir: Path) -> str:
    """The unit text for `host` with `flags` over its baseline; the same input gives the same bytes."""
    validate(host, flags)
    text = load_template(host, template_dir).render(template_context(host, flags))
    check_rendered(text)
    return text


def load_template(host: HostConfig, template_dir: Path) -> jinja2.Template:
    """The host's unit template, compiled once per process (jinja2 reloads it if the file changes)."""
    try:
        return _environment(template_dir).get_template(host.unit.template)
    except jinja2.TemplateNotFound:
        raise RenderError(f"unit.template: no template {host.unit.template!r} in {template_dir}") from None


@functools.lru_cache(maxsize=8)
def _environment(template_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def check_rendered(text: str) -> None:
    """The last guard: only \\n may appear as a control character, and only between lines."""
    for number, line in enumerate(text.split("\n"), 1):
        if CONTROL.search(line):
            raise RenderError(f"rendered line {number}: contains a control character")


def unit_diff(old_text: str, new_text: str, name: str) -> str:
    """A unified diff between two versions of the unit `name`; empty when they are equal."""
    lines = difflib.unified_diff(
        _unit_file_lines(old_text),
        _unit_file_lines(new_text),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _unit_file_lines(text: str) -> list[str]:
    """The lines with their ends, split at \\n only, as systemd splits them."""
    # Not str.splitlines(): it also splits at \u2028 or \x1e inside a value, which would cut a secret
    # in two, out of the redaction's reach.
    return [line for line in re.split(r"(?<=\n)", text) if line]
