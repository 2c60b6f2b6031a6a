"""The router's unit in PD mode, and what its command line must say of each prefill.

sglang-router 0.3.2 (sglang_router/launch_router.py, `--help`): `--pd-disaggregation`, then
`--prefill URL [BOOTSTRAP_PORT]` once per prefill and `--decode URL` once per decode. A prefill named without
its bootstrap port is reached at none (the router's "Defaults to no bootstrap port"), so a decode cannot
pull its KV: the port is always written, and checked in the argv that is rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import takewhile

from agent.inventory import HostConfig
from agent.pd.units import PdUnit, Role, pd_units, router_target, router_unit_name, spec
from agent.protocol.addresses import same_host
from agent.sglang.flags import FlagInput, exec_start_lines, flag_words, quote_word


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


def router_argv(host: HostConfig, units: Sequence[PdUnit]) -> list[str]:
    """Every word the router's unit runs: [pd.router] executable (a person may have put words there too),
    the words [pd] renders, and [pd.router] flags."""
    router = spec(host).router
    flags = [w for name, value in router_flags(host).items() for w in flag_words(name, value)]
    return [*router.executable, *router_words(host, units), *flags]


def _named(words: Sequence[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(URL, bootstrap port or None) for each --prefill, and the URL of each --decode, as sglang-router's
    argparse reads them (router_args.py: --prefill nargs="+" action="append", --decode nargs=1): a
    `--prefill=URL` word carries the URL alone."""
    prefills: list[tuple[str, str | None]] = []
    decodes: list[str] = []
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        values = [inline] if eq else list(takewhile(lambda w: not w.startswith("--"), words[i + 1 : i + 3]))
        if name == "--prefill" and values:
            prefills.append((values[0], values[1] if len(values) > 1 else None))
        elif name == "--decode" and values:
            decodes.append(values[0])
    return prefills, decodes


def unnamed_bootstraps(words: Sequence[str], units: Sequence[PdUnit]) -> list[str]:
    """What the router's words (its whole argv) get wrong: a prefill not named once with its own bootstrap
    port, a decode not named once, a URL that is no unit's; [] when every unit is routed right."""
    prefills, decodes = _named(words)
    problems = (
        [] if "--pd-disaggregation" in words else ["the router is not in PD mode (--pd-disaggregation)"]
    )
    for unit in units:
        said = [p or "none" for url, p in prefills if url == unit.url] if unit.role is Role.PREFILL else []
        if unit.role is Role.PREFILL and said != [str(unit.bootstrap_port)]:
            port = " and ".join(said) if said else "absent"
            own = unit.bootstrap_port
            problems.append(f"{unit.label} {unit.url}: the router names bootstrap port {port}, not its {own}")
        elif unit.role is Role.DECODE and decodes.count(unit.url) != 1:
            many = "named to the router more than once" if unit.url in decodes else "not named to the router"
            problems.append(f"{unit.label} {unit.url}: {many} with --decode")
    known = {u.url for u in units}
    problems += [f"{url}: named to the router, but no [pd] unit's url" for url in
                 dict.fromkeys([u for u, _ in prefills] + decodes) if url not in known]  # fmt: skip
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


__all__ = ["render_router_unit", "router_argv", "router_unit_name", "router_words", "unnamed_bootstraps"]
