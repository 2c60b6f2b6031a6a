"""The router's unit in PD mode, and what its command line must say of each prefill.

sglang-router 0.3.2 (sglang_router/launch_router.py, `--help`): `--pd-disaggregation`, then
`--prefill URL [BOOTSTRAP_PORT]` once per prefill and `--decode URL` once per decode. A prefill named without
its bootstrap port is reached at none (the router's "Defaults to no bootstrap port"), so a decode cannot
pull its KV: the port is always written, and checked in the argv that is rendered.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.inventory import HostConfig
from agent.pd.units import PdUnit, Role, pd_units, router_target, router_unit_name, spec
from agent.protocol.addresses import same_host
from agent.sglang.flags import FlagInput, exec_start_lines, quote_word


def router_words(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """The router's arguments after its executable, one word each."""
    router = spec(host).router
    words = ["--host", router.host, "--port", str(router.port), "--pd-disaggregation"]
    for unit in units:
        if unit.role is Role.PREFILL:
            words += ["--prefill", unit.url, str(unit.bootstrap_port)]
        else:
            words += ["--decode", unit.url]
    return words


def unnamed_bootstraps(words: Sequence[str], units: Sequence[PdUnit]) -> list[str]:
    """The prefills the router's words do not name with their own bootstrap port, and the decodes they do
    not name; [] when every unit is routed right."""
    said_prefill: dict[str, str | None] = {}
    said_decode: set[str] = set()
    for i, word in enumerate(words):
        if word == "--prefill" and i + 1 < len(words):
            following = words[i + 2] if i + 2 < len(words) else None
            said_prefill[words[i + 1]] = following if following and not following.startswith("--") else None
        elif word == "--decode" and i + 1 < len(words):
            said_decode.add(words[i + 1])
    problems = []
    if "--pd-disaggregation" not in words:
        problems.append("the router is not in PD mode (--pd-disaggregation)")
    for unit in units:
        if unit.role is Role.PREFILL:
            port = said_prefill.get(unit.url, "absent")
            if port != str(unit.bootstrap_port):
                problems.append(
                    f"{unit.label} {unit.url}: the router names bootstrap port {port}, "
                    f"not its {unit.bootstrap_port}"
                )
        elif unit.url not in said_decode:
            problems.append(f"{unit.label} {unit.url}: not named to the router with --decode")
    return problems


def _grouped(first: str, words: Sequence[str]) -> list[str]:
    """The executable's line, then each option with the words that follow it on a line of its own."""
    lines = [first]
    for word in words:
        if word.startswith("--"):
            lines.append(quote_word(word))
        else:
            lines[-1] += " " + quote_word(word)
    return lines


def router_flags(host: HostConfig) -> dict[str, FlagInput]:
    return dict(spec(host).router.flags)


def render_router_unit(host: HostConfig) -> str:
    """The router's unit: its command in PD mode with every prefill's bootstrap port; after the roles' units
    on its host (Wants= only: a role restarting must not stop the router)."""
    from agent.render import env_word, validate_environment  # jinja2 loads only for a render

    router = spec(host).router
    validate_environment(router.environment, "pd.router.environment")
    units = pd_units(host)
    local = [u.host.unit.name for u in units if same_host(u.target, router_target(host))]
    argv = [*_grouped(exec_start_lines(router.executable, {})[0], router_words(host, units))]
    argv += exec_start_lines(router.executable, router_flags(host))[1:]
    lines = [
        f"# Rendered by deployctl for service {host.name}: sglang-router {router.version} in PD mode.",
        "# Each prefill is named with its bootstrap port: without it a decode cannot pull the prefill's KV.",
        "[Unit]",
        f"Description=SGLang router (PD) for {host.name}",
        "After=network-online.target" + "".join(f" {name}" for name in local),
        "Wants=network-online.target",
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=simple",
        *([f"User={host.unit.user}"] if host.unit.user else []),
        *(f"Environment={env_word(k, v)}" for k, v in router.environment.items()),
        "ExecStart=" + " \\\n    ".join(argv),
        "Restart=on-failure",
        "RestartSec=10",
        "LimitNOFILE=65536",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["render_router_unit", "router_unit_name", "router_words", "unnamed_bootstraps"]
