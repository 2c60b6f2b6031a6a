"""Write SGLang's own command-line table as data: agent/sglang/data/server_args-<version>.json.

Runs in the oracle venv (the sglang wheel, installed --no-deps, and the import stand-ins of _stubs.py):

    ~/.cache/deployctl/oracle-sglang-0.5.23/bin/python tests/oracle/flag_table.py

It builds the parser SGLang's launch_server builds (sglang/srt/server_args.py ServerArgs.add_cli_args, which
adds the dataclass fields of sglang/srt/arg_groups/fields/ through arg_utils.add_cli_args_from_dataclass) and
records each option: its spellings, whether it takes a value, how the value is read (type=), its choices,
nargs, and whether it is deprecated (sglang/srt/arg_groups/argparse_actions.py) with the spelling to use.
Flags an earlier version had and this one refuses are not in the parser; REMOVED lists them by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "agent" / "sglang" / "data"

# Options of earlier releases that 0.5.23 no longer has, and what replaced them (the server does not start
# with them: argparse reads --cuda-graph-max-bs as an ambiguous prefix of the -decode and -prefill flags).
REMOVED = {
    "cuda-graph-max-bs": "--cuda-graph-max-bs-decode (and --cuda-graph-max-bs-prefill)",
}

# type= callables by the name SGLang gives them -> how deployctl checks a value (agent/sglang/server_args.py)
TYPES = {
    "int": "int",
    "float": "float",
    "str": "str",
    "nullable_str": "str",
    "human_readable_int": "human_int",  # sglang/srt/utils/common.py: 1k, 25.6k, 1Ki, 1M (case-sensitive)
    "loads": "json",
    "json_list_type": "json",
}


def _value_kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "switch"
    return "value" if action.nargs != 0 else "switch"


def _entry(action: argparse.Action) -> dict[str, Any]:
    type_name = getattr(action.type, "__name__", None) if action.type is not None else "str"
    kind = type(action).__name__
    entry: dict[str, Any] = {
        "names": [s[2:] for s in action.option_strings if s.startswith("--")],
        "dest": action.dest,
        "takes": _value_kind(action),
        "type": TYPES.get(str(type_name), f"other:{type_name}") if _value_kind(action) == "value" else None,
        "choices": sorted(str(c) for c in action.choices) if action.choices is not None else None,
        "nargs": action.nargs if action.nargs not in (None, 0) else None,
    }
    if kind.startswith("Deprecated") or "(Deprecated" in (action.help or ""):
        new_flag = getattr(action, "new_flag", None) or (action.help or "").split("use ", 1)[-1].split(")")[0]
        entry["deprecated"] = str(new_flag)
    return entry


def table() -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import _stubs  # type: ignore[import-not-found]

    _stubs.install()
    import sglang  # type: ignore[import-not-found]
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags = [_entry(a) for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    return {
        "sglang": sglang.__version__,
        "source": "sglang/srt/server_args.py ServerArgs.add_cli_args (tests/oracle/flag_table.py)",
        "flags": sorted(flags, key=lambda f: f["names"][0]),
        "removed": [{"name": n, "replacement": r} for n, r in sorted(REMOVED.items())],
    }


def main() -> None:
    doc = table()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"server_args-{doc['sglang']}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{path}: {len(doc['flags'])} options of SGLang {doc['sglang']}")


if __name__ == "__main__":
    main()
