"""Reading a PlanInput: its flags (the first spelling set, as an integer, a number, a bare switch), the
SGLang version it runs, and where its architecture came from. What every step of the planner reads the
same way (plan/sizing.py, plan/predict.py, plan/from_facts.py)."""

from __future__ import annotations

from collections.abc import Mapping

from agent.errors import UsageError
from agent.inventory import FlagValue
from agent.plan.facts import PlanInput
from agent.sglang import kvpool
from agent.sglang.flagrules import AT_LEAST_ONE
from agent.sglang.server_args import human_int

OFF = ("0", "false", "False", "no")


def value_of(flags: Mapping[str, FlagValue], *names: str) -> FlagValue | None:
    for name in names:
        if name in flags and flags[name] is not None:
            return flags[name]
    return None


HUMAN_INT = frozenset({"max-total-tokens"})


def int_of(flags: Mapping[str, FlagValue], *names: str) -> int | None:
    value = value_of(flags, *names)
    if value is None or isinstance(value, bool):
        return None
    # SGLang reads --max-total-tokens with human_readable_int (arg_groups/fields/schedule.py:39-50): 100k
    read = human_int if names[0] in HUMAN_INT else int
    try:
        number = read(str(value))
    except ValueError:
        raise UsageError(f"flags: --{names[0]} {value!r} is not an integer") from None
    if number < 1 and names[0] in AT_LEAST_ONE:  # the planner refuses what the flag table refuses
        raise UsageError(f"flags: --{names[0]} {value!r} must be >= 1")
    return number


def float_of(flags: Mapping[str, FlagValue], *names: str) -> float | None:
    value = value_of(flags, *names)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(str(value))
    except ValueError:
        raise UsageError(f"flags: --{names[0]} {value!r} is not a number") from None


def is_on(flags: Mapping[str, FlagValue], name: str) -> bool:
    value = flags.get(name)
    return value is True or str(value).lower() in ("true", "1", "yes", "")


def draft_model(flags: Mapping[str, FlagValue]) -> str | None:
    """The speculative algorithm, upper-case, when it runs a draft model (NGRAM loads none); else None."""
    algorithm = str(value_of(flags, "speculative-algorithm") or "").upper()
    return algorithm if algorithm not in ("", "NGRAM") else None


def decode_graphs_off(flags: Mapping[str, FlagValue]) -> bool:
    """Whether the unit turns SGLang's decode CUDA graphs off, in either of the ways
    arg_groups/cuda_graph_hook.py reads: --disable-cuda-graph, --cuda-graph-backend-decode disabled."""
    off = "disable-cuda-graph" in flags and is_on(flags, "disable-cuda-graph")
    return off or value_of(flags, "cuda-graph-backend-decode") == "disabled"


def sglang_version(inp: PlanInput) -> tuple[int, int, int, int] | None:
    try:
        return kvpool.parse_version(inp.sglang_version)
    except ValueError:
        return None


def origin(inp: PlanInput) -> str:
    """Where the architecture came from, in the words a note asks the reader to check."""
    return "the inventory" if inp.sources.get("architecture", "").startswith("inventory") else "the facts"
