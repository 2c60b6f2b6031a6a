"""A PD decode's parity failures: the prefill and the decode disagree on the page size, the KV dtype's text,
the KV layout, DSpark's layout, the attention TP size or a decode's DCP.

SGLang 0.5.23 checks both when the decode first asks the prefill's bootstrap server for its parallel info,
that is at the first routed request, not at start: the decode's scheduler raises and the whole decode server
exits (srt/disaggregation/common/conn.py:1320-1334; measured on CPU, shared/sglang/PD-AND-HICACHE-ON-CPU.md).
The dtype check compares the flags' text, so `auto` against `bf16` fails although both pools are bfloat16.
Each is a failure kind of its own with a fix read off SGLang's line. So is the KV checksum's mismatch (a
decode with --disaggregation-enable-kv-checksum): not a start's death, a request the decode dropped.
"""

from __future__ import annotations

import re

from agent.sglang.logs import events as ev

# The lines' openings, matched by failures.classify after the exception's class name ("RuntimeError: ").
PAGE_SIZE = r"Page size mismatch: prefill server has page_size="
KV_DTYPE = r"KV cache dtype mismatch: prefill server has kv_cache_dtype="
# srt/disaggregation/decode.py:3331-3350 (_verify_kv_checksums): this rank's line, or a peer rank's
CHECKSUM = r"KV checksum mismatch (?:on a peer rank )?req="
# The handshake's other raises, in its order (srt/disaggregation/common/conn.py:1336-1418)
KV_LAYOUT = r"KV layout mismatch: prefill server has kv_layout="  # :1348-1357
DSPARK_LAYOUT = r"DeepSeek-V4\.1 DSpark PD layout mismatch"  # :1359-1374
ATTN_TP = (
    r"MiniMax sparse PD requires matching attention TP sizes",  # :1336-1345
    r"DeepSeek-V4\.1 DSpark PD requires the same TP size",  # :1382-1389
    r"PD Disaggregation does NOT support different attention TP sizes with MXFP8 KV cache",  # :1391-1408
)
DECODE_DCP = (
    r"PD decode DCP requires an MLA or hybrid-MLA KV pool",  # :1410-1414
    r"PD decode DCP currently requires prefill attention CP=1",  # :1415-1418
)
# Mooncake's own, raised on the prefill's transfer thread before its first RDMA write; the thread's death
# wraps it as "Transfer thread failed because of <it>. Prefill instance ... is dead." (conn.py:2878-2884)
_WRAPPED = r"(?:Transfer thread failed because of )?"
UNIFIED_TP = (
    _WRAPPED + r"--enable-unified-memory does not support different prefill / decode attention TP"
)  # :1306
UNIFIED_LAYOUT = _WRAPPED + r"PD KV layout mismatch on the whole-envelope path"  # :1319-1324
MAMBA_SLOT = _WRAPPED + r"Prefill/Decode Mamba slot size mismatch"  # :2315-2319
MISMATCHES = (
    (PAGE_SIZE, ev.PD_PAGE_SIZE_MISMATCH),
    (KV_DTYPE, ev.PD_KV_DTYPE_MISMATCH),
    (KV_LAYOUT, ev.PD_KV_LAYOUT_MISMATCH),
    (DSPARK_LAYOUT, ev.PD_DSPARK_LAYOUT_MISMATCH),
    *((said, ev.PD_ATTN_TP_MISMATCH) for said in ATTN_TP),
    *((said, ev.PD_DECODE_DCP_UNSUPPORTED) for said in DECODE_DCP),
    (UNIFIED_TP, ev.PD_UNIFIED_MEMORY_TP_MISMATCH),
    (UNIFIED_LAYOUT, ev.PD_UNIFIED_MEMORY_LAYOUT_MISMATCH),
    (MAMBA_SLOT, ev.PD_MAMBA_SLOT_MISMATCH),
    (CHECKSUM, ev.PD_KV_CHECKSUM_MISMATCH),
)
# The fixes of the kinds whose line names no values to read
FIXES = {
    ev.PD_DSPARK_LAYOUT_MISMATCH: (
        "the roles' DeepSeek-V4.1 DSpark layouts differ: enable DSpark on every role with the same block "
        "size and target/draft KV layout, and run one SGLang release on both (upgrade them together)"
    ),
    ev.PD_ATTN_TP_MISMATCH: (
        "the prefill and the decode run different attention TP sizes, which this model's KV (MiniMax sparse, "
        "DSpark, an MXFP8 KV cache) cannot be resliced across: give every role the same tp-size (and "
        "dp-size) in its [pd] flags, then apply the service again"
    ),
    ev.PD_UNIFIED_MEMORY_TP_MISMATCH: (
        "with --enable-unified-memory each request's state travels as one envelope Mooncake cannot reslice "
        "across attention TP sizes: give every role the same tp-size (and dp-size) in its [pd] flags, or "
        "drop enable-unified-memory from every role, then apply the service again"
    ),
    ev.PD_UNIFIED_MEMORY_LAYOUT_MISMATCH: (
        "the roles register different KV envelopes: with --enable-unified-memory on either role, set "
        "enable-unified-memory and page-size once in [sglang.flags] (every role the same), run one model "
        "and SGLang release on both, then apply the service again"
    ),
    ev.PD_MAMBA_SLOT_MISMATCH: (
        "the prefill's and the decode's Mamba state slots differ in size: every role must run the same "
        "model and --mamba-ssm-dtype (set it once in [sglang.flags], not in a role's flags) on one SGLang "
        "release, then apply the service again"
    ),
    ev.PD_DECODE_DCP_UNSUPPORTED: (
        "the decode's --dcp-size > 1 needs an MLA (or hybrid-MLA) KV pool and prefills at attention CP 1: "
        "drop dcp-size from the decode's [pd] flags, or the prefills' attn-cp-size, then apply again"
    ),
}
# A mismatch is the KV the decode received not being what the prefill digested: the code calls it hardware
# or transport, not the request (_handle_kv_checksum_mismatch); or the roles lay the pages out differently
# (page size, KV dtype, TP, model, release). SGLang aborts that request with a 500 and serves on.
CHECKSUM_FIX = (
    "the KV this decode received is not what the prefill sent (SGLang aborted that request with a 500 and "
    "serves on): check the transfer path, the RDMA device each role uses ([pd] ib_device, UCX_NET_DEVICES) "
    "and its link; and that every role runs the same model, SGLang release, --page-size, --kv-cache-dtype "
    "and layout; then apply the service again"
)
_VALUES = re.compile(
    r"prefill server has (page_size|kv_cache_dtype|kv_layout)=(\S+?),? "
    r"but decode server has \1=(\S+?)\.?(?: |$)"
)
_FLAG = {"page_size": "--page-size", "kv_cache_dtype": "--kv-cache-dtype"}
# DSV4's KV layout follows its attention backend and an environment variable (conn.py:1356-1357)
LAYOUT_FIX = (
    "give every role the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT, once in [sglang.flags] and "
    "[unit] environment (not a role's own), then apply the service again"
)


def fix(line: str) -> str:
    """What to change after a PD parity failure, in one line, with the two values SGLang printed."""
    m = _VALUES.search(line)
    if m is None:
        return (
            "the prefill and the decode disagree on --page-size or --kv-cache-dtype: set it once in "
            "[sglang.flags] for every role, then restart the decode"
        )
    if m[1] == "kv_layout":
        return f"the prefill lays its KV out as {m[2]}, the decode as {m[3]}: {LAYOUT_FIX}"
    flag, prefill, decode = _FLAG[m[1]], m[2], m[3]
    spelled = " (the same spelling: SGLang compares the text)" if m[1] == "kv_cache_dtype" else ""
    return (
        f"the prefill runs {flag} {prefill}, the decode {flag} {decode}: give every role the same "
        f"{flag}{spelled}, once in [sglang.flags], then restart the decode"
    )
