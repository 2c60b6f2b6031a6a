"""SGLang's own flag table: a flag SGLang would refuse is refused before anything is rendered."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from agent.sglang.server_args import human_int, problems, table_for

ROOT = Path(__file__).resolve().parents[2]
SIM = (ROOT / "units" / "ct200-sim.toml").read_text(encoding="utf-8")
BASELINE = "[sglang.flags]\ntp-size = 8\n"


def render_with(tmp_path: Path, flags_toml: str, *extra: str) -> tuple[int, str, str]:
    """`deployctl render` of ct200-sim with lines added to its [sglang.flags]."""
    units = tmp_path / "units"
    units.mkdir(exist_ok=True)
    keys = {line.split("=")[0].strip() for line in flags_toml.splitlines()}
    kept = [line for line in SIM.splitlines() if line.split("=")[0].strip() not in keys]
    text = "\n".join(kept).replace(BASELINE, BASELINE + flags_toml + "\n")
    (units / "h.toml").write_text(text, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(units), "render", "h", "--context", "200k", *extra], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("context-lenght = 65536", ("sglang.flags.context-lenght", "did you mean --context-length")),
        ("mem-fraction-static = 1.5", ("sglang.flags.mem-fraction-static", "between 0 and 1")),
        ('kv-cache-dtype = "fp9"', ("kv-cache-dtype", "fp8_e4m3", "bf16")),
        ("enable-metrics = 1", ("--enable-metrics takes no value",)),
        ("chunked-prefill-size = true", ("--chunked-prefill-size needs a value",)),
        ("chunked-prefill-size = 1.5", ("'1.5' is not an integer",)),
    ],
)
def test_inventory_flags_sglang_would_refuse_are_refused(
    tmp_path: Path, line: str, words: tuple[str, ...]
) -> None:
    """The line is refused before the first word of the unit is written (tp-size = "one" and a 1.5
    fraction were rendered before, and the restart was the first to notice)."""
    code, stdout, stderr = render_with(tmp_path, line)
    assert (code, stdout) == (ExitCode.USAGE, "")
    first = stderr.splitlines()[0]
    for word in words:
        assert word in first, first


def test_tp_size_one_is_refused(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "h.toml").write_text(SIM.replace("tp-size = 8", 'tp-size = "one"'), encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert main(["--units", str(units), "render", "h", "--context", "200k"], out) == ExitCode.USAGE
    assert isinstance(out.stderr, io.StringIO)
    assert "--tp-size 'one' is not an integer" in out.stderr.getvalue()


def test_set_is_checked_too(tmp_path: Path) -> None:
    code, stdout, stderr = render_with(tmp_path, "", "--set", "kv-cache-dtype=fp8")
    assert (code, stdout) == (ExitCode.USAGE, "")
    assert "flags.kv-cache-dtype: --kv-cache-dtype 'fp8' is not one of" in stderr


def test_good_flags_and_aliases_render(tmp_path: Path) -> None:
    line = 'kv-cache-dtype = "fp8_e4m3"\nenable-metrics = true\ncontext-length = "128Ki"'
    code, stdout, stderr = render_with(
        tmp_path, line, "--set", "attention-data-parallel-size=1", "--mem-fraction-static", "0.9"
    )
    assert (code, stderr) == (0, ""), stderr
    assert (
        "--kv-cache-dtype fp8_e4m3" in stdout and "--attn-dp-size 1" in stdout
    )  # an alias is written as SGLang documents it


def test_every_word_of_a_list_flag_is_checked() -> None:
    assert problems("0.5.23", {"cuda-graph-bs-decode": ("1", "2", "4")}) == []
    assert "'x' is not an integer" in problems("0.5.23", {"cuda-graph-bs-decode": ("1", "x")})[0][1]
    assert "takes one value" in problems("0.5.23", {"tp-size": ("1", "2")})[0][1]


def test_a_removed_flag_may_be_dropped_but_not_set() -> None:
    assert problems("0.5.23", {"cuda-graph-max-bs": False}) == []
    assert problems("0.5.23", {"no-such-flag": False})[0][1].startswith("SGLang 0.5.23 has no flag")
    said = problems("0.5.23", {"cuda-graph-max-bs": "8"})[0][1]
    assert "removed" in said and "--cuda-graph-max-bs-decode" in said


def test_a_dashed_name_is_told_to_lose_its_dashes() -> None:
    """A unit's spelling ("--tp-size") where the name alone goes: not "no flag ----tp-size"."""
    assert problems("0.5.23", {"--tp-size": 4}) == [
        ("--tp-size", "name it without its leading dashes: 'tp-size'")
    ]
    said = problems("0.5.23", {"--tpp-size": 4})[0][1]
    assert said.startswith("name it without") and "has no flag --tpp-size; did you mean --tp-size" in said


def test_no_table_no_check() -> None:
    """Another release's flags are left to that release's own parser on the host."""
    assert table_for("0.4.6") is None
    assert problems("0.4.6", {"context-lenght": "1"}) == []


@pytest.mark.parametrize(
    ("text", "value"), [("131072", 131072), ("128Ki", 131072), ("1M", 1_000_000), ("25.6k", 25600)]
)
def test_human_int_reads_as_sglang_does(text: str, value: int) -> None:
    assert human_int(text) == value


@pytest.mark.parametrize("text", ["1.5Ki", "1m", "1e5", "one"])
def test_human_int_refuses_what_sglang_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        human_int(text)


def test_the_shipped_table_is_sglangs() -> None:
    """Spot checks against sglang/srt/server_args.py and arg_groups/fields/ of the 0.5.23 wheel."""
    table = table_for("0.5.23")
    assert table is not None and table.version == "0.5.23"
    tp = table.by_name["tp-size"]
    assert tp is table.by_name["tensor-parallel-size"] and tp.kind == "int"
    assert table.by_name["context-length"].kind == "human_int"
    assert {"auto", "fp8_e4m3", "fp8_e5m2", "bf16"} <= set(table.by_name["kv-cache-dtype"].choices or ())
    assert table.by_name["disable-cuda-graph"].deprecated
    assert not table.by_name["trust-remote-code"].takes_value
    assert len({id(s) for s in table.by_name.values()}) > 500


ORACLE = Path(os.environ.get("DEPLOYCTL_ORACLE_VENV", Path.home() / ".cache/deployctl/oracle-sglang-0.5.23"))


@pytest.mark.integration  # imports SGLang in the oracle venv: up to a minute on a busy machine
@pytest.mark.skipif(not (ORACLE / "bin" / "python").exists(), reason="no oracle venv (make oracle)")
def test_the_shipped_table_is_what_the_script_writes(tmp_path: Path) -> None:
    shipped = (ROOT / "agent/sglang/data/server_args-0.5.23.json").read_text(encoding="utf-8")
    code = (
        "import sys, json; sys.path.insert(0, 'tests/oracle'); import flag_table; "
        "print(json.dumps(flag_table.table(), indent=1, sort_keys=True))"
    )
    fresh = subprocess.run(
        [str(ORACLE / "bin" / "python"), "-c", code],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    assert json.loads(fresh.stdout) == json.loads(shipped)
