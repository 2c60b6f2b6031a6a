"""Every refusal of SGLang 0.5.23's PD handshake (srt/disaggregation/common/conn.py:1320-1418) is a failure
kind of its own with a fix: parse-log reads each out of a real decode's death, in place of its page-size
line."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import ROOT

REAL_DECODE_LOG = ROOT / "tests" / "data" / "realpd" / "decode-page-size-mismatch.log"
# The messages as conn.py formats them, with values filled in
RAISED = [
    ("Page size mismatch: prefill server has page_size=16, but decode server has page_size=1. Both servers "
     "must use the same --page-size value.", "pd_page_size_mismatch", "--page-size 16"),
    ("KV cache dtype mismatch: prefill server has kv_cache_dtype=auto, but decode server has "
     "kv_cache_dtype=bf16. Both servers must use the same --kv-cache-dtype value.", "pd_kv_dtype_mismatch",
     "--kv-cache-dtype auto"),
    ("MiniMax sparse PD requires matching attention TP sizes: prefill=2, decode=1.", "pd_attn_tp_mismatch",
     "tp-size"),
    ("KV layout mismatch: prefill server has kv_layout=nsa, but decode server has kv_layout=mla. Both "
     "servers must use the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT.", "pd_kv_layout_mismatch",
     "as nsa, the decode as mla"),
    ("DeepSeek-V4.1 DSpark PD layout mismatch (block_size): both servers must enable DSpark with the same "
     "block size and target/draft KV layout. Upgrade both servers together.", "pd_dspark_layout_mismatch",
     "block size"),
    ("DeepSeek-V4.1 DSpark PD requires the same TP size on both servers (including prefill CP ranks for "
     "MLA)", "pd_attn_tp_mismatch", "tp-size"),
    ("PD Disaggregation does NOT support different attention TP sizes with MXFP8 KV cache: prefill "
     "attn_tp_size=2, decode attn_tp_size=1, state types ['block_scale'].", "pd_attn_tp_mismatch", "tp-size"),
    ("PD decode DCP requires an MLA or hybrid-MLA KV pool.", "pd_decode_dcp_unsupported", "dcp-size"),
    ("PD decode DCP currently requires prefill attention CP=1, got 2.", "pd_decode_dcp_unsupported",
     "attn-cp-size"),
]  # fmt: skip


@pytest.mark.parametrize(("said", "kind", "fix"), RAISED)
def test_parse_log_names_each_handshake_refusal(tmp_path: Path, said: str, kind: str, fix: str) -> None:
    text = re.sub(
        r"^RuntimeError: Page size mismatch.*$",
        lambda _: f"RuntimeError: {said}",
        REAL_DECODE_LOG.read_text(encoding="utf-8"),
        flags=re.M,
    )
    (tmp_path / "decode.log").write_text(text, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["parse-log", str(tmp_path / "decode.log"), "--json"], out)
    assert isinstance(out.stdout, io.StringIO)
    doc = json.loads(out.stdout.getvalue())
    assert code == 0 and doc["failure"]["kind"] == kind, doc["failure"]
    assert fix in doc["fix"], doc["fix"]


# Mooncake's own refusals before its first RDMA write (srt/disaggregation/mooncake/conn.py:1306-1324, :2315)
MOONCAKE = [
    ("--enable-unified-memory does not support different prefill / decode attention TP sizes (prefill=4, "
     "decode=8): the whole-envelope state cannot be TP-resliced.", "pd_unified_memory_tp_mismatch",
     "tp-size"),
    ("PD KV layout mismatch on the whole-envelope path: prefill has 1 KV region(s) with item_lens=[4096], "
     "decode has 1 with item_len=2048. With --enable-unified-memory both sides must enable it and use the "
     "same page size and model spec.", "pd_unified_memory_layout_mismatch", "page-size"),
    ("Prefill/Decode Mamba slot size mismatch (src=1024, dst=2048). Configure matching persistent state "
     "layouts on both peers.", "pd_mamba_slot_mismatch", "mamba-ssm-dtype"),
]  # fmt: skip


@pytest.mark.parametrize(("said", "kind", "fix"), MOONCAKE)
@pytest.mark.parametrize(
    "shape",
    ["RuntimeError: {}", "[2026-12-06 10:00:00 TP0] RuntimeError: {}",
     "RuntimeError: Transfer thread failed because of {} Prefill instance with bootstrap_port=8998 is dead."],
)  # fmt: skip
def test_mooncakes_own_refusals_are_kinds_of_their_own_however_logged(said: str, kind: str, fix: str,
                                                                      shape: str) -> None:  # fmt: skip
    """The raise itself, the same under a rank's logger prefix, and as the prefill's transfer thread dies
    of it (conn.py:2878-2884): each names the kind and a fix; the same text inside a prompt names none."""
    from agent.sglang.logs.fixes import fix_for
    from agent.sglang.logs.summary import SummaryBuilder

    builder = SummaryBuilder()
    builder.feed(shape.format(said))
    failure = builder.summary().failure
    assert failure is not None and failure.failure_kind == kind, failure
    assert fix in (fix_for(kind, failure.line) or "")
    quoted = SummaryBuilder()
    quoted.feed(f"[2026-12-06 10:00:00] Receive: obj=GenerateReqInput(text='why {said}')")
    assert quoted.summary().failure is None
