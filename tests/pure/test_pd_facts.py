"""A [pd] unit's host facts: the transfer backends installed for the unit's Python (read from its
site-packages and PYTHONPATH, never run) and the host's RDMA devices, used by the refusals before any
restart: a backend the host does not have, NIXL with no device chosen on a host with several."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.host.roles import pdfacts


def venv(tmp_path: Path, *modules: str) -> str:
    site = tmp_path / "venv/lib/python3.11/site-packages"
    site.mkdir(parents=True)
    for m in modules:
        (site / m).mkdir()
        (site / m / "__init__.py").write_text("")
    (tmp_path / "venv/bin").mkdir(parents=True)
    return str(tmp_path / "venv/bin/python")


def test_the_backends_installed_beside_the_units_python_or_on_its_pythonpath(tmp_path: Path) -> None:
    python = venv(tmp_path, "mooncake", "numpy")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "nixl._bindings.cpython-311-x86_64-linux-gnu.so").write_text("")
    (extra / "nixl.cpython-311-x86_64-linux-gnu.so").write_text("")
    assert pdfacts.installed(python, [], system=()) == ["mooncake"]
    assert pdfacts.installed(python, [str(extra)], system=()) == ["mooncake", "nixl"]
    assert pdfacts.installed(None) is None  # its Python unknown: the check is not made


def test_the_rdma_devices_are_the_kernels_list_and_none_without_the_folder(tmp_path: Path) -> None:
    for name in ("mlx5_1", "mlx5_0"):
        (tmp_path / name).mkdir()
    assert pdfacts.rdma_devices(str(tmp_path)) == ["mlx5_0", "mlx5_1"]
    assert pdfacts.rdma_devices(str(tmp_path / "absent")) == []


def test_the_facts_are_read_for_a_role_unit_only(tmp_path: Path) -> None:
    python = venv(tmp_path, "mooncake")
    argv = f"{python} -m sglang.launch_server --model-path /m --disaggregation-mode decode"
    role = f"[Service]\nExecStart={argv}\n"
    got = pdfacts.collect(role, ())
    assert got is not None and "mooncake" in (got["importable"] or [])
    assert pdfacts.collect(role.replace(" --disaggregation-mode decode", ""), ()) is None
    assert pdfacts.collect(None, ()) is None


def facts_answer(importable: list[str] | None, rdma: list[str] | None) -> dict[str, Any]:
    return {"unit_sha256": None, "pd": {"importable": importable, "rdma_devices": rdma}}


@pytest.mark.parametrize(
    ("backend", "importable", "rdma", "said"),
    [
        ("mooncake", [], [], "cannot import 'mooncake'"),
        ("nixl", ["nixl"], ["mlx5_0", "mlx5_1"], "NIXL with no RDMA device chosen"),
        ("mooncake", ["mooncake"], ["mlx5_0", "mlx5_1"], None),
        ("nixl", ["nixl"], ["mlx5_0"], None),  # one device: UCX's own choice is that one
    ],
)
def test_the_hosts_facts_refuse_before_any_compare(
    monkeypatch: pytest.MonkeyPatch, backend: str, importable: list[str], rdma: list[str], said: str | None
) -> None:
    from contextlib import contextmanager

    import agent.group.pdapply as pdapply
    from agent.errors import InventoryError
    from agent.orchestrate.asked import Change, Connection
    from agent.output import Output
    from tests.pure.test_pd import example, host_of

    data = example()
    data["pd"]["transfer_backend"] = backend
    host = host_of(data)
    verbs: list[str] = []

    class Agent:
        def call(self, req: Any) -> dict[str, Any]:
            verbs.append(req.verb)
            if req.verb == "facts":
                assert req.unit_text  # read for the unit about to be written
                return facts_answer(importable, rdma) if "--disaggregation-mode" in req.unit_text else {}
            return {"up_to_date": True}

    @contextmanager
    def clients(hosts: list[Any], conn: object):  # type: ignore[no-untyped-def]
        yield [Agent() for _ in hosts]

    monkeypatch.setattr(pdapply, "clients", clients)
    monkeypatch.setattr(pdapply, "recover_orphan", lambda *a: False)
    if said is None:
        assert pdapply.apply(host, Connection("pd"), Change(32768, yes=True), Output()) == 0
        assert "compare" in verbs
        return
    with pytest.raises(InventoryError, match=said):
        pdapply.apply(host, Connection("pd"), Change(32768, yes=True), Output())
    assert "compare" not in verbs, verbs


# ---- a backend on disk that does not import (mooncake's engine.so without the libraries it links)

LIBIBVERBS = "ImportError: libibverbs.so.1: cannot open shared object file: No such file or directory"


def role_unit(python: str, backend: str | None = "mooncake", user: str = "sglang") -> str:
    chosen = f" --disaggregation-transfer-backend {backend}" if backend else ""
    return (
        f"[Service]\nUser={user}\nEnvironment=PYTHONPATH=/opt/extra\n"
        f"ExecStart={python} -m sglang.launch_server --model-path /m --disaggregation-mode decode{chosen}\n"
    )


@pytest.mark.parametrize(
    ("backend", "modules"),
    [
        (None, ["mooncake.engine"]),  # SGLang's default backend
        ("mooncake", ["mooncake.engine"]),
        ("mooncake_tcp", ["mooncake.engine"]),
        ("nixl", ["nixl._api"]),
        ("mori", ["mori.cpp", "mori.io"]),
        ("ascend", ["memfabric_hybrid"]),
    ],
)
def test_the_engine_sglang_imports_is_imported_as_the_units_user(
    tmp_path: Path, backend: str | None, modules: list[str]
) -> None:
    python = venv(tmp_path, "mooncake", "nixl", "mori", "memfabric_hybrid")
    asked: list[Any] = []

    def run(cmd: Any, names: tuple[str, ...]) -> pdfacts.EngineImport:
        asked.append((cmd.interpreter, cmd.user, cmd.environment.get("PYTHONPATH"), names))
        return pdfacts.EngineImport(pdfacts.Imported.YES, "")

    got = pdfacts.collect(role_unit(python, backend), (), run=run)
    assert got is not None and got["engine"]["verdict"] == "importable"
    assert asked == [(python, "sglang", "/opt/extra", tuple(modules))]


def test_an_engine_that_does_not_import_says_its_error_and_one_not_installed_is_not_run(
    tmp_path: Path,
) -> None:
    python = venv(tmp_path, "mooncake")
    asked: list[Any] = []

    def run(cmd: Any, names: tuple[str, ...]) -> pdfacts.EngineImport:
        asked.append(names)
        return pdfacts.EngineImport(pdfacts.Imported.NO, LIBIBVERBS)

    got = pdfacts.collect(role_unit(python), (), run=run)
    assert got is not None and got["engine"] == {
        "backend": "mooncake", "verdict": "not_importable", "detail": LIBIBVERBS
    }  # fmt: skip
    got = pdfacts.collect(role_unit(python, "nixl"), (), run=run)
    assert got is not None and got["engine"]["verdict"] == "skipped"  # not installed: that refusal says it
    assert asked == [("mooncake.engine",)]


def test_the_venvs_python_is_never_run_as_root(tmp_path: Path) -> None:
    python = venv(tmp_path, "mooncake")

    def run(cmd: Any, names: tuple[str, ...]) -> pdfacts.EngineImport:
        raise AssertionError("ran")

    got = pdfacts.collect(role_unit(python, user="root"), (), run=run)
    assert got is not None and got["engine"]["verdict"] == "skipped"
    assert "root" in got["engine"]["detail"]


@pytest.fixture
def as_self(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import as this test's own account: what it says, not as whom it runs (the uid-0 refusal has its
    own tests in test_argcheck.py), and the pure tier may run as root."""
    import os
    import pwd

    from agent.host import argcheck

    monkeypatch.setattr(argcheck, "account", lambda user: pwd.getpwuid(os.geteuid()))


def test_the_import_runs_the_interpreter_and_reads_the_errors_last_line(
    tmp_path: Path, as_self: None
) -> None:
    """The real runner, as this test's own user (no switch), on a package whose import fails as a native
    engine without its libraries does, and on one that imports."""
    import getpass
    import sys

    from agent.host.argcheck import CheckCommand

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken/__init__.py").write_text(
        f"raise ImportError({LIBIBVERBS.removeprefix('ImportError: ')!r})\n"
    )
    (tmp_path / "fine").mkdir()
    (tmp_path / "fine/__init__.py").write_text("")
    cmd = CheckCommand(
        sys.executable, (), getpass.getuser(), {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"}
    )
    assert pdfacts.import_engine(cmd, ("broken",)) == pdfacts.EngineImport(pdfacts.Imported.NO, LIBIBVERBS)
    assert pdfacts.import_engine(cmd, ("fine",)).imported is pdfacts.Imported.YES


@pytest.mark.parametrize("verdict", ["not_importable", "importable", "skipped"])
def test_apply_refuses_an_engine_that_does_not_import_before_any_compare(
    monkeypatch: pytest.MonkeyPatch, verdict: str
) -> None:
    from contextlib import contextmanager

    import agent.group.pdapply as pdapply
    from agent.errors import InventoryError
    from agent.orchestrate.asked import Change, Connection
    from agent.output import Output
    from tests.pure.test_pd import example, host_of

    host = host_of(example())
    verbs: list[str] = []
    answer = facts_answer(["mooncake"], [])
    answer["pd"]["engine"] = {"backend": "mooncake", "verdict": verdict, "detail": LIBIBVERBS}

    class Agent:
        def call(self, req: Any) -> dict[str, Any]:
            verbs.append(req.verb)
            if req.verb == "facts":
                return answer if "--disaggregation-mode" in req.unit_text else {}
            return {"up_to_date": True}

    @contextmanager
    def clients(hosts: list[Any], conn: object):  # type: ignore[no-untyped-def]
        yield [Agent() for _ in hosts]

    monkeypatch.setattr(pdapply, "clients", clients)
    monkeypatch.setattr(pdapply, "recover_orphan", lambda *a: False)
    if verdict != "not_importable":
        assert pdapply.apply(host, Connection("pd"), Change(32768, yes=True), Output()) == 0
        return
    with pytest.raises(InventoryError, match="installed but does not import") as said:
        pdapply.apply(host, Connection("pd"), Change(32768, yes=True), Output())
    assert "libibverbs.so.1: cannot open shared object file" in str(said.value)
    assert "compare" not in verbs, verbs


def test_the_real_mooncake_engine_imports_with_its_libraries_and_names_the_one_it_misses(
    as_self: None,
) -> None:
    """The real tier's add-on (make real-sglang: mooncake-transfer-engine-non-cuda 0.3.13.post1 and, in lib/,
    the libraries its engine.so links): imported by the real runner with them on LD_LIBRARY_PATH, and
    without them (where the machine has no libibverbs of its own) the error's line names the missing one."""
    import ctypes.util
    import getpass
    import sys
    from dataclasses import replace

    from agent.host.argcheck import CheckCommand
    from tests import realpd

    addon = realpd.addon_dir()
    if not (addon / ".pd-stamp").is_file():
        pytest.skip(f"no PD add-on at {addon} (make real-sglang)")
    bare = CheckCommand(
        sys.executable, (), getpass.getuser(), {"PATH": "/usr/bin", "PYTHONPATH": str(addon / "site")}
    )
    libs = replace(bare, environment={**bare.environment, "LD_LIBRARY_PATH": str(addon / "lib")})
    assert pdfacts.import_engine(libs, ("mooncake.engine",)).imported is pdfacts.Imported.YES
    if ctypes.util.find_library("ibverbs") is None:
        assert pdfacts.import_engine(bare, ("mooncake.engine",)) == pdfacts.EngineImport(
            pdfacts.Imported.NO, LIBIBVERBS
        )
