"""The one-line fix of a failure kind whose SGLang line says what to change (None for the others)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.sglang.logs import events as ev
from agent.sglang.logs import hicache, pd


def fix_for(kind: str | None, line: str, host_ranks: Sequence[int] | None = None) -> str | None:
    """`host_ranks`: SGLang's ranks per host and the host pools pinned there, where the log said."""
    if kind == ev.HOST_MEMORY_SHORT:  # HiCache's host pool refused: SGLang's own figures
        return hicache.fix(line, *(host_ranks or ()))
    if kind in (ev.PD_PAGE_SIZE_MISMATCH, ev.PD_KV_DTYPE_MISMATCH):
        return pd.fix(line)
    return None
