"""Evidence is one start, the right one: a log is split into its starts before anything is read from it, and
what a terminal, journald or docker adds around SGLang's lines is taken off first."""

# ruff: noqa: E501 - verbatim SGLang and journal lines are longer than code lines

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output
from agent.sglang.logs.decor import undecorated
from agent.sglang.logs.starts import evidence, split
from tests.pure.test_plan_cmd import HOST_TOML

ROOT = Path(__file__).resolve().parents[2]
GOOD = (ROOT / "examples" / "ct200-start.log").read_text(encoding="utf-8").splitlines()


def at_fraction(lines: list[str], fraction: float) -> list[str]:
    """The shipped ct200 start, as if run at another fraction (its server_args line says so)."""
    return [
        line.replace("'mem_fraction_static': 0.85", f"'mem_fraction_static': {fraction}") for line in lines
    ]


# ct200 at 0.95: the pool was built (target and draft pools), then graph capture ran out of memory.
OOM_AT_095 = [
    "[2026-12-01 09:40:00.112] server_args={'model_path': '/models/Kimi-K2.6', 'tp_size': 8, 'mem_fraction_static': 0.95, 'max_running_requests': 64, 'context_length': 32768, 'kv_cache_dtype': 'auto', 'page_size': 1, 'speculative_algorithm': 'DFLASH'}",
    "[2026-12-01 09:40:01.004 TP0] Load weight begin. avail mem=92.80 GB",
    "[2026-12-01 09:49:00.117 TP0] Load weight end. elapsed=540.00 s, type=KimiK25ForConditionalGeneration, quant=compressed-tensors, avail mem=22.32 GB, mem usage=70.48 GB.",
    "[2026-12-01 09:49:30.002 TP0] Load weight begin. avail mem=22.32 GB",
    "[2026-12-01 09:49:40.310 TP0] Load weight end. elapsed=10.00 s, type=DFlash2DraftModel, avail mem=21.12 GB, mem usage=1.20 GB.",
    "[2026-12-01 09:49:41.205 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 230200, KV size: 16.38 GB",
    "[2026-12-01 09:49:41.905 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 230200, KV size: 0.40 GB",
    "[2026-12-01 09:49:42.480 TP0] Memory pool end. avail mem=4.10 GB",
    "[2026-12-01 09:49:43.001 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=4.10 GB",
    "[2026-12-01 09:49:50.001 TP0] Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.",
    "[2026-12-01 09:49:50.101] Received sigquit from a child process. It usually means the child failed.",
]


def journal(*starts: list[str], host: str = "ct200") -> str:
    """`journalctl -u sglang.service -b` of these starts: its prefix on every line, systemd's own lines."""
    out: list[str] = []
    for i, lines in enumerate(starts):
        if i:
            out += [
                f"Dec 01 09:50:0{i} {host} systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL",
                f"Dec 01 09:50:0{i} {host} systemd[1]: sglang.service: Failed with result 'signal'.",
                f"Dec 01 09:50:1{i} {host} systemd[1]: sglang.service: Scheduled restart job, restart counter is at {i}.",
                f"Dec 01 09:50:1{i} {host} systemd[1]: Stopped sglang.service - SGLang.",
            ]
        out.append(f"Dec 01 09:50:2{i} {host} systemd[1]: Started sglang.service - SGLang.")
        out += [f"Dec 01 09:5{i}:00 {host} python3[{4800 + i}]: {line}" for line in lines]
    return "\n".join(out) + "\n"


def run(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / "ct200.toml").write_text(HOST_TOML, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(tmp_path / "units"), *argv], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def write(tmp_path: Path, text: str, name: str = "journal.log") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- item 1: a journal with a failed try and the start after it ---------------------------------------------


def test_an_oom_at_095_then_ready_at_088_reports_the_second_start(tmp_path: Path) -> None:
    # Was one start that never happened: 0.95 and cuda_graph_failed with the second's pool and a draft
    # pool of 259,810 tokens the second start does not have.
    log = write(tmp_path, journal(OOM_AT_095, at_fraction(GOOD, 0.88)))
    code, stdout, _ = run(tmp_path, "parse-log", log, "--json")
    d = json.loads(stdout)
    assert code == 0
    assert (d["start"], d["mem_fraction_static"], d["ready"], d["failure"]) == (2, 0.88, True, None)
    assert (d["kv_tokens"], d["draft_kv_tokens"]) == (101134, None)
    assert [(s["outcome"], s["mem_fraction_static"], s["failure"]) for s in d["starts"]] == [
        ("failed", 0.95, "cuda_graph_failed"),
        ("ready", 0.88, None),
    ]


def test_two_good_starts_report_the_last(tmp_path: Path) -> None:
    # Was the first start's figures: a start's figures are final once it says ready, so the second's were
    # dropped as "serving-phase" lines.
    second = [
        line.replace("#tokens: 101134", "#tokens: 150000").replace(
            "max_total_num_tokens=101134", "max_total_num_tokens=150000"
        )
        for line in at_fraction(GOOD, 0.9)
    ]
    log = write(tmp_path, journal(at_fraction(GOOD, 0.86), second))
    d = json.loads(run(tmp_path, "parse-log", log, "--json")[1])
    assert (d["start"], d["mem_fraction_static"], d["kv_tokens"]) == (2, 0.9, 150000)


def test_parse_log_lists_the_starts_and_start_n_reads_another(tmp_path: Path) -> None:
    log = write(tmp_path, journal(OOM_AT_095, at_fraction(GOOD, 0.88)))
    code, text, _ = run(tmp_path, "parse-log", log)
    assert code == 0
    assert text.splitlines()[0] == "start:         2 of 2 (ready, the last complete one)"
    assert "start 1: line 1, failed: cuda_graph_failed, mem fraction 0.95, pool 230,200 tokens" in text
    d = json.loads(run(tmp_path, "parse-log", log, "--json", "--start", "1")[1])
    assert (d["start"], d["mem_fraction_static"], d["failure"]["kind"], d["ready"]) == (
        1,
        0.95,
        "cuda_graph_failed",
        False,
    )
    assert d["kv_tokens"] == 230200


@pytest.mark.parametrize(
    ("number", "said"),
    [("3", "--start 3: there is no start 3: the log holds 2 starts"), ("0", "'0' is not a start number"),
     ("x", "'x' is not a start number")],
)  # fmt: skip
def test_a_start_the_log_does_not_hold_is_refused_in_one_line(tmp_path: Path, number: str, said: str) -> None:
    log = write(tmp_path, journal(OOM_AT_095, at_fraction(GOOD, 0.88)))
    code, stdout, stderr = run(tmp_path, "parse-log", log, "--start", number)
    assert code == 2 and stdout == ""
    assert said in stderr.splitlines()[0]


def plan(tmp_path: Path, log: str, *argv: str) -> tuple[dict[str, object], str]:
    code, stdout, stderr = run(
        tmp_path, "plan", "ct200", "--offline", "--context", "32k", "--json", "--from-log", log, *argv
    )
    assert code in (0, 5), stderr
    loaded: dict[str, object] = json.loads(stdout)
    return loaded, stderr


def test_plan_from_log_binds_the_oom_to_its_own_fraction(tmp_path: Path) -> None:
    # Was: the two starts read as one, 0.95 and the OOM with the second's pool, a start that never ran: set
    # aside as "2.29 x the architecture's bytes per token", so nothing calibrated the plan.
    log = write(tmp_path, journal(OOM_AT_095, GOOD))  # the ready start at its own 0.85: its pool is its own
    for argv, reads in (
        ((), "start 2 of 2 (line 17, ready at --mem-fraction-static 0.85"),
        (("--start", "1"), "start 1 of 2"),
    ):
        p, stderr = plan(tmp_path, log, *argv)
        warnings = [str(w) for w in p["warnings"]]  # type: ignore[attr-defined]
        assert any("0.950 ran out of GPU memory capturing CUDA graphs" in w for w in warnings), warnings
        assert not any("0.850" in w or "set aside" in w for w in warnings), warnings
        assert f"the plan reads {reads}" in stderr
        assert isinstance(p["mem_fraction_static"], float) and p["mem_fraction_static"] < 0.95
    # the calibration is the evidence start's alone: the failed start's pool is not fitted
    p, _ = plan(tmp_path, log)
    assert "calibrated from 1 earlier start(s)" in " ".join(str(n) for n in p["notes"])  # type: ignore[attr-defined]


def test_plan_start_needs_exactly_one_log(tmp_path: Path) -> None:
    code, _, stderr = run(tmp_path, "plan", "ct200", "--offline", "--context", "32k", "--start", "1")
    assert code == 2 and "exactly one --from-log" in stderr.splitlines()[0]


# --- item 7: decoration, and a log with no usable start --------------------------------------------------


def test_a_log_with_ansi_colour_codes_keeps_its_calibration(tmp_path: Path) -> None:
    # Was `pool: ?`, exit 0, and a plan from the cold estimate with one buried note.
    coloured = [
        f"\x1b[32m{line[:26]}\x1b[0m{line[26:]}\x1b[K" if line.startswith("[") else line for line in GOOD
    ]
    log = write(tmp_path, "\r\n".join(coloured) + "\r\n")
    code, text, _ = run(tmp_path, "parse-log", log)
    assert code == 0 and "pool:          101,134 tokens (6.62 GiB)" in text and "mem fraction:  0.85" in text
    p, _ = plan(tmp_path, log)
    assert p["basis"] == "calibrated", p


def test_a_log_with_no_usable_start_says_so_plainly(tmp_path: Path) -> None:
    log = write(
        tmp_path,
        "[2026-05-02 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=20.11 GB\n",
    )
    code, text, _ = run(tmp_path, "parse-log", log)
    assert code == 0 and text.startswith("no usable start in this log: ")
    code, stdout, stderr = run(tmp_path, "plan", "ct200", "--offline", "--context", "32k", "--from-log", log)
    assert code == 2 and stdout == ""
    assert stderr.startswith(f"deployctl: error: --from-log {log!r}: no usable start in it: ")
    assert len(stderr.splitlines()) == 2  # the error and its hint


KV = "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 101134, KV size: 6.62 GB"
SGL = f"[2026-12-01 10:09:41 TP0] {KV}"


@pytest.mark.parametrize(
    ("raw", "ident"),
    [
        (f"Dec 01 10:09:41 ct200 python3[4821]: {SGL}", "python3"),  # -o short
        (f"Dec 01 10:09:41.205123 ct200 python3[4821]: {SGL}", "python3"),  # -o short-precise
        (f"2026-12-01T10:09:41+0000 ct200 python3[4821]: {SGL}", "python3"),  # -o short-iso
        (f"2026-12-01T10:09:41.205123+00:00 ct-200.lab python3[4821]: {SGL}", "python3"),  # short-iso-precise
        (f"Tue 2026-12-01 10:09:41 UTC ct200 python3[4821]: {SGL}", "python3"),  # -o short-full
        (f"Tue 2026-12-01 10:09:41 UTC ct200 sglang.service[4821]: {SGL}", "sglang.service"),  # with-unit
        (f"[ 5123.456789] ct200 python3[4821]: {SGL}", "python3"),  # -o short-monotonic
        (f"[20345.456789 <    0.000123>] ct200 python3[4821]: {SGL}", "python3"),  # -o short-delta
        (f"1764583781.205123 ct200 python3[4821]: {SGL}", "python3"),  # -o short-unix
        (f"2026-12-01T10:09:41.205123456Z {SGL}", None),  # docker logs -t, kubectl logs --timestamps
        (f"\x1b[36msglang-1  |\x1b[0m 2026-12-01T10:09:41.205123456Z {SGL}", None),  # docker compose logs -t
        (f"\x1b[36msglang-1  | \x1b[0m{SGL}", None),  # docker compose logs
        (
            f"[pod/sglang-0/sglang] 2026-12-01T10:09:41.205123456Z {SGL}",
            None,
        ),  # kubectl logs --prefix --timestamps
        (f"\x1b[1;32m{SGL}\x1b[0m\r", None),  # a coloured terminal, CRLF
        (f"Dec 01 10:09:41 ct200 python3[4821]: {KV}", "python3"),  # SGLang's own prefix absent
        (f"2026-12-01T10:09:41.205Z {KV}", None),
    ],
)
def test_decoration_is_taken_off(raw: str, ident: str | None) -> None:
    line = undecorated(raw)
    assert line.text in (SGL, KV) and line.ident == ident


@pytest.mark.parametrize(
    "text",
    [
        "[2026-12-01 10:09:41 TP0] RuntimeError: Not enough memory: ValueError: x",
        "2026-12-01T10:09:41Z RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        "Loading safetensors checkpoint shards:  50% Completed | 2/4 [02:56<02:57, 88.81s/it]",
        "ValueError: foo: bar",
        "[2026-12-01 10:09:41] \x1b]0;title\x07 kept: the text's own escape, not a colour",
    ],
)
def test_a_message_is_not_taken_for_decoration(text: str) -> None:
    want = text.removeprefix("2026-12-01T10:09:41Z ")
    assert undecorated(text).text == want


def test_a_multi_rank_start_is_one_start() -> None:
    ranks = [
        "[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=2, mem_fraction_static=0.8)",
        *(f"[2026-12-01 10:00:01 TP{r}] Load weight begin. avail mem=79.10 GB" for r in (1, 0)),
        *(
            f"[2026-12-01 10:00:09 TP{r}] Load weight end. type=LlamaForCausalLM, avail mem=60.10 GB, mem usage=19.00 GB."
            for r in (0, 1)
        ),
        *(
            f"[2026-12-01 10:00:10 TP{r}] KV Cache is allocated. #tokens: 500000, K size: 15.26 GB, V size: 15.26 GB"
            for r in (1, 0)
        ),
        "[2026-12-01 10:00:20] The server is fired up and ready to roll!",
    ]
    starts = split(ranks)
    assert len(starts) == 1 and starts[0].summary.kv_tokens == 500000 and starts[0].outcome == "ready"


def test_without_marks_a_rank_loading_again_after_its_start_ended_is_a_new_start() -> None:
    one = [line for line in GOOD if "server_args" not in line]
    starts = split(one + [line.replace("101134", "90000") for line in one])
    assert [s.summary.kv_tokens for s in starts] == [101134, 90000]
    assert evidence(starts) is starts[1]


def test_type_notify_started_after_ready_is_the_same_start() -> None:
    lines = [*GOOD, "Dec 01 10:10:48 ct200 systemd[1]: Started sglang.service - SGLang.",
             "[2026-12-01 10:20:00 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]  # fmt: skip
    starts = split(lines)
    assert len(starts) == 1 and starts[0].summary.failure is not None


def test_a_journal_boot_line_opens_a_start() -> None:
    lines = [
        *at_fraction(GOOD, 0.8),
        "-- Boot 5e1c4b0f1a2d4c7e9b3a8f6d2c1e0b9a --",
        *[line for line in GOOD if "server_args" not in line],
    ]
    starts = split(lines)
    assert [s.summary.mem_fraction_static for s in starts] == [0.8, None]


def test_a_facts_files_last_start_of_two_starts_calibrates_from_the_last_complete(tmp_path: Path) -> None:
    # Was: both starts read as one, the failed one's cuda_graph_failed with the good one's 0.85 and pool.
    facts = json.loads((ROOT / "examples" / "ct200.json").read_text(encoding="utf-8"))
    facts["last_start"] = journal(OOM_AT_095, GOOD)
    path = tmp_path / "ct200.json"
    path.write_text(json.dumps(facts), encoding="utf-8")
    code, stdout, stderr = run(tmp_path, "plan", "--facts", str(path), "--context", "32k", "--json")
    assert code in (0, 5), stderr
    p = json.loads(stdout)
    warnings = [str(w) for w in p["warnings"]]
    assert any("0.950 ran out of GPU memory" in w for w in warnings), warnings
    assert not any("0.850 ran out" in w or "set aside" in w for w in warnings), warnings
    assert "calibrated from 1 earlier start(s)" in " ".join(str(n) for n in p["notes"])


def test_another_units_start_mid_start_cuts_nothing() -> None:
    # `journalctl -b` without -u: systemd starts a session or a timer while SGLang loads its weights.
    lines = [*GOOD[:6], "Dec 01 10:05:00 ct200 systemd[1]: Started session-3.scope - Session 3 of User root.",
             "Dec 01 10:05:01 ct200 systemd[1]: Started apt-daily.service - Daily apt download activities.",
             *GOOD[6:]]  # fmt: skip
    starts = split(lines)
    assert len(starts) == 1 and starts[0].summary.ready and starts[0].summary.kv_tokens == 101134


def test_with_no_complete_start_the_last_is_read_and_said_so(tmp_path: Path) -> None:
    cut = [line for line in GOOD if "ready to roll" not in line]  # a start still warming up
    # the first one restarted by hand while warming up (systemd's SIGKILL of it alone would be its failure)
    text = journal(at_fraction(cut, 0.8), cut)
    killed = "Dec 01 09:50:01 ct200 systemd[1]: sglang.service: Main process exited"
    stop = "Dec 01 09:50:00 ct200 systemd[1]: Stopping sglang.service - SGLang...\n"
    log = write(tmp_path, text.replace(killed, stop + killed))
    code, text, _ = run(tmp_path, "parse-log", log)
    assert code == 0 and text.splitlines()[0] == "start:         2 of 2 (cut, the last one: none is complete)"


def test_a_start_that_failed_after_ready_is_failed_and_bounds_the_plan(tmp_path: Path) -> None:
    # An OOM while serving at 0.95, then a start at 0.85 (the one that calibrates).
    serving_oom = [
        *at_fraction(GOOD, 0.95),
        "[2026-12-01 10:20:00 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ]
    starts = split([*serving_oom, *GOOD])
    assert [(s.outcome, s.summary.ready) for s in starts] == [("failed", True), ("ready", True)]
    log = write(tmp_path, journal(serving_oom, GOOD))
    assert (
        "start 1: line 1, ready, then failed: cuda_oom, mem fraction 0.95"
        in run(tmp_path, "parse-log", log)[1]
    )
    p, _ = plan(tmp_path, log)
    assert any("0.950 ran out of GPU memory after its pool was built" in str(w) for w in p["warnings"])  # type: ignore[attr-defined]


# --- whose `Started` line opens a start -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "other",
    [
        "Started sglang-weight-cache.service - SGLang weight cache.",
        "Started session-5.scope - Session 5 of User sglang.",
        "Started user@1001.service - User Manager for UID 1001 (sglang).",
        "Started Session 7 of user sglang.",  # an older systemd: the description alone
    ],
)
def test_another_units_started_line_stays_in_the_start(other: str) -> None:
    lines = [*GOOD[:9], f"Dec 01 10:05:00 ct200 systemd[1]: {other}", *GOOD[9:]]
    assert len(split(lines)) == 1


def test_the_inventorys_unit_name_is_the_one_that_opens_a_start() -> None:
    restart = "Dec 01 10:20:00 ct200 systemd[1]: Starting sglang-b.service - SGLang server..."
    lines = [*GOOD, restart]
    assert len(split(lines, unit="sglang-a.service")) == 1  # another SGLang unit on the same host
    assert len(split([*lines, *GOOD], unit="sglang-b")) == 2


def test_a_failed_start_then_a_rank_that_reloads_its_weights_is_a_new_start() -> None:
    failed = [*GOOD[:9], "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    again = [line for line in GOOD[1:] if "server_args" not in line]  # no launch mark: a paste's excerpt
    assert [s.outcome for s in split([*failed, *again])] == ["failed", "ready"]


def test_a_start_with_mapped_weights_calibrates_from_its_weights_end_line(tmp_path: Path) -> None:
    # [weight_cache]: an engine that maps the daemon's weights logs "Load weight end" (avail, mem usage) and
    # no begin line; SGLang's mem usage is the avail before the load less the one after it
    mapped = [line for line in GOOD if "Load weight begin" not in line]
    summary = split(mapped)[-1].summary
    assert summary.avail_mem_before_weights_gb == pytest.approx(22.32 + 70.48)
    _code, out, _ = run(
        tmp_path, "plan", "ct200", "--context", "32768", "--from-log", write(tmp_path, "\n".join(mapped))
    )
    assert "calibrated" in out.splitlines()[0], out.splitlines()[0]
