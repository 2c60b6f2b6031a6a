"""Review of the planner's round 5: each test fails on aaf5a78 and names a defect."""

from __future__ import annotations

import io
import json
from pathlib import Path

from agent.cli.main import main
from agent.output import Output
from agent.sglang.logs.starts import split
from tests.pure.test_log_starts import GOOD
from tests.pure.test_plan_cmd import HOST_TOML

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, toml: str, *argv: str) -> tuple[int, str, str]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / "ct200.toml").write_text(toml, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(tmp_path / "units"), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def _journal(lines: list[str]) -> list[str]:
    return [f"Dec 01 10:00:00 ct200 python3[48211]: {line}" for line in lines]


def test_another_units_started_line_that_names_user_sglang_does_not_split_a_start() -> None:
    # `journalctl -b`: someone logs in as the service's user (the shipped inventory's user = "sglang")
    # while the weights load; systemd's line for that session's scope is not a start of SGLang.
    lines = [
        "Dec 01 09:59:57 ct200 systemd[1]: Starting sglang.service - SGLang server...",
        *_journal(GOOD[:8]),
        "Dec 01 10:05:00 ct200 systemd[1]: Started session-5.scope - Session 5 of User sglang.",
        *_journal(GOOD[8:]),
    ]
    starts = split(lines)
    assert len(starts) == 1, [(s.number, s.outcome) for s in starts]


def test_a_failed_starts_trailing_rank_lines_are_not_a_start_of_their_own() -> None:
    # TP3 dies while TP0 goes on to load the draft: one failed start, not a failed start and a phantom
    failed = [
        *GOOD[:9],
        "[2026-12-01 10:09:00 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        *GOOD[9:11],
    ]
    starts = split(failed)
    assert [s.outcome for s in starts] == ["failed"], [(s.number, s.outcome) for s in starts]


def test_dp_replicas_need_their_gpus(tmp_path: Path) -> None:
    # server_args.py compute_world_size: dp x tp x pp GPUs; 2 replicas at TP 8 need 16 GPUs, not 8
    code, out, _ = run(
        tmp_path, HOST_TOML, "plan", "ct200", "--offline", "--context", "32k", "--set", "dp-size=2"
    )
    assert code == 8, out.splitlines()[0]


def test_a_set_that_shrinks_the_running_pool_says_so_in_the_headline(tmp_path: Path) -> None:
    toml = HOST_TOML.replace(
        "max-running-requests = 64", 'max-running-requests = 64\nkv-cache-dtype = "fp8_e4m3"'
    )
    _, before, _ = run(tmp_path, toml, "plan", "ct200", "--offline", "--context", "32768", "--json")
    _code, out, _ = run(
        tmp_path,
        toml,
        "plan",
        "ct200",
        "--offline",
        "--context",
        "32768",
        "--set",
        "kv-cache-dtype=auto",
        "--json",
    )
    old, new = json.loads(before), json.loads(out)
    assert new["predicted_pool_tokens"] < old["predicted_pool_tokens"] // 2 + 10  # the pool halves ...
    assert new.get("shrinks"), "... and the plan does not say so"


def test_a_max_total_tokens_cap_that_shrinks_the_running_pool_says_so(tmp_path: Path) -> None:
    _code, out, _ = run(
        tmp_path, HOST_TOML, "plan", "ct200", "--offline", "--context", "32768",
        "--set", "max-total-tokens=40000", "--json",
    )  # fmt: skip
    assert json.loads(out).get("shrinks"), json.loads(out)["predicted_pool_tokens"]


def test_facts_plan_refuses_a_deep_shrink_of_the_models_own_context(tmp_path: Path) -> None:
    # the facts' unit sets no --context-length: SGLang serves the model's 131,072; 4096 is 1/32 of it
    code, out, _err = run(
        tmp_path, HOST_TOML, "plan", "--facts", str(ROOT / "examples" / "llama-3.1-8b-h100.json"),
        "--context", "4096",
    )  # fmt: skip
    assert code == 2, out.splitlines()[0]


def test_no_yarn_hint_over_a_models_own_rope_scaling(tmp_path: Path) -> None:
    # Llama 3.1 ships rope_type llama3 from 8,192: a yarn override "from 131,072" replaces it
    _code, out, _ = run(
        tmp_path, HOST_TOML, "plan", "--facts", str(ROOT / "examples" / "llama-3.1-8b-h100.json"),
        "--context", "1m", "--json",
    )  # fmt: skip
    assert "yarn" not in json.loads(out)["binding"]


def test_apply_with_a_set_keeps_the_hosts_last_start_as_calibration() -> None:
    # a host whose agent read no config.json (plan_for_host): --set kv-cache-dtype must scale the last start's
    # cell from auto, as plan --from-log does, not take the start as run under fp8 and set it aside
    from agent.apply import make_plan
    from agent.inventory import load_service
    from agent.orchestrate.asked import Change

    host = load_service("ct200", ROOT / "units")
    last = split((ROOT / "examples" / "ct200-start.log").read_text(encoding="utf-8").splitlines())[-1]
    facts = {"flags": dict(host.sglang.flags), "last_start": last.figures()}
    plan = make_plan(host, Change(context=200_000, flags=(("kv-cache-dtype", "fp8_e4m3"),)), facts)  # type: ignore[arg-type]
    assert plan.basis.startswith("calibrated"), plan.warnings


def test_systemds_started_line_during_warmup_does_not_cut_the_start() -> None:
    # a unit with ExecStartPost= waiting on /v1/models: systemd says "Started" once uvicorn answers, while
    # SGLang's warmup runs and before "The server is fired up"; the start is one start, and it calibrates
    up = next(i for i, line in enumerate(GOOD) if "Uvicorn running" in line)
    lines = [
        "Dec 01 09:59:57 ct200 systemd[1]: Starting sglang.service - SGLang server...",
        *_journal(GOOD[: up + 1]),
        "Dec 01 10:10:44 ct200 systemd[1]: Started sglang.service - SGLang server.",
        *_journal(GOOD[up + 1 :]),
    ]
    starts = split(lines)
    assert len(starts) == 1, [(s.number, s.outcome, s.summary.kv_tokens) for s in starts]


def test_plan_json_prints_set_values_as_the_flag_table_types_them(tmp_path: Path) -> None:
    _code, out, _ = run(
        tmp_path, HOST_TOML, "plan", "ct200", "--offline", "--context", "32768",
        "--set", "tp-size=8", "--set", "chunked-prefill-size=4096",
        "--set", "kv-cache-dtype=fp8_e4m3", "--json",
    )  # fmt: skip
    flags = json.loads(out)["flags"]
    assert flags["tp-size"] == 8 and flags["chunked-prefill-size"] == 4096
    assert flags["kv-cache-dtype"] == "fp8_e4m3"
