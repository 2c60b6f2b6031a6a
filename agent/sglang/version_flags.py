"""SGLang flags a given version refuses or deprecates, with the spelling that replaces them. Stdlib only.

0.5.23 (server_args.py, arg_groups/): --cuda-graph-max-bs is gone and, argparse allowing prefixes, is now
ambiguous between --cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill: the server does not start.
--enable-dp-attention and --disable-cuda-graph still work but are deprecated (DeprecatedStoreTrueAction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.sglang.kvpool import parse_version


@dataclass(frozen=True)
class FlagRule:
    name: str
    since: tuple[int, int, int, int]
    replacement: str
    refused: bool  # True: the server does not start; False: deprecated, still honoured


RULES = (
    FlagRule("cuda-graph-max-bs", (0, 5, 23, 0), "--cuda-graph-max-bs-decode (and -prefill)", True),
    FlagRule(
        "enable-dp-attention", (0, 5, 23, 0), "--attn-dp-size N (instead of --dp-size N with it)", False
    ),
    FlagRule(
        "disable-cuda-graph",
        (0, 5, 23, 0),
        "--cuda-graph-backend-decode disabled (and --cuda-graph-backend-prefill disabled)",
        False,
    ),
)


def _applies(version: str) -> tuple[int, int, int, int] | None:
    try:
        return parse_version(version)
    except ValueError:
        return None


def refused(version: str, flags: Mapping[str, object]) -> list[str]:
    """One line per flag this SGLang version refuses, naming its replacement."""
    v = _applies(version)
    return [
        f"--{r.name} is not accepted by SGLang {version} (the server would not start): use {r.replacement}"
        for r in RULES
        if r.refused and v is not None and v >= r.since and r.name in flags
    ]


def deprecated(version: str, flags: Mapping[str, object]) -> list[str]:
    """One line per flag this SGLang version deprecates."""
    v = _applies(version)
    return [
        f"--{r.name} is deprecated in SGLang {version}: use {r.replacement}"
        for r in RULES
        if not r.refused and v is not None and v >= r.since and r.name in flags
    ]
