"""Shell completion for bash, zsh and fish, by argcomplete: the shell runs deployctl with _ARGCOMPLETE set
and the words so far in COMP_LINE/COMP_POINT; the parser itself answers, so subcommands and options never
drift from what the commands take. Host names come from the inventory folder (--units, $DEPLOYCTL_UNITS or
./units), fleet groups from its files, backup names from what deployctl last saw on the service's host
(agent/orchestrate/backup_names.py: written by `backups`, `rollback` and `apply`; completion never connects).

Set-up, once per shell (docs/commands.md): `eval "$(register-python-argcomplete deployctl)"` (bash, zsh),
`register-python-argcomplete --shell fish deployctl > ~/.config/fish/completions/deployctl.fish` (fish).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, TextIO

from agent.inventory import known_hosts, load_services, units_dir


def host_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The inventory's service names that start with what was typed."""
    directory = units_dir(getattr(parsed_args, "units", None))
    return [h for h in known_hosts(directory) if h.startswith(prefix)] if directory.is_dir() else []


def group_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The inventory's groups (groups = [...]) and `all`."""
    directory = units_dir(getattr(parsed_args, "units", None))
    services = load_services(directory, skip_broken=True) if directory.is_dir() else []
    groups = {"all", *(g for s in services for g in s.config.groups)}
    return sorted(g for g in groups if g.startswith(prefix))


def backup_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The backups deployctl last saw on the service's host, newest first; nothing when it saw none. A
    completer that fails offers nothing: the shell would print its traceback into the command line."""
    try:
        from agent.orchestrate.backup_names import remembered

        service = getattr(parsed_args, "host", None)
        return [n for n in remembered(service) if n.startswith(prefix)] if isinstance(service, str) else []
    except Exception:  # any failure at all: no completion rather than a broken prompt
        return []


def offer(
    parser: argparse.ArgumentParser,
    output_stream: TextIO | None = None,
    exit_method: Callable[[int], object] = os._exit,
) -> None:
    """When the shell asks (_ARGCOMPLETE in the environment), print the completions and exit; else return."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete.finders

    class Finder(argcomplete.finders.CompletionFinder):  # type: ignore[misc]
        def _init_debug_stream(self) -> None:
            """argcomplete's debug lines (_ARC_DEBUG) to stderr, not to a descriptor 9 it would close."""

    Finder()(parser, always_complete_options=False, output_stream=output_stream, exit_method=exit_method)
