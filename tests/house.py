"""The house's counts, measured the same way every time (`python -m tests.house`, part of `make lint`).

- untyped: annotations `dict[str, Any]` / `Mapping[str, Any]` (and `MutableMapping`) in agent/;
- long functions: functions and methods over 40 lines (decorators and docstring included);
- private imports: `from agent.x import _name` of a name private to another module;
- flat modules: modules directly in agent/ rather than in a package named after what it does.

Each count may not grow past its ceiling below (a ratchet: lower a ceiling when the code improves);
the issue's targets are untyped <= 40, long functions 0, private imports 0.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

AGENT = Path(__file__).resolve().parents[1] / "agent"
SKIP = ("ansible_collections",)  # Ansible's plugin shape, not ours
UNTYPED = re.compile(r"\b(?:Mutable)?(?:dict|Mapping|Dict)\[str, *(?:typing\.)?Any\]")
LONG = 40
# Measured on a498560: 177 / 11 / 4 / 13. This round's merged work (drain, CPU planning, flag table, secrets)
# raised the first two to 208 / 15; one planning path (agent/plan/), the wire's answers and outcomes typed
# (protocol.py's TypedDicts) and the long functions split brought them to 80 / 0; config.json read through
# one typed reader (agent/sglang/config_json.py ModelConfig) by kvlayout and the planner, to the ceilings
# below, which may only fall from here.
CEILINGS = {"untyped": 37, "long_functions": 0, "private_imports": 0, "flat_modules": 12}


@dataclass(frozen=True)
class Counts:
    untyped: int
    long_functions: int
    private_imports: int
    flat_modules: int


def _sources() -> list[Path]:
    return [p for p in sorted(AGENT.rglob("*.py")) if not any(s in p.parts for s in SKIP)]


def long_functions(tree: ast.AST) -> list[str]:
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno)
        - min([node.lineno, *(d.lineno for d in node.decorator_list)])
        + 1
        > LONG
    ]


def private_imports(tree: ast.AST) -> list[str]:
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agent")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def measure() -> tuple[Counts, dict[str, list[str]]]:
    where: dict[str, list[str]] = {"long_functions": [], "private_imports": []}
    untyped = 0
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(AGENT.parent))
        untyped += len(UNTYPED.findall(text))
        tree = ast.parse(text)
        where["long_functions"] += [f"{rel}:{name}" for name in long_functions(tree)]
        where["private_imports"] += [f"{rel}: {name}" for name in private_imports(tree)]
    flat = len([p for p in AGENT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")])
    counts = Counts(untyped, len(where["long_functions"]), len(where["private_imports"]), flat)
    return counts, where


def main(argv: list[str]) -> int:
    counts, where = measure()
    print(json.dumps(asdict(counts)))
    if "-v" in argv:
        for kind, names in where.items():
            print(f"{kind}:", *names, sep="\n  ")
    over = {k: v for k, v in asdict(counts).items() if v > CEILINGS[k]}
    for kind, value in over.items():
        print(f"house: {kind} grew to {value} (ceiling {CEILINGS[kind]}); see python -m tests.house -v")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
