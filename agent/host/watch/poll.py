"""Poll a condition with a bound: the router's changes and a group's signals both come in the background."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.2


def wait_until(
    done: Callable[[], bool], timeout_s: float,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> bool:  # fmt: skip
    """Poll done() until it holds or timeout_s passes: whether it held."""
    deadline = clock() + timeout_s
    while not done():
        if clock() >= deadline:
            return False
        sleep(POLL_S)
    return True
