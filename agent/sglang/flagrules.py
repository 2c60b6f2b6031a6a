"""What deployctl adds to SGLang's own flag table (server_args.py), one set of rules for the inventory's
`[sglang.flags]`, `--set` and a facts file's `flags`: one spelling per flag, values SGLang's parser takes
but its start cannot run with, and the flags the inventory sets under its own keys. Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from agent.sglang.kvpool import parse_version
from agent.sglang.server_args import Value, table_for

# The release whose table deployctl ships (agent/sglang/data/server_args-<version>.json) and checks --set by.
TABLE_VERSION = "0.5.23"

# Counts and sizes SGLang's parser reads as any int (server_args.py add_cli_args: type=int) but its start
# divides by or ranges over (sglang/srt/server_args.py, the scheduler and the memory pool): 0 or less is a
# crash at start, never a plan.
AT_LEAST_ONE = frozenset(
    {"tp-size", "pp-size", "dp-size", "ep-size", "page-size", "attn-cp-size", "moe-dp-size", "dcp-size",
     # a pool, a request table or a context of no token: SGLang cannot serve (kv_cache_configurator.py
     # takes min(profiled, --max-total-tokens), so a negative one is a negative pool)
     "max-total-tokens", "max-running-requests", "context-length"}
)  # fmt: skip
# Parallel sizes: ranks of one dimension. A bigger number is a typo, and the planner walks the stages.
PARALLEL = frozenset({"tp-size", "pp-size", "dp-size", "ep-size", "attn-cp-size", "moe-dp-size", "dcp-size"})
MAX_RANKS = 4096
# A name requests are matched against (openai_api/serving_*.py): an empty one matches no request's model.
NOT_EMPTY = frozenset({"served-model-name"})
# Text SGLang decodes as JSON at start (configs/model_config.py: json.loads(model_override_args)).
JSON_TEXT = frozenset({"json-model-override-args"})
# Flags the inventory writes from its own keys: given as a flag too, the unit would carry two answers and the
# health probe, the port-clash check and the group's rendezvous would follow the other one.
ELSEWHERE = {
    "model-path": "[model] path",
    "port": "[sglang] port",
    "host": "[sglang] host",
    "nnodes": "[nodes] (a service over several hosts)",
    "node-rank": "[nodes] (each node's rank follows its place in [nodes] others)",
    "dist-init-addr": "[nodes] dist_init_addr",
}


def canonical(name: str, version: str) -> str:
    """The spelling SGLang documents first (tp-size for tensor-parallel-size); a `no-` switch and a name
    the table does not know stay as they are."""
    table = table_for(version)
    spec = table.by_name.get(name) if table is not None else None
    if spec is None or name == spec.names[0] or name == f"no-{spec.names[0]}":
        return name
    return spec.names[0]


def canonical_flags(flags: Mapping[str, object], version: str, where: str) -> dict[str, object]:
    """The flags under their canonical names; two spellings of one flag are refused (ValueError), since
    SGLang would run whichever comes last."""
    seen: dict[str, str] = {}
    result: dict[str, object] = {}
    for name, value in flags.items():
        key = canonical(name, version)
        if key in seen:
            raise ValueError(f"{where}.{name}: the same flag as {seen[key]} (--{key}); give it once")
        seen[key] = name
        result[key] = value
    return result


def value_problem(name: str, value: object) -> str | None:
    """Why SGLang's start cannot run with `--name value` though its parser reads it; None when it can."""
    if value is False or value is True:
        return None
    text = str(value).strip()
    if name in AT_LEAST_ONE:
        try:
            number = int(text)
        except ValueError:
            return None  # not a number: SGLang's own table names that
        if number < 1:
            return f"--{name} {text!r} must be >= 1"
        return (
            f"--{name} {text!r} is more than {MAX_RANKS:,} ranks"
            if name in PARALLEL and number > MAX_RANKS
            else None
        )
    if name in NOT_EMPTY and not text:
        return f"--{name} must not be empty"
    if name in JSON_TEXT:
        try:
            json.loads(text)
        except (ValueError, RecursionError) as exc:
            return f"--{name} is not valid JSON ({str(exc).split(':')[0]})"
    return None


def set_elsewhere(name: str) -> str | None:
    """Where the inventory sets this flag, when it sets it under its own key."""
    key = "model-path" if name == "model" else "dist-init-addr" if name == "nccl-init-addr" else name
    place = ELSEWHERE.get(key)
    return None if place is None else f"--{key} is set by the inventory's {place}, not as a flag"


def _older(version: str) -> bool:
    try:
        return parse_version(version) < parse_version(TABLE_VERSION)
    except ValueError:
        return False


def table_warning(version: str, flags: Mapping[str, Value]) -> str | None:
    """For a release whose own table deployctl does not ship, the line that says the --set flags were read
    by TABLE_VERSION's table instead (spellings, then what that table would refuse); None when the
    release's own table checks them (server_args.problems) or nothing was set."""
    if not flags or table_for(version) is not None:
        return None
    shipped = table_for(TABLE_VERSION)
    assert shipped is not None
    older = _older(version)  # a flag 0.5.23 removed was an earlier release's own
    found = [
        said
        for name, value in flags.items()
        if not (older and name in shipped.removed) and (said := shipped.problem(name, value))
    ]
    return (
        f"--set flags are checked against SGLang {TABLE_VERSION}'s flag table, not {version}'s "
        "(deployctl ships none for it)" + (f"; by {TABLE_VERSION}'s: " + "; ".join(found) if found else "")
    )
