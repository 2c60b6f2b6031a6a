"""The page size a unit runs with once SGLang 0.5.23 has resolved its attention backends: a backend that
supports only some page sizes changes --page-size itself (srt/arg_groups/overrides.py
`_mla_backend_page_constraints`), and the decode's handshake compares the resolved values
(srt/disaggregation/common/conn.py "Page size mismatch"). A backend SGLang picks by itself is not known
offline: only the backends the flags name are applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Forcing:
    backend: str
    allowed: tuple[int, ...]  # the page sizes it keeps; any other becomes `to`
    to: int
    prefill_too: bool  # --prefill-attention-backend counts as well as --attention-backend/--decode-...
    draft_too: bool = False  # so does --speculative-draft-attention-backend (overrides.py:1174-1187)


# overrides.py _mla_backend_page_constraints, in its order: each one acts on the value the one before left
FORCING = (
    Forcing("flashmla", (), 64, False),
    Forcing("trtllm_mla", (32, 64), 64, False),
    Forcing("cutedsl_mla", (32, 64), 64, True),
    Forcing("trtllm_mha", (16, 32, 64, 128), 64, True, draft_too=True),
    Forcing("hpc_ops", (64,), 64, True),
)


BACKEND_NAMES = (
    "attention-backend",
    "decode-attention-backend",
    "prefill-attention-backend",
    "speculative-draft-attention-backend",
)


def _backends(flags: Mapping[str, object]) -> tuple[str | None, ...]:
    """(attention, decode, prefill, draft) backends as SGLang resolves them: a prefill backend equal to the
    decode one becomes the attention backend too (overrides.py _attention_backend_default)."""
    attention, decode, prefill, draft = (
        str(flags[n]) if flags.get(n) not in (None, False) else None for n in BACKEND_NAMES
    )
    if attention is None and prefill is not None and prefill == decode:
        attention = prefill
    return attention, decode, prefill, draft


def forced(flags: Mapping[str, object], page: int | None) -> tuple[int | None, str | None]:
    """The page size after the named backends' constraints, and the backend that changed it (None: none
    did)."""
    attention, decode, prefill, draft = _backends(flags)
    why = None
    for rule in FORCING:
        named = (
            rule.backend in (attention, decode)
            or (rule.prefill_too and prefill == rule.backend)
            or (rule.draft_too and draft == rule.backend)
        )
        if named and page not in rule.allowed:
            page, why = rule.to, rule.backend
    return page, why


def _page(flags: Mapping[str, object]) -> int | None:
    raw = flags.get("page-size")
    return int(str(raw)) if raw not in (None, False) and str(raw).lstrip("-").isdigit() else None


def _effective(flags: Mapping[str, object]) -> tuple[str, str | None]:
    """The page size the unit runs with, as text (the flag's, "unset" where none is set and no backend
    forces one, or the value a named backend forces), and the backend that forced it."""
    raw = flags.get("page-size")
    after, why = forced(flags, _page(flags))
    if why is None:
        return ("unset" if raw in (None, False) else str(raw)), None
    return str(after), why


def effective_page_size(flags: Mapping[str, object]) -> str:
    return _effective(flags)[0]


def said_page_size(flags: Mapping[str, object]) -> str:
    """The effective page size in words: with the backend that forces it."""
    page, why = _effective(flags)
    return f"{page} (its attention backend {why} forces {page})" if why else page
