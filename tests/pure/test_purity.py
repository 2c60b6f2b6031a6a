"""Pure modules take data in and give data out; the host side imports only what its zipapp carries."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[2] / "agent"
IO = {"paramiko", "jeepney", "requests", "subprocess", "socket", "os", "shutil", "tempfile", "urllib"}
PURE = [
    "sglang/kvpool.py",
    "sglang/kvlayout.py",
    "sglang/config_json.py",
    "sglang/pools.py",
    "sglang/memory_defaults.py",
    "plan/from_facts.py",
    "plan/overhead.py",
    "sglang/logs/summary.py",
    "sglang/logs/lines.py",
    "sglang/logs/events.py",
    "sglang/logs/failures.py",
    "sglang/flags.py",
    "plan/choose.py",
    "plan/model.py",
    "plan/alternatives.py",
    "render.py",
    "report.py",
    "host/change/decide.py",
    "protocol/common.py",
    "protocol/requests.py",
    "protocol/events.py",
    "protocol/answers.py",
]
# What the agent bundle (agent/remote/bundle.py) ships besides the standard library.
BUNDLED = {"agent", "jeepney", "requests", "urllib3", "idna", "certifi", "tenacity"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    assert not imports(AGENT / module) & IO


@pytest.mark.parametrize(
    "path",
    sorted([*AGENT.glob("host/**/*.py"), *AGENT.glob("sglang/**/*.py"), *AGENT.glob("protocol/*.py")]),
    ids=str,
)
def test_host_side_imports_only_what_the_bundle_carries(path: Path) -> None:
    outside = {n for n in imports(path) if n not in sys.stdlib_module_names and n not in BUNDLED}
    assert not outside, f"{path.name} imports {outside}: the host agent could not run from its zipapp"


def test_host_side_imports_no_laptop_module() -> None:
    allowed = {"agent", "agent.host", "agent.sglang", "agent.protocol", "agent.exitcodes"}
    for path in [*AGENT.glob("host/**/*.py"), *AGENT.glob("sglang/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agent"):
                top = ".".join(node.module.split(".")[:2])
                assert top in allowed or node.module in allowed, f"{path.name} imports {node.module}"


def test_the_wire_imports_nothing_of_either_side() -> None:
    """agent/protocol/ sits below host/ and the laptop's modules: it names what they send, never them."""
    allowed = ("agent.protocol", "agent.exitcodes", "agent.sglang")
    for path in AGENT.glob("protocol/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agent"):
                assert node.module.startswith(allowed), f"{path.name} imports {node.module}"
