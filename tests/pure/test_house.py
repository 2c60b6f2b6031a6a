"""The house's import-cycle count reads imports the way Python runs them."""

from __future__ import annotations

import ast

from tests.house import cli_imports, import_cycles, imported_modules

KNOWN = {"agent", "agent.a", "agent.b", "agent.pkg", "agent.pkg.sub", "agent.pkg.other"}


def _imports(source: str, name: str = "agent.pkg.other", is_package: bool = False) -> set[str]:
    return imported_modules(ast.parse(source), name, is_package, KNOWN)


def test_an_import_inside_a_function_counts() -> None:
    assert _imports("def f():\n    from agent.a import thing\n") == {"agent.a"}


def test_a_name_that_is_a_submodule_is_an_import_of_that_file() -> None:
    assert _imports("from agent.pkg import sub") == {"agent.pkg.sub"}
    assert _imports("from agent.pkg import sub, CONSTANT") == {"agent.pkg.sub", "agent.pkg"}


def test_relative_imports_resolve_from_the_files_package() -> None:
    assert _imports("from . import sub") == {"agent.pkg.sub"}
    assert _imports("from .. import a") == {"agent.a"}
    assert _imports("from .sub import x", "agent.pkg", is_package=True) == {"agent.pkg.sub"}


def test_a_circle_through_three_files_is_one_cycle_and_a_chain_is_none() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_cli_and_the_entry_point_may_import_the_cli() -> None:
    graph = {
        "agent.cli.main": {"agent.cli.options"},
        "agent.__main__": {"agent.cli.main"},
        "agent.deploy": {"agent.cli.options", "agent.errors"},
        "agent.client": {"agent.errors"},
    }
    assert cli_imports(graph) == ["agent.deploy -> agent.cli.options"]
