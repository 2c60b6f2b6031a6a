"""The `inspect` verb: find the unit that runs SGLang and read it for `deployctl adopt`. Read-only.

What leaves the host: the unit's modeled parts, its other directives, its drop-ins, and systemd's own parse
of ExecStart=. Never a secret value: secret environment variables are named only; secret flags' values,
secret variables in drop-ins and inline credentials (SetCredential=) are replaced by ***.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from pathlib import Path

from agent.host.model_facts import sglang_version
from agent.host.systemd import Systemd, SystemdError
from agent.protocol.answers import DropInData, HomeData, InspectAnswer, InspectedUnit
from agent.protocol.requests import Request
from agent.sglang.flags import FlagsError, unit_lines
from agent.sglang.redact import redact
from agent.sglang.unitfile import (
    AdoptError,
    Directive,
    read_unit,
    redact_secret_flags,
    runs_sglang,
    split_environment,
)

# systemd's unit search path for system units, highest priority first.
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)


def inspect(req: Request) -> InspectAnswer:
    """The SGLang units on this host (`candidates`) and, for each and for req.unit, what adopt needs."""
    names = _mentioning_sglang()
    units: dict[str, InspectedUnit] = {}
    candidates: list[str] = []
    with Systemd() as sd:
        for name in sorted(names | {req.unit}):
            try:
                state = sd.unit_state(name)
                commands = sd.exec_commands(name) if state.load_state == "loaded" else []
            except SystemdError:
                continue
            if state.load_state != "loaded":
                continue
            if any(runs_sglang(argv) for _path, argv in commands):
                candidates.append(name)
            elif name != req.unit:
                continue
            units[name] = _describe(name, state.fragment_path, state.drop_in_paths, commands)
    return {"candidates": candidates, "units": units}


def _mentioning_sglang() -> set[str]:
    """Service units whose file or drop-ins mention sglang: the cheap filter before asking systemd."""
    names: set[str] = set()
    for directory in UNIT_DIRS:
        for path in glob.glob(f"{directory}/*.service") + glob.glob(f"{directory}/*.service.d/*.conf"):
            unit = Path(path).name if path.endswith(".service") else Path(path).parent.name[: -len(".d")]
            if "@" in unit:
                continue  # template units: an instance names itself
            with contextlib.suppress(OSError):
                if b"sglang" in Path(path).read_bytes():
                    names.add(unit)
    return names


def _describe(
    name: str, fragment: str, drop_ins: tuple[str, ...], commands: list[tuple[str, tuple[str, ...]]]
) -> InspectedUnit:
    info: InspectedUnit = {"name": name, "fragment_path": fragment, "problems": []}
    try:
        text = Path(fragment).read_bytes().decode("utf-8")
        hand = read_unit(text)
    except (OSError, UnicodeDecodeError, AdoptError) as exc:
        return {**info, "problems": [f"{fragment}: cannot read: {exc}"]}
    info.update(
        InspectedUnit(
            description=hand.description,
            user=hand.user,
            environment=[[k, v] for k, v in hand.environment.items()],  # a list: the reply's keys are sorted
            secret_environment=hand.secret_environment,
            directives=[[d.section, d.key, _shown(d)] for d in hand.other],
            secret_directives=[d.key for d in hand.other if _shown(d) != d.value],
            exec_start_raw_count=len(hand.exec_start),
            exec_start_prefix=(hand.exec_start[0][:1] if hand.exec_start else ""),
        )
    )
    if len(commands) == 1:
        path, argv = commands[0]
        shown, secret_flags = redact_secret_flags(argv)
        info.update(InspectedUnit(exec_path=path, exec_argv=shown, secret_flags=secret_flags))
        info["config_json"] = _config_json(argv)
        info["sglang_version"] = sglang_version(path)  # read, never run
    info["drop_ins"] = [_drop_in(p) for p in drop_ins]
    info["home"] = _home(hand.user)
    return info


def _home(user: str | None) -> HomeData | None:
    """The service user's home and whether that user can write it: SGLang's caches default to ~/.cache."""
    import pwd

    try:
        entry = pwd.getpwnam(user or "root")
        st = os.stat(entry.pw_dir)
    except (KeyError, OSError):
        return {"path": None, "writable": False} if user else None
    writable = entry.pw_uid == 0 or (st.st_uid == entry.pw_uid and bool(st.st_mode & 0o200))
    return {"path": entry.pw_dir, "writable": writable}


def _drop_in(path: str) -> DropInData:
    """A drop-in's directives, secret variables' values replaced: it stays on the host as it is."""
    try:
        hand = read_unit(Path(path).read_bytes().decode("utf-8", "replace"))
    except (OSError, AdoptError) as exc:
        return {"path": path, "lines": [], "problem": str(exc)}
    lines = []
    for d in hand.other:
        lines.append(f"[{d.section}] {d.key}={_shown(d)}")
    if hand.user:
        lines.append(f"[Service] User={hand.user}")
    for key, value in hand.environment.items():
        lines.append(f"[Service] Environment={key}={value}")
    lines += [f"[Service] Environment={k}=***" for k in hand.secret_environment]
    lines += [f"[Service] ExecStart={_shown(Directive('Service', 'ExecStart', v))}" for v in hand.exec_start]
    return {"path": path, "lines": lines, "sets_exec_start": bool(hand.exec_start)}


def _shown(d: Directive) -> str:
    """A directive's value fit to leave the host: SetCredential= data, a secret --flag's value (in an
    ExecStartPre=, say) or a secret-looking variable's value replaced by ***."""
    # Under its section header: a unit's first line is read as maybe a directive's tail, with more care
    # than a directive needs (KeyringMode=, PassEnvironment= would look secret).
    return redact(f"[{d.section}]\n{d.line}").partition("\n")[2].partition("=")[2]


def _config_json(argv: tuple[str, ...]) -> str | None:
    """The model's config.json on the host, where the planner reads the architecture from."""
    words = list(argv)
    for i, word in enumerate(words):
        value = word.partition("=")[2] if word.startswith("--model-path=") else None
        if word == "--model-path" and i + 1 < len(words):
            value = words[i + 1]
        if value and value.startswith("/") and os.path.isfile(f"{value}/config.json"):
            return f"{value}/config.json"
    return None


def kept_secret_env(names: tuple[str, ...], env_file: str | None, unit_text: str | None) -> dict[str, str]:
    """The values of the secret variables an adopted inventory keeps on the host, as systemd gives them to
    the service: the root-only file deployctl wrote (EnvironmentFile= overrides Environment=), else the
    hand-written unit's Environment= lines, the last assignment winning (an empty one clears those before)."""
    from_unit: dict[str, str] = {}
    with contextlib.suppress(FlagsError, AdoptError):
        for section, key, value in unit_lines(unit_text or ""):
            if section == "Service" and key == "Environment":
                from_unit = {**from_unit, **dict(split_environment(value))} if value else {}
    found = {**from_unit, **_env_file_values(env_file)}
    return {name: found[name] for name in names if name in found}


def _env_file_values(text: str | None) -> dict[str, str]:
    """secrets.env_file_text() read back: NAME="value" with \\ \" \\$ \\` escaped."""
    values = {}
    for line in (text or "").splitlines():
        name, eq, quoted = line.partition("=")
        if eq and len(quoted) >= 2 and quoted[0] == quoted[-1] == '"':
            values[name] = re.sub(r"\\(.)", r"\1", quoted[1:-1])
    return values
