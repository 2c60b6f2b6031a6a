"""Every number read from a file is finite and in range, or refused in one line (exit 2), never a crash.

The inventory's numbers are checked by its pydantic model, a facts file's by its own, and config.json's
(from a facts file or the host) where it is read (agent.sglang.kvlayout): a zero head count divided by,
a layer count of 1e21 turned into a range, an infinite size turned into an int.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from tests.pure.facts_fixtures import KIMI_K26, LLAMA31_8B

UNITS = Path(__file__).resolve().parents[2] / "units"
DATA = Path(__file__).resolve().parents[1] / "data"


def run(*argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(list(argv), out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def assert_one_line_refusal(code: int, stdout: str, stderr: str, *words: str) -> None:
    assert code == ExitCode.USAGE, (code, stdout, stderr)
    lines = stderr.rstrip("\n").split("\n")
    assert lines[0].startswith("deployctl: error: ") and "internal error" not in stderr, stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("deployctl: hint: ")), stderr
    for word in words:
        assert word in lines[0], stderr


# --- the inventory --------------------------------------------------------------------------------------


def patched_inventory(tmp_path: Path, section: str, key: str, value: str) -> Path:
    """units/ct200.toml with `key = value` set in [section] (TOML's own spelling: inf, 1e308, "")."""
    units = tmp_path / "units"
    units.mkdir()
    text = (UNITS / "ct200.toml").read_text()
    line = re.compile(rf"(?m)^{key} = .*$")
    head = f"[{section}]\n"
    if head not in text:
        text += f"\n{head}"
    start = text.index(head) + len(head)
    end = text.find("\n[", start)
    body = text[start:end] if end != -1 else text[start:]
    body = line.sub(f"{key} = {value}", body) if line.search(body) else f"{key} = {value}\n{body}"
    (units / "ct200.toml").write_text(text[:start] + body + (text[end:] if end != -1 else ""))
    return units


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("gpus", "memory_gib", "inf"),
        ("gpus", "memory_gib", "nan"),
        ("gpus", "memory_gib", "1e308"),
        ("planning", "reserve_floor_gib", "inf"),
        ("planning", "reserve_floor_gib", "1e300"),
        ("model", "weights_gib_per_gpu", "1e308"),
        ("model", "weights_gib_per_gpu", "inf"),
        ("model", "layers", "100000000000"),
        ("model", "max_context", "1000000000000000000"),
        ("draft", "weights_gib_per_gpu", "1e308"),
        ("draft", "layers", "100000000000"),
        ("timeouts", "pool_s", "inf"),
        ("smoke", "timeout_s", "nan"),
        ("smoke", "prompt_tokens", "1000000000000"),
        ("prewarm", "margin_gib", "inf"),
        ("ssh", "connect_timeout_s", "inf"),
        ("smoke", "expect", '""'),
        ("smoke", "expect", '"   "'),
    ],
)
def test_a_number_out_of_range_in_the_inventory_is_refused_in_one_line(
    tmp_path: Path, section: str, key: str, value: str
) -> None:
    units = patched_inventory(tmp_path, section, key, value)
    code, out, err = run("--units", str(units), "plan", "ct200", "--offline", "--context", "100k")
    assert_one_line_refusal(code, out, err, f"{section}.{key}")


def test_the_inventory_as_shipped_still_plans(tmp_path: Path) -> None:
    units = tmp_path / "units"
    shutil.copytree(UNITS, units)
    code, _, err = run("--units", str(units), "plan", "ct200", "--offline", "--context", "100k")
    assert code == ExitCode.OK, err


# --- a facts file and its config.json -------------------------------------------------------------------


def facts_file(tmp_path: Path, config: dict[str, Any], **top: Any) -> Path:
    facts = {
        "format": "deployctl-facts/1",
        "gpus": [{"name": "H100", "memory_total_mib": 81559, "compute_capability": "9.0"}],
        "sglang": {"version": "0.5.23"},
        "model": {"config": config, "weights_bytes": 16_000_000_000},
        "flags": {"tp-size": 1},
        **top,
    }
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    return path


def with_key(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`config` with `key` set; on a wrapper model (text_config), in its text model."""
    if "text_config" in config:
        return {**config, "text_config": {**config["text_config"], key: value}}
    return {**config, key: value}


@pytest.mark.parametrize(
    ("config", "key", "value"),
    [
        (LLAMA31_8B, "num_attention_heads", 0),
        (LLAMA31_8B, "num_attention_heads", -8),
        (LLAMA31_8B, "num_hidden_layers", 10**21),
        (LLAMA31_8B, "num_hidden_layers", 1e21),
        (LLAMA31_8B, "num_hidden_layers", 0),
        (LLAMA31_8B, "num_key_value_heads", 0),
        (LLAMA31_8B, "num_key_value_heads", -4),
        (LLAMA31_8B, "hidden_size", 0),
        (LLAMA31_8B, "head_dim", 10**12),
        (LLAMA31_8B, "max_position_embeddings", float("inf")),
        (LLAMA31_8B, "max_position_embeddings", 10**30),
        (LLAMA31_8B, "num_key_value_heads", float("nan")),
        (KIMI_K26, "kv_lora_rank", 0),
        (KIMI_K26, "num_hidden_layers", 10**21),
        (KIMI_K26, "qk_rope_head_dim", 10**12),
    ],
)
def test_a_config_json_number_out_of_range_is_refused_in_one_line(
    tmp_path: Path, config: dict[str, Any], key: str, value: Any
) -> None:
    path = facts_file(tmp_path, with_key(config, key, value))
    code, out, err = run("plan", "--facts", str(path), "--context", "100k")
    assert_one_line_refusal(code, out, err, key)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("gpus", [{"name": "H100", "memory_total_mib": float("inf")}]),
        ("gpus", [{"name": "H100", "memory_total_mib": 1e300}]),
        ("model", {"config": LLAMA31_8B, "weights_bytes": 10**40}),
    ],
)
def test_a_facts_number_out_of_range_is_refused_in_one_line(tmp_path: Path, where: str, value: Any) -> None:
    path = facts_file(tmp_path, LLAMA31_8B, **{where: value})
    code, out, err = run("plan", "--facts", str(path), "--context", "100k")
    assert_one_line_refusal(code, out, err, where)


def test_the_facts_of_public_models_still_plan(tmp_path: Path) -> None:
    for config in (LLAMA31_8B, KIMI_K26):
        code, _, err = run("plan", "--facts", str(facts_file(tmp_path, config)), "--context", "100k")
        assert code == ExitCode.OK, err


def test_a_number_the_planner_never_reads_may_be_infinite(tmp_path: Path) -> None:
    # Nemotron-H publishes "time_step_limit": [0.0, Infinity]; SGLang's pool never reads it.
    nemotron = json.loads((DATA / "models/nemotron-3-nano-30b-a3b/config.json").read_text())
    for config in (
        {**nemotron, "time_step_limit": [0.0, float("inf")]},
        with_key(LLAMA31_8B, "rope_theta", float("nan")),
    ):
        code, _, err = run(
            "plan", "--facts", str(facts_file(tmp_path, config)), "--context", "8k", "--shrink-context"
        )
        assert code in (ExitCode.OK, ExitCode.NOT_FEASIBLE), err


def test_a_context_beyond_the_inventorys_bound_by_its_rope_factor_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    rope = {"factor": 65536.0, "rope_type": "yarn"}
    path = facts_file(tmp_path, {**LLAMA31_8B, "rope_scaling": rope, "max_position_embeddings": 2**20})
    code, out, err = run("plan", "--facts", str(path), "--context", "100k")
    assert_one_line_refusal(code, out, err, "max_context")
