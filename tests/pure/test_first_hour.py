"""A newcomer's first hour, offline: no internal error on input a person produces, no guessed option."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from tests.pure import facts_fixtures as cfg
from tests.pure.test_facts_plan import H100, facts

UNITS = Path(__file__).resolve().parents[2] / "units"


def llama(**kw: Any) -> dict[str, Any]:
    """Llama 3.1 8B on one H100 (16.06 GB of bf16 weights)."""
    return copy.deepcopy(facts(cfg.LLAMA31_8B, H100, 1, weights=16_060_000_000, **kw))  # callers change it


class _Ascii(io.StringIO):
    """A stdout whose encoding is ASCII (PYTHONIOENCODING=ascii, a C locale): what it cannot encode fails."""

    encoding = "ascii"

    def write(self, s: str) -> int:
        s.encode("ascii")
        return super().write(s)


def run_cli(*argv: str, units: Path = UNITS, stdout: io.StringIO | None = None) -> tuple[int, str, str]:
    out = Output(stdout=stdout or io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(units), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def assert_one_line(result: tuple[int, str, str], *words: str) -> str:
    code, _, stderr = result
    assert code == ExitCode.USAGE, stderr
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("deployctl: error: "), stderr
    assert "internal error" not in stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(autouse=True)
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEPLOYCTL_UNITS", raising=False)
    return tmp_path


def write_facts(tmp_path: Path, doc: Any, name: str = "facts.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(path)


# --- internal errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", ["0.993", "0.995", "0.999", "0.9999"])
def test_chart_stays_in_its_frame_at_a_fraction_near_one(fraction: str) -> None:
    code, stdout, stderr = run_cli(
        "plan", "ct200", "--offline", "--context", "200k", "--mem-fraction-static", fraction
    )
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert "KV pool (tokens)" in stdout


def test_chart_of_a_card_with_almost_no_memory(tmp_path: Path) -> None:
    text = (
        (UNITS / "ct200.toml").read_text(encoding="utf-8").replace("memory_gib = 95.6", "memory_gib = 1e-9")
    )
    assert "1e-9" in text
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "ct200.toml").write_text(text, encoding="utf-8")
    code, _, stderr = run_cli("plan", "ct200", "--offline", "--context", "200k", units=tmp_path / "u")
    assert code in (0, ExitCode.NOT_FEASIBLE, ExitCode.USAGE), stderr
    assert "internal error" not in stderr


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"tp-size": "x"}, ("flags.tp-size",)),
        ({"pp-size": "two"}, ("flags.pp-size",)),
        ({"tp-size": 0}, ("flags.tp-size", ">= 1")),
        ({"gpu-memory-utilization": 0.9}, ("flags.gpu-memory-utilization",)),
    ],
)
def test_bad_flag_in_a_facts_file_names_the_file_and_key(
    tmp_path: Path, flags: dict[str, Any], words: tuple[str, ...]
) -> None:
    doc = llama(flags=flags)
    path = write_facts(tmp_path, doc)
    assert_one_line(run_cli("plan", "--facts", path, "--context", "32k"), "facts.json", *words)


def test_plan_in_an_ascii_pipe_writes_ascii() -> None:
    code, stdout, stderr = run_cli("plan", "ct200", "--offline", "--context", "200k", stdout=_Ascii())
    assert code in (0, ExitCode.NOT_FEASIBLE), stderr
    assert stdout.isascii() and "KV pool" in stdout


def test_deeply_nested_facts_are_refused(tmp_path: Path) -> None:
    path = write_facts(tmp_path, "[" * 100_000)
    assert_one_line(run_cli("plan", "--facts", path, "--context", "32k"), "facts.json")


def test_facts_with_a_bom_say_so(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(llama()).encode())
    assert_one_line(run_cli("plan", "--facts", str(path), "--context", "32k"), "BOM")


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda d: d["gpus"][0].update(memory_total_mib="81559"), ("gpus.0.memory_total_mib",)),
        (lambda d: d["gpus"][0].update(memory_total_mib=True), ("gpus.0.memory_total_mib",)),
        (lambda d: d["model"].update(weights_bytes=True), ("model.weights_bytes",)),
    ],
)
def test_facts_values_the_inventory_refuses(tmp_path: Path, mutate: Any, words: tuple[str, ...]) -> None:
    doc = llama()
    mutate(doc)
    assert_one_line(run_cli("plan", "--facts", write_facts(tmp_path, doc), "--context", "32k"), *words)


def test_parse_log_of_an_endless_file_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli.commands import parse_log

    monkeypatch.setattr(parse_log, "MAX_LOG_BYTES", 1 << 16)
    assert_one_line(run_cli("parse-log", "/dev/zero"), "/dev/zero")


def test_ctrl_d_at_the_question_is_no(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import deploy
    from agent.errors import UsageError
    from agent.inventory import load_host

    def eof(prompt: str = "") -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO(), stdin_isatty=True)
    with pytest.raises(UsageError, match="nothing was changed"):
        deploy.confirm(out, False, load_host("ct200", UNITS))


EXCERPTS = {
    "graph": "[2026-05-02 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes. "
    "avail mem=20.11 GB\n",
    "traceback": 'Traceback (most recent call last):\n  File "/usr/lib/python3/dist-packages/sglang/srt/'
    'managers/scheduler.py", line 2710, in run_scheduler_process\nRuntimeError: boom\n',
}


@pytest.mark.parametrize("kind", sorted(EXCERPTS))
def test_parse_log_reads_an_sglang_excerpt_without_a_start(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "excerpt.log"
    path.write_text(EXCERPTS[kind], encoding="utf-8")
    code, stdout, stderr = run_cli("parse-log", str(path))
    assert code == 0, stderr
    assert "pool:" in stdout


@pytest.mark.parametrize(
    "content", [b"INFO 05-02 vllm.entrypoints: GPU KV cache size: 1000 tokens\n", b"\x00\x01\xff" * 100, b""]
)
def test_from_log_of_no_sglang_log_is_refused_as_parse_log_refuses(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "other.log"
    path.write_bytes(content)
    parse = assert_one_line(run_cli("parse-log", str(path)), "no SGLang line")
    plan = assert_one_line(
        run_cli("plan", "ct200", "--offline", "--context", "200k", "--from-log", str(path)), "no SGLang line"
    )
    assert parse[parse.index("no SGLang line") :] == plan[plan.index("no SGLang line") :]


# --- no guessing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "ct200", "--offline", "--cont", "200k"),
        ("apply", "ct200", "--context", "200k", "--for", "--dry-run"),
        ("render", "ct200", "--context", "200k", "--mem-frac", "0.9"),
        ("fleet", "apply", "gpu", "--context", "200k", "--can", "1"),
    ],
)
def test_option_prefixes_are_not_taken(argv: tuple[str, ...]) -> None:
    assert_one_line(run_cli(*argv), "unrecognized")


def test_a_typo_is_named_with_the_option_meant() -> None:
    line = assert_one_line(run_cli("plan", "ct200", "--offline", "--contxt", "200k"))
    assert line == "deployctl: error: unrecognized --contxt; did you mean --context?"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("tp-size=0", ("--set tp-size", ">= 1")),
        ("tp-size=-8", ("--set tp-size", ">= 1")),
        ("tensor-parallel-size=0", ("--set tp-size", ">= 1")),
        ("page-size=0", ("--set page-size", ">= 1")),
        ("served-model-name=", ("--set served-model-name", "empty")),
        ("json-model-override-args={bad", ("--set json-model-override-args", "JSON")),
        ("model-path=/models/other", ("--set model-path", "[model] path")),
        ("model=/models/other", ("--set model-path", "[model] path")),
        ("port=31000", ("--set port", "[sglang] port")),
        ("host=0.0.0.0", ("--set host", "[sglang] host")),
        ("nnodes=2", ("--set nnodes", "[nodes]")),
        ("node-rank=1", ("--set node-rank", "[nodes]")),
        ("dist-init-addr=10.0.0.1:5000", ("--set dist-init-addr", "[nodes]")),
    ],
)
def test_set_refuses_what_sglang_would_misread(value: str, words: tuple[str, ...]) -> None:
    for command in ("plan", "render"):
        argv = (command, "ct200", "--context", "200k", "--set", value)
        assert_one_line(run_cli(*argv, *(["--offline"] if command == "plan" else [])), *words)


def test_set_of_an_alias_replaces_the_flag() -> None:
    code, stdout, stderr = run_cli(
        "render",
        "ct200",
        "--context",
        "32k",
        "--mem-fraction-static",
        "0.85",
        "--set",
        "tensor-parallel-size=4",
    )
    assert code == 0, stderr
    assert "--tensor-parallel-size" not in stdout and "--tp-size 4" in stdout and "--tp-size 8" not in stdout


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("port = 31000", ("sglang.flags.port", "[sglang] port")),
        ('host = "10.0.0.9"', ("sglang.flags.host", "[sglang] host")),
        ("nnodes = 2", ("sglang.flags.nnodes", "[nodes]")),
        ("node-rank = 1", ("sglang.flags.node-rank", "[nodes]")),
        ('dist-init-addr = "10.0.0.1:5000"', ("sglang.flags.dist-init-addr", "[nodes]")),
        ("page-size = 0", ("sglang.flags.page-size", ">= 1")),
        ("tensor-parallel-size = 8", ("tensor-parallel-size", "tp-size")),
        ('served-model-name = ""', ("sglang.flags.served-model-name",)),
    ],
)
def test_inventory_flags_follow_the_same_rules(tmp_path: Path, line: str, words: tuple[str, ...]) -> None:
    text = (
        (UNITS / "ct200.toml")
        .read_text(encoding="utf-8")
        .replace("[sglang.flags]\n", f"[sglang.flags]\n{line}\n")
    )
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "ct200.toml").write_text(text, encoding="utf-8")
    assert_one_line(run_cli("plan", "ct200", "--offline", "--context", "200k", units=tmp_path / "u"), *words)


@pytest.mark.parametrize(
    "argv",
    [("apply", "ct200", "--context", "200k"), ("rollback", "ct200"), ("rollback", "ct200", "--to", "x")],
)
def test_without_a_terminal_and_yes_nothing_connects(
    monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    from agent.orchestrate import session

    def connects(*_: object, **__: object) -> None:
        raise AssertionError("connected before refusing")

    monkeypatch.setattr(session, "open_transport", connects)
    assert_one_line(run_cli(*argv), "not on a terminal", "--yes")


def test_attention_has_no_default_it_is_asked_for_by_name(tmp_path: Path) -> None:
    """docs/topologies.md's Qwen3-235B names no attention: offline, it is asked for, not guessed as MLA."""
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "q.toml").write_text(
        '[ssh]\ntarget = "gpu1"\n[gpus]\ncount = 8\nmemory_gib = 139.8\n'
        '[model]\npath = "/models/Qwen3-235B-A22B"\n[sglang.flags]\ntp-size = 8\n',
        encoding="utf-8",
    )
    line = assert_one_line(
        run_cli("plan", "q", "--offline", "--context", "32k", units=tmp_path / "u"), "model.attention"
    )
    assert "kv_lora_rank" not in line


# --- what people expect around a CLI ------------------------------------------------------------------------


def test_version_names_the_sglang_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert "SGLang 0.5.23" in capsys.readouterr().out


def test_fleet_apply_takes_apply_options_and_common_ones_after_the_action(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agent.cli.main import build_parser

    args = build_parser().parse_args(
        ["fleet", "apply", "gpu", "--context", "200k", "--dry-run", "-y", "--set", "kv-cache-dtype=fp8_e4m3",
         "--mem-fraction-static", "0.9", "--max-running-requests", "32", "--units", "elsewhere", "--debug"]
    )  # fmt: skip
    assert (args.dry_run, args.yes, args.mem_fraction_static, args.max_running_requests) == (
        True,
        True,
        0.9,
        32,
    )
    assert (args.units, args.debug) == ("elsewhere", True)
    assert main(["fleet", "apply", "--help"]) == 0
    assert "Roll a change across an inventory group" in capsys.readouterr().out


def test_fleet_dry_run_is_ansible_check_mode_and_carries_the_fraction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.fleet import front

    text = (UNITS / "ct200.toml").read_text(encoding="utf-8").replace("[ssh]", 'groups = ["gpu"]\n\n[ssh]', 1)
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "ct200.toml").write_text(text, encoding="utf-8")
    seen: dict[str, Any] = {}

    def playbook(name: str, folder: Path, extra: dict[str, Any], *_: Any, check: bool = False) -> Any:
        seen.update(extra=extra, check=check)
        raise front.UsageError("stop here")

    monkeypatch.setattr(front, "run_playbook", playbook)
    run_cli(
        "fleet",
        "apply",
        "gpu",
        "--context",
        "200k",
        "--dry-run",
        "--mem-fraction-static",
        "0.9",
        units=tmp_path / "u",
    )
    assert seen["check"] is True and seen["extra"]["deployctl_set"]["mem-fraction-static"] == 0.9


def test_render_json() -> None:
    code, stdout, stderr = run_cli(
        "render", "ct200", "--context", "200k", "--mem-fraction-static", "0.93", "--json"
    )
    assert code == 0, stderr
    assert "--mem-fraction-static 0.93" in json.loads(stdout)["unit"]
    code, stdout, _ = run_cli(
        "render", "ct200", "--context", "200k", "--mem-fraction-static", "0.93", "--json", "--diff"
    )
    changes = {c["flag"]: c["after"] for c in json.loads(stdout)["changes"]}
    assert changes["mem-fraction-static"] == "0.93"


def test_adopt_offers_json_and_facts_no_quiet() -> None:
    from agent.cli.main import build_parser

    assert build_parser().parse_args(["adopt", "h", "--ssh", "h", "--json"]).json is True
    assert_one_line(run_cli("facts", "ct200", "--quiet"), "unrecognized --quiet")


def test_full_context_requests_never_above_the_request_cap() -> None:
    argv = (
        "plan",
        "ct200",
        "--offline",
        "--context",
        "1k",
        "--max-running-requests",
        "4",
        "--shrink-context",
    )
    code, stdout, stderr = run_cli(*argv)
    assert code == 0, stderr
    assert "full-context requests at once  4\n" in stdout
    assert "4 request(s) of the full 1,000 tokens fit at once" in stdout


def test_fp8_alternative_of_a_gqa_model_speaks_of_no_mla(tmp_path: Path) -> None:
    path = write_facts(tmp_path, llama())
    code, stdout, _ = run_cli("plan", "--facts", path, "--context", "1m")
    assert code == ExitCode.NOT_FEASIBLE
    assert "fp8 KV cache" in stdout and "MLA" not in stdout
