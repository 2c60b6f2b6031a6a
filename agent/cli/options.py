"""Parse command-line values into types where bad values cannot exist; errors name the flag."""

from __future__ import annotations

import re

MAX_CONTEXT = 10_000_000
MAX_REQUESTS = 1_000_000  # far above any GPU's batch; a bigger number is a typo, not a plan

_CONTEXT = re.compile(r"(?P<num>[0-9]+)(?P<unit>k|K|Ki|M|Mi)?")
_UNITS = {None: 1, "k": 1000, "K": 1000, "Ki": 1024, "M": 1000**2, "Mi": 1024**2}


class ArgError(ValueError):
    """A bad value; its text is the one-line message (the flag is named in it)."""


def parse_context(text: str, flag: str = "--context") -> int:
    """'200000', '200k'/'200K' (x1000), '128Ki' (x1024), '1M' -> tokens; anything else is refused."""
    m = _CONTEXT.fullmatch(text.strip())
    if m is None:
        raise ArgError(f"{flag} {text!r} is not a token count (try 200k, 128Ki or 131072)")
    tokens = int(m["num"]) * _UNITS[m["unit"]]
    if tokens <= 0:
        raise ArgError(f"{flag} {text!r} must be a positive token count")
    if tokens > MAX_CONTEXT:
        raise ArgError(f"{flag} {text!r} is more than {MAX_CONTEXT:,} tokens")
    return tokens


def parse_fraction(text: str, flag: str = "--mem-fraction-static") -> float:
    """A number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise ArgError(f"{flag} {text!r} is not a number") from None
    if not 0.0 < value < 1.0:  # also refuses nan and inf
        raise ArgError(f"{flag} {text!r} must be strictly between 0 and 1")
    return value


def parse_positive_int(text: str, flag: str) -> int:
    """A positive integer written in decimal digits."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) <= 0:
        raise ArgError(f"{flag} {text!r} must be a positive integer")
    return int(text)


def parse_request_count(text: str, flag: str = "--max-running-requests") -> int:
    """A positive number of requests, at most MAX_REQUESTS."""
    value = parse_positive_int(text, flag)
    if value > MAX_REQUESTS:
        raise ArgError(f"{flag} {text!r} is more than {MAX_REQUESTS:,} requests")
    return value
