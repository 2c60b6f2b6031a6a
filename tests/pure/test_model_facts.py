"""The host's facts reader: safetensors headers, config.json, nvidia-smi, the unit; and planning from it."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.host import model_facts
from agent.inventory import HostConfig
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_host_facts
from tests.pure import facts_fixtures as cfg
from tests.pure.test_plan_cmd import START_LOG


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], data_bytes: int = 0) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset]}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)


def model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "a.safetensors", {"w": ("BF16", [4096, 4096]), "s": ("F32", [4096])})
    write_safetensors(folder / "b.safetensors", {"q": ("F8_E4M3", [1024, 1024]), "p": ("F4", [10, 10])})
    index = {"weight_map": {"w": "a.safetensors", "s": "a.safetensors", "q": "b.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_weights_bytes_from_the_headers_only(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, cfg.LLAMA31_8B)
    assert model_facts.weights_bytes(folder) == 4096 * 4096 * 2 + 4096 * 4 + 1024 * 1024 + 50
    (folder / "b.safetensors").write_bytes(b"\xff" * 4)  # a truncated shard: unknown, never a guess
    assert model_facts.weights_bytes(folder) is None


def test_nvidia_smi_rows() -> None:
    csv = "NVIDIA H100 80GB HBM3, 81559, 80000, 9.0\nNVIDIA H100 80GB HBM3, 81559, 79000, [N/A]\nbad\n"
    rows = model_facts.parse_gpus(csv)
    assert [r.get("compute_capability") for r in rows] == ["9.0", None]
    assert rows[0]["memory_total_mib"] == 81559


UNIT = """[Service]
Environment=SGLANG_VLM_CACHE_SIZE_MB=0 HF_TOKEN=secret
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path {path} --tp-size 8 \\
  --mem-fraction-static 0.85 --context-length 32768 --api-key hunter2
"""


def test_collect_builds_a_facts_document_the_planner_accepts(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, cfg.KIMI_K26)
    doc = model_facts.collect(UNIT.format(path=folder), START_LOG.splitlines(), ["HF_TOKEN"])
    assert doc is not None and doc["format"] == "deployctl-facts/1"
    assert doc["env"] == {"SGLANG_VLM_CACHE_SIZE_MB": "0"}  # the secret name is left out
    assert "api-key" not in doc["flags"] and doc["flags"]["tp-size"] == "8"
    assert "Load weight begin" in doc["last_start"]
    doc["gpus"] = [{"name": "NVIDIA H20", "memory_total_mib": 97871}] * 8
    doc["sglang"] = {"version": "0.5.23"}
    inp = parse_facts(json.loads(json.dumps(doc)))
    assert inp.model.weights_bytes == model_facts.weights_bytes(folder)
    assert model_facts.collect(UNIT.format(path="/no/such/model"), [], []) is None


@pytest.fixture
def host() -> HostConfig:
    return HostConfig.model_validate(
        {"name": "ct200", "ssh": {"target": "ct200"}, "gpus": {"count": 8, "memory_gib": 95.58},
         "model": {"path": "/models/k", "weights_gib_per_gpu": 70.48}, "sglang": {"version": "0.5.23"}}
    )  # fmt: skip


def test_inventory_figures_override_the_hosts_and_the_plan_says_so(host: HostConfig, tmp_path: Path) -> None:
    folder = model_dir(tmp_path, cfg.KIMI_K26)
    doc = model_facts.collect(UNIT.format(path=folder), [], [])
    assert doc is not None
    doc["sglang"] = {"version": None}  # no SGLang found in the unit's Python: the inventory's version
    plan = plan_from_host_facts(host, {"model_facts": doc}, None, Target(200_000))
    assert plan is not None and plan.basis == "architecture"
    assert any("inventory: model.weights_gib_per_gpu" in n for n in plan.notes)
    assert any("inventory: gpus" in n for n in plan.notes)  # no nvidia-smi rows
    assert plan_from_host_facts(host, {"model_facts": None}, None, Target(200_000)) is None


def test_hostile_files_give_no_facts_never_a_crash(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # nested past the recursion limit
    assert model_facts.read_config(folder) is None
    raw = b"[" * 50_000 + b"]" * 50_000
    (folder / "x.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert model_facts.safetensors_bytes(folder / "x.safetensors") is None
    (folder / "y.safetensors").write_bytes(struct.pack("<Q", 2**62))  # a header length far past the file
    assert model_facts.safetensors_bytes(folder / "y.safetensors") is None


def fake_venv(tmp_path: Path, pth: str) -> tuple[Path, Path]:
    """A venv whose python is this machine's, with SGLang's dist-info and a planted .pth file; the marker
    the .pth would create if anything ran that Python."""
    venv, marker = tmp_path / "venv", tmp_path / "ran-as-root"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    site = venv / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    (site / "sglang-0.5.23.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.23.dist-info/METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"
    )
    (site / "evil.pth").write_text(pth.replace("MARKER", repr(str(marker))))
    return venv, marker


def test_sglang_version_is_read_from_the_metadata_and_nothing_in_the_venv_runs(tmp_path: Path) -> None:
    venv, marker = fake_venv(tmp_path, "import pathlib; pathlib.Path(MARKER).touch()\n")
    (venv / "bin/sglang").write_text(f"#!{venv}/bin/python\nimport sys\n")
    assert model_facts.sglang_version(str(venv / "bin/python")) == "0.5.23"
    unit = UNIT.format(path="/m").replace("/usr/bin/python3", str(venv / "bin/python"))
    assert model_facts.sglang_version(model_facts.unit_python(model_facts.parse_unit(unit)[0])) == "0.5.23"
    assert (
        model_facts.sglang_version(model_facts.unit_python([str(venv / "bin/sglang"), "serve"])) == "0.5.23"
    )
    assert not marker.exists()  # the planted .pth never ran


def test_sglang_version_unknown_without_metadata(tmp_path: Path) -> None:
    venv, _ = fake_venv(tmp_path, "\n")
    for meta in venv.glob("lib/*/site-packages/sglang-*.dist-info/METADATA"):
        meta.write_text("Name: sglang\nVersion: 0.5.23; rm -rf /\n")  # not a version: never passed on
    assert model_facts.sglang_version(str(venv / "bin/python"), system=()) is None
    assert model_facts.sglang_version(None) is None
