"""A newcomer's first hour, continued: an architecture SGLang has no model of, a dtype no torch has, the
flag table another SGLang release is checked by."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from agent.exitcodes import ExitCode
from tests.pure.test_first_hour import UNITS, assert_one_line, llama, run_cli, write_facts


@pytest.fixture(autouse=True)
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEPLOYCTL_UNITS", raising=False)
    return tmp_path


def plan_facts(tmp_path: Path, doc: Any, *more: str) -> tuple[int, str, str]:
    return run_cli("plan", "--facts", write_facts(tmp_path, doc), "--context", "32k", *more)


def with_config(**over: Any) -> dict[str, Any]:
    doc = llama()
    doc["model"]["config"].update(over)
    return doc


# --- an architecture SGLang 0.5.23 has no model of ----------------------------------------------------------


@pytest.mark.parametrize("arch", ["BloomForCausalLM", "FalconForCausalLM", "MptForCausalLM"])
def test_an_architecture_of_transformers_only_is_planned_with_the_fallback_said(
    tmp_path: Path, arch: str
) -> None:
    code, stdout, stderr = plan_facts(tmp_path, with_config(architectures=[arch]))
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    said = [line for line in stdout.splitlines() if arch in line and "Transformers" in line]
    assert said, stdout
    assert "mha" in " ".join(said).lower() or "MHA" in " ".join(said)


def test_a_custom_architecture_with_auto_map_is_planned_with_the_fallback_said(tmp_path: Path) -> None:
    doc = with_config(
        architectures=["AcmeForCausalLM"],
        auto_map={"AutoConfig": "acme--configuration.AcmeConfig", "AutoModel": "acme--modeling.AcmeModel"},
    )
    code, stdout, stderr = plan_facts(tmp_path, doc)
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert any("AcmeForCausalLM" in line and "Transformers" in line for line in stdout.splitlines()), stdout


@pytest.mark.parametrize("auto_map", [None, {"AutoConfig": "acme--configuration.AcmeConfig"}])
def test_an_architecture_sglang_cannot_load_is_refused(tmp_path: Path, auto_map: Any) -> None:
    doc = with_config(architectures=["AcmeForCausalLM"])
    if auto_map is not None:
        doc["model"]["config"]["auto_map"] = auto_map
    assert_one_line(plan_facts(tmp_path, doc), "AcmeForCausalLM", "Transformers", "auto_map")


def test_model_impl_transformers_says_the_fallback_for_a_native_architecture(tmp_path: Path) -> None:
    doc = llama(flags={"model-impl": "transformers"})
    code, stdout, stderr = plan_facts(tmp_path, doc)
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert any("LlamaForCausalLM" in line and "Transformers" in line for line in stdout.splitlines()), stdout


def test_a_native_architecture_has_no_fallback_note(tmp_path: Path) -> None:
    code, stdout, stderr = plan_facts(tmp_path, llama())
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert "Transformers" not in stdout


def test_the_inventory_figures_have_no_fallback_note() -> None:
    code, stdout, stderr = run_cli("plan", "ct200", "--offline", "--context", "200k")
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert "Transformers" not in stdout


# --- a dtype no torch has ----------------------------------------------------------------------

BAD_DTYPES = ["float13", "", "bf16x", 16, 2.5, True, ["bfloat16"], {"x": "bfloat16"}]


@pytest.mark.parametrize("value", BAD_DTYPES)
@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_bad_dtype_in_the_facts_config_is_refused_naming_the_file_and_key(
    tmp_path: Path, key: str, value: Any
) -> None:
    line = assert_one_line(
        plan_facts(tmp_path, with_config(**{key: value})), "facts.json", "config.json", key
    )
    assert "internal" not in line


@pytest.mark.parametrize("value", ["float13", 16, ["bfloat16"]])
def test_a_bad_dtype_in_a_text_config_names_its_place(tmp_path: Path, value: Any) -> None:
    doc = llama()
    config = doc["model"]["config"]
    doc["model"]["config"] = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "text_config": {**{k: v for k, v in config.items() if k != "architectures"}, "torch_dtype": value},
    }
    assert_one_line(plan_facts(tmp_path, doc), "facts.json", "text_config.torch_dtype")


def test_a_bad_dtype_in_the_host_config_json_is_refused_naming_the_host_and_key() -> None:
    from agent.errors import UsageError
    from agent.inventory import load_service, units_dir
    from agent.plan.choose import Target
    from agent.plan.from_facts import plan_from_host_facts

    host = load_service("ct200", units_dir(str(UNITS)))
    doc = with_config(torch_dtype="float13")
    facts: Any = {"model_facts": {k: doc[k] for k in ("format", "model", "sglang", "gpus")}}
    with pytest.raises(UsageError, match=r"ct200.*config\.json.*torch_dtype"):
        plan_from_host_facts(host, facts, None, Target(context=32768))


@pytest.mark.parametrize("value", ["bfloat16", "float16", "half", "float32", "float", "torch.bfloat16", None])
def test_the_dtypes_sglang_reads_are_taken(tmp_path: Path, value: Any) -> None:
    code, _, stderr = plan_facts(tmp_path, with_config(torch_dtype=value))
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr


def test_the_inventory_dtype_bytes_is_checked(tmp_path: Path) -> None:
    text = (UNITS / "ct200.toml").read_text(encoding="utf-8")
    text = text.replace("[model]\n", '[model]\ndtype_bytes = "float13"\n', 1)
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "ct200.toml").write_text(text, encoding="utf-8")
    args = ("plan", "ct200", "--offline", "--context", "200k")
    assert_one_line(run_cli(*args, units=tmp_path / "u"), "ct200.toml", "dtype_bytes")


# --- the flag table of another SGLang release -----------------------------------------------------------


def inventory_of(tmp_path: Path, version: str) -> Path:
    text = (
        (UNITS / "ct200.toml")
        .read_text(encoding="utf-8")
        .replace('version = "0.5.23"', f'version = "{version}"')
    )
    (tmp_path / "u").mkdir(exist_ok=True)
    (tmp_path / "u" / "ct200.toml").write_text(text, encoding="utf-8")
    return tmp_path / "u"


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("deployctl: warning: ")]


INVENTORY_COMMANDS = [
    ("plan", "ct200", "--offline", "--context", "200k"),
    ("render", "ct200", "--context", "200k", "--mem-fraction-static", "0.9"),
]


@pytest.mark.parametrize("argv", INVENTORY_COMMANDS)
@pytest.mark.parametrize("flag", ["enable-metrics=true", "enable-flux-capacitor=true"])
def test_set_under_another_release_says_which_table_checked_it(
    tmp_path: Path, argv: tuple[str, ...], flag: str
) -> None:
    code, _, stderr = run_cli(*argv, "--set", flag, units=inventory_of(tmp_path, "0.5.9"))
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    said = [w for w in warnings(stderr) if "0.5.23" in w and "0.5.9" in w]
    assert len(said) == 1, stderr
    if "flux" in flag:
        assert "--enable-flux-capacitor" in said[0]


def test_set_of_a_facts_file_of_another_release_says_which_table_checked_it(tmp_path: Path) -> None:
    doc = llama()
    doc["sglang"]["version"] = "0.5.9"
    code, _, stderr = plan_facts(tmp_path, doc, "--set", "enable-metrics=true")
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert len([w for w in warnings(stderr) if "0.5.23" in w and "0.5.9" in w]) == 1, stderr


@pytest.mark.parametrize("argv", INVENTORY_COMMANDS)
def test_set_under_the_shipped_release_or_without_set_says_nothing_of_tables(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    for version, extra in (("0.5.23", ("--set", "enable-metrics=true")), ("0.5.9", ())):
        code, _, stderr = run_cli(*argv, *extra, units=inventory_of(tmp_path, version))
        assert code in (0, ExitCode.NOT_FEASIBLE), stderr
        assert not [w for w in warnings(stderr) if "table" in w], stderr


def test_the_host_config_json_of_a_transformers_only_architecture_says_the_fallback() -> None:
    from agent.inventory import load_service, units_dir
    from agent.plan.choose import Target
    from agent.plan.from_facts import plan_from_host_facts

    host = load_service("ct200", units_dir(str(UNITS)))
    doc = with_config(architectures=["BloomForCausalLM"])
    facts: Any = {"model_facts": {k: doc[k] for k in ("format", "model", "sglang", "gpus")}}
    plan = plan_from_host_facts(host, facts, None, Target(context=32768))
    assert plan is not None
    assert any("BloomForCausalLM" in n and "Transformers fallback" in n for n in plan.notes), plan.notes


def test_an_architecture_0_5_23_cannot_load_is_said_not_refused_for_another_release(tmp_path: Path) -> None:
    doc = with_config(architectures=["AcmeForCausalLM"])
    doc["sglang"]["version"] = "0.6.0"  # its registry may have it
    code, stdout, stderr = plan_facts(tmp_path, doc)
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert any("AcmeForCausalLM" in line and "0.6.0" in line for line in stdout.splitlines()), stdout


def test_a_bad_dtype_in_the_draft_config_names_the_draft(tmp_path: Path) -> None:
    from tests.pure.test_facts_plan import ct200

    doc = copy.deepcopy(ct200())  # its configs are the fixtures' own
    doc["draft"]["config"]["torch_dtype"] = "float13"
    args = ("plan", "--facts", write_facts(tmp_path, doc), "--context", "200k")
    assert_one_line(run_cli(*args), "facts.json", "the draft's config.json", "torch_dtype")
