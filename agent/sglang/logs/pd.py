"""A PD decode's parity failures: the prefill and the decode disagree on the page size or the KV dtype's text.

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
MISMATCHES = (
    (PAGE_SIZE, ev.PD_PAGE_SIZE_MISMATCH),
    (KV_DTYPE, ev.PD_KV_DTYPE_MISMATCH),
    (CHECKSUM, ev.PD_KV_CHECKSUM_MISMATCH),
)
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
    r"prefill server has (page_size|kv_cache_dtype)=(\S+?),? but decode server has \1=(\S+?)\.?(?: |$)"
)
_FLAG = {"page_size": "--page-size", "kv_cache_dtype": "--kv-cache-dtype"}


def fix(line: str) -> str:
    """What to change after a PD parity failure, in one line, with the two values SGLang printed."""
    m = _VALUES.search(line)
    if m is None:
        return (
            "the prefill and the decode disagree on --page-size or --kv-cache-dtype: set it once in "
            "[sglang.flags] for every role, then restart the decode"
        )
    flag, prefill, decode = _FLAG[m[1]], m[2], m[3]
    spelled = " (the same spelling: SGLang compares the text)" if m[1] == "kv_cache_dtype" else ""
    return (
        f"the prefill runs {flag} {prefill}, the decode {flag} {decode}: give every role the same "
        f"{flag}{spelled}, once in [sglang.flags], then restart the decode"
    )
