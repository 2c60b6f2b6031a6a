"""A PD decode's parity failures as the log parser and `deployctl parse-log` read them: a failure kind of its
own for a page-size and for a KV-dtype mismatch, and a one-line fix from the two values SGLang printed.

The two lines are SGLang 0.5.23's own (srt/disaggregation/common/conn.py:1320-1334), as the real decode
printed them on the CPU (shared/sglang/PD-AND-HICACHE-ON-CPU.md; tests/integration/test_real_pd.py reads
them off a real decode's journal).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.cli.main import main
from agent.output import Output
from agent.sglang.logs import events as ev
from agent.sglang.logs import pd
from agent.sglang.logs.failures import classify
from agent.sglang.logs.fixes import fix_for

PAGE = (
    "RuntimeError: Page size mismatch: prefill server has page_size=1, but decode server has page_size=16. "
    "Both servers must use the same --page-size value."
)
DTYPE = (
    "RuntimeError: KV cache dtype mismatch: prefill server has kv_cache_dtype=auto, but decode server has "
    "kv_cache_dtype=bf16. Both servers must use the same --kv-cache-dtype value."
)
REAL = Path(__file__).resolve().parents[1] / "data/realpd/decode-page-size-mismatch.log"
# A decode that served, then met its prefill at the first routed request (the real decode's lines).
SERVED = [
    "[2026-12-06 01:50:57] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 16384, K size: 0.00 GB, "
    "V size: 0.00 GB",
    "[2026-12-06 01:50:57] max_total_num_tokens=16384, chunked_prefill_size=4096, max_prefill_tokens=16384, "
    "max_running_requests=2, context_len=4096, available_cpu_mem=20.49 GB",
    "[2026-12-06 01:50:58] The server is fired up and ready to roll!",
]


def parse_log(tmp_path: Path, lines: list[str], *args: str) -> str:
    path = tmp_path / "decode.log"
    path.write_text("\n".join(lines) + "\n")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert main(["parse-log", str(path), *args], out) == 0
    assert isinstance(out.stdout, io.StringIO)
    return out.stdout.getvalue()


@pytest.mark.parametrize(
    ("line", "kind"), [(PAGE, ev.PD_PAGE_SIZE_MISMATCH), (DTYPE, ev.PD_KV_DTYPE_MISMATCH)]
)
def test_each_mismatch_is_a_kind_of_its_own(line: str, kind: str) -> None:
    assert kind in ev.FAILURE_KINDS and kind not in ev.GENERIC_FAILURE_KINDS
    assert classify(line) == (kind, 2, None)
    assert classify(line.removeprefix("RuntimeError: ")) == (kind, 2, None)
    assert classify(f"the user wrote: {line}") is None  # anchored: a prompt quoting it is no failure


def test_the_fix_names_both_values_and_the_flag() -> None:
    assert fix_for(ev.PD_PAGE_SIZE_MISMATCH, PAGE) == (
        "the prefill runs --page-size 1, the decode --page-size 16: give every role the same --page-size, "
        "once in [sglang.flags], then restart the decode"
    )
    said = fix_for(ev.PD_KV_DTYPE_MISMATCH, DTYPE)
    assert said is not None and "--kv-cache-dtype auto, the decode --kv-cache-dtype bf16" in said
    assert "SGLang compares the text" in said


@given(
    st.sampled_from(["page_size", "kv_cache_dtype"]),
    st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True),
)
def test_any_two_values_come_back_in_the_fix(field: str, prefill: str, decode: str) -> None:
    opening = "Page size mismatch" if field == "page_size" else "KV cache dtype mismatch"
    flag = "--page-size" if field == "page_size" else "--kv-cache-dtype"
    line = (
        f"RuntimeError: {opening}: prefill server has {field}={prefill}, but decode server has "
        f"{field}={decode}. Both servers must use the same {flag} value."
    )
    assert f"the prefill runs {flag} {prefill}, the decode {flag} {decode}:" in pd.fix(line)


def test_a_line_without_its_values_still_gets_a_fix() -> None:
    assert "--page-size or --kv-cache-dtype" in pd.fix("RuntimeError: Page size mismatch")


def test_parse_log_says_ready_then_failed_and_what_to_do(tmp_path: Path) -> None:
    died = [
        *SERVED,
        "[2026-12-06 01:51:10] Scheduler hit an exception: Traceback (most recent call last):",
        PAGE,
    ]
    text = parse_log(tmp_path, died)
    assert "ready, then failed: pd_page_size_mismatch" in text
    assert f"  {PAGE}" in text.splitlines()
    assert "what to do:    the prefill runs --page-size 1, the decode --page-size 16" in text
    doc = json.loads(parse_log(tmp_path, [*SERVED, DTYPE], "--json"))
    assert doc["failure"] == {"kind": ev.PD_KV_DTYPE_MISMATCH, "line": DTYPE}
    assert doc["fix"].startswith("the prefill runs --kv-cache-dtype auto")


def test_a_start_without_a_fixable_failure_has_no_fix(tmp_path: Path) -> None:
    assert json.loads(parse_log(tmp_path, SERVED, "--json"))["fix"] is None
    assert "what to do" not in parse_log(tmp_path, SERVED)


def test_a_real_decodes_journal_names_its_failed_start(tmp_path: Path) -> None:
    """The real decode's journal (tests/integration/test_real_pd.py, `journalctl -o cat -u`): a start stopped
    by its restart, then one on --page-size 16 that served and died at its first routed request."""
    log = REAL.read_text().splitlines()
    text = parse_log(tmp_path, log)
    assert "start:         2 of 2 (ready, then failed: pd_page_size_mismatch, the last complete one)" in text
    assert f"  {PAGE}" in text.splitlines()
    assert "what to do:    the prefill runs --page-size 1, the decode --page-size 16" in text


# SGLang 0.5.23's lines (srt/disaggregation/decode.py:3331-3350 `_verify_kv_checksums`, logged by
# logger.error; raised as RuntimeError in its CI, `_handle_kv_checksum_mismatch`).
CHECKSUM = "KV checksum mismatch req=5f2c bootstrap_room=7 expected=0x1a2b got=0x1a2a"
CHECKSUM_PEER = "KV checksum mismatch on a peer rank req=5f2c bootstrap_room=7"


@pytest.mark.parametrize("line", [CHECKSUM, CHECKSUM_PEER, f"RuntimeError: {CHECKSUM}"])
def test_a_kv_checksum_mismatch_is_a_kind_of_its_own(line: str) -> None:
    kind = ev.PD_KV_CHECKSUM_MISMATCH
    assert kind in ev.FAILURE_KINDS and kind not in ev.GENERIC_FAILURE_KINDS
    assert classify(line) == (kind, 2, None)
    assert classify(f"the user wrote: {line}") is None  # anchored: a prompt quoting it is no failure


def test_the_checksum_fix_names_the_transfer_path_and_the_layout() -> None:
    said = fix_for(ev.PD_KV_CHECKSUM_MISMATCH, CHECKSUM)
    assert said is not None
    assert "not what the prefill sent" in said and "request" in said
    assert "ib_device" in said and "UCX_NET_DEVICES" in said  # the transfer path
    assert "--page-size" in said and "--kv-cache-dtype" in said  # a layout the roles disagree on


def test_parse_log_names_a_checksum_mismatch_in_a_served_start(tmp_path: Path) -> None:
    logged = f"[2026-12-06 01:51:10] {CHECKSUM}"
    doc = json.loads(parse_log(tmp_path, [*SERVED, logged], "--json"))
    assert doc["failure"] == {"kind": ev.PD_KV_CHECKSUM_MISMATCH, "line": logged}
    assert "not what the prefill sent" in doc["fix"]
