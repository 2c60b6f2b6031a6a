"""Write the architecture names SGLang can load as data: agent/sglang/data/model_archs-<version>.json.

Runs in the oracle venv (the sglang wheel and the transformers release it pins):

    ~/.cache/deployctl/oracle-sglang-0.5.23/bin/python tests/oracle/model_archs.py

- `sglang`: the class names of SGLang's own model registry. sglang/srt/models/registry.py
  (import_model_classes) registers the `EntryClass` (one class or a list) of every module of
  sglang/srt/models/ under the class's __name__; read here from the modules' source without importing them
  (an `import X as Y` alias is followed back to X, the class's own name).
- `transformers`: the public model classes of the pinned transformers release: the names
  sglang/srt/model_loader/utils.py resolve_transformers_arch finds with getattr(transformers, arch) when it
  falls back to the Transformers backend (the PreTrainedModel bases and the Auto* classes left out).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "agent" / "sglang" / "data"
MODEL_CLASS = re.compile(r"[A-Z]\w*(For\w+|Model|LMHeadModel)")


def entry_classes(source: str) -> set[str]:
    """The __name__ of each class a module's `EntryClass` names."""
    tree = ast.parse(source)
    aliases = {
        a.asname: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names if a.asname
    }
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
            value = node.value
            for item in value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]:
                if not isinstance(item, ast.Name):
                    raise SystemExit(f"EntryClass names something other than a class: {ast.dump(item)}")
                found.add(aliases.get(item.id, item.id))
    return found


def main() -> None:
    import importlib.metadata
    import importlib.util

    import transformers

    version = importlib.metadata.version("sglang")  # the package itself is not imported: it needs a GPU stack
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    models = Path(next(iter(spec.submodule_search_locations))) / "srt" / "models"
    native = set().union(*(entry_classes(p.read_text(encoding="utf-8")) for p in sorted(models.glob("*.py"))))
    hf = {
        n
        for n in dir(transformers)
        if MODEL_CLASS.fullmatch(n)
        and not n.endswith("PreTrainedModel")
        and not n.startswith(("Auto", "TF", "Flax"))
    }
    doc = {
        "sglang": version,
        "transformers_version": transformers.__version__,
        "sglang_models": sorted(native),
        "transformers_models": sorted(hf),
    }
    path = OUT / f"model_archs-{version}.json"
    path.write_text(json.dumps(doc, indent=0) + "\n", encoding="utf-8")
    print(f"{path}: {len(native)} SGLang architectures, {len(hf)} transformers classes")


if __name__ == "__main__":
    main()
