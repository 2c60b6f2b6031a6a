"""The layers of agent/ and the one direction of their imports, checked by `python -m tests.house`.

Each layer names its modules (a module, or a package and everything in it; the longest name that matches
wins) and the layers directly below it; a module may import its own layer and anything below its layer,
never above or beside it. Drawn from the imports as they are (docs/how-it-works.md has the picture):

    cli -> deploy | fleet -> group -> apply -> orchestrate -> remote -> model -> protocol -> base
                                       apply -> pure -> model                  host -> protocol

- pure: the laptop's decisions that touch nothing (render, plan, verify, report, chart, adopt);
- model: the inventory (with group/nodes.py, the inventory as one node sees it), the output's shapes, errors;
- protocol: the wire between laptop and host; base: what SGLang is (sglang/), exit codes, the version.
A module in no layer counts too: a new module is placed here when it is added.
"""

from __future__ import annotations

LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cli": (("agent.__main__", "agent.cli"), ("deploy", "fleet")),
    "deploy": (("agent.deploy",), ("group",)),
    "fleet": (("agent.fleet",), ("group",)),
    "group": (("agent.group",), ("apply",)),
    "apply": (("agent.apply",), ("orchestrate", "pure")),
    "orchestrate": (("agent.orchestrate", "agent.progress"), ("remote",)),
    "remote": (("agent.remote",), ("model",)),
    "pure": (
        (
            "agent.render",
            "agent.plan",
            "agent.verify",
            "agent.report",
            "agent.chart",
            "agent.adopt",
            "agent.pd",
        ),
        ("model",),
    ),
    "model": (
        ("agent.inventory", "agent.pd.spec", "agent.group.nodes", "agent.output", "agent.errors"),
        ("protocol",),
    ),
    "host": (("agent.host",), ("protocol",)),
    "protocol": (("agent.protocol",), ("base",)),
    "base": (("agent", "agent.sglang", "agent.exitcodes"), ()),
}


ROOT = "agent"  # agent/__init__.py (the version) alone: not a package of everything below it


def layer_of(module: str) -> str | None:
    """The layer whose longest module name is `module` or a package above it."""
    found = [
        (len(prefix), name)
        for name, (prefixes, _) in LAYERS.items()
        for prefix in prefixes
        if module == prefix or (prefix != ROOT and module.startswith(prefix + "."))
    ]
    return max(found)[1] if found else None


def below(layer: str) -> set[str]:
    """Every layer under `layer`, through the layers it names."""
    seen: set[str] = set()
    todo = list(LAYERS[layer][1])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += LAYERS[name][1]
    return seen


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports that go up or sideways between layers, and the modules in no layer."""
    found = [f"{m}: in no layer" for m in sorted(graph) if layer_of(m) is None]
    for module in sorted(graph):
        mine = layer_of(module)
        for dep in sorted(graph[module]):
            theirs = layer_of(dep)
            if mine and theirs and theirs != mine and theirs not in below(mine):
                found.append(f"{module} -> {dep} ({mine} -> {theirs})")
    return found
