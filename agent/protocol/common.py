"""The wire's shared words: its version, its one error, and the names and texts both sides check.

Stdlib only, like the whole of agent/protocol/: it runs on the GPU server from the agent bundle.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from secrets import token_hex

VERSION = 1
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}\.service")
BACKUP_NAME = re.compile(rf"(?P<unit>{UNIT_NAME.pattern})\.bak\.(?P<ts>\d{{8}}T\d{{6}}Z)(?:-\d+)?")
TXN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")
# The one definition of a control character (C0, DEL and C1) and of a lone surrogate (how Python reads
# bytes that are not UTF-8): no name, path, flag or unit line may carry one, and none reaches a terminal.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SURROGATE = re.compile("[\ud800-\udfff]")
# A router's or a worker's address: scheme, host (name, IPv4 or [IPv6]), port, path; nothing else.
HTTP_URL = re.compile(
    r"https?://(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::\d{1,5})?(?:/[A-Za-z0-9._~/%-]*)?"
)
UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def find_control(text: str, allow: str = "") -> str | None:
    """The first control character in text that is not in `allow`, or None."""
    return next((c for c in CONTROL.findall(text) if c not in allow), None)


def new_txn_id() -> str:
    """A transaction id (TXN_ID); the laptop may choose it, so that a re-attach knows its own outcome."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + token_hex(3)


def unit_sha256(text: str) -> str:
    """The identity of a unit's content, on both sides of the wire."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


# Secret SGLang flags reach the server as this systemd credential, read with SGLang's --config.
SECRET_CREDENTIAL = "sglang-secrets.yaml"


def secret_path(directory: str, unit: str, kind: str) -> str:
    """Where a unit's secrets of one kind ("env" or "flags.yaml") live on the host."""
    return f"{directory.rstrip('/')}/{unit}.{kind}"


class ProtocolError(ValueError):
    """A request the agent refuses; the text is one line."""
