"""Restarts to reach a 200k pool by hand on the sim host: edit the unit, restart, read the pool, repeat."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tests.bench.hostlog import starts_since
from tests.simhost import SimHost

UNIT_PATH = "/etc/systemd/system/sglang.service"
TARGET = 200_000


@dataclass(frozen=True)
class Try:
    flags: dict[str, str]
    pool: int | None
    result: str  # "ready" or the failure kind


def restart_with(sim: SimHost, base_unit: str, flags: dict[str, str], timeout_s: float = 60) -> Try:
    """What an operator does: change flags in the unit, restart, and read the new start's pool."""
    text = base_unit
    for name, value in flags.items():
        text, n = re.subn(rf"--{name} \S+", f"--{name} {value}", text)
        assert n == 1, f"--{name} is not in the unit"
    sim.host.put(UNIT_PATH, text.encode())
    t0 = time.time()
    sim.host.ssh(["sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = [s for s in starts_since(sim, t0) if s.launched]
        if new:
            summary = new[0].summary()
            if summary.ready:
                return Try(flags, summary.kv_tokens, "ready")
            if new[0].crash_at is not None:
                kind = summary.failure.failure_kind if summary.failure else "died"
                return Try(flags, summary.kv_tokens, kind)
        time.sleep(0.3)
    return Try(flags, None, "timeout")


def count(sim: SimHost, base_unit: str, tries: Iterable[dict[str, str]]) -> tuple[int | None, list[Try]]:
    """Restarts until a ready start has a pool >= 200k; None if the path never gets there."""
    done: list[Try] = []
    for flags in tries:
        t = restart_with(sim, base_unit, flags)
        done.append(t)
        if t.result == "ready" and (t.pool or 0) >= TARGET:
            return len(done), done
        if t.result != "ready":
            return None, done
    return None, done


def seed_path() -> list[dict[str, str]]:
    """The engineer's tries on ct200, in order."""
    return [
        {"context-length": "200000"},
        {"context-length": "200000", "mem-fraction-static": "0.92", "max-running-requests": "8"},
        {"context-length": "200000", "mem-fraction-static": "0.94", "max-running-requests": "8"},
    ]


def advice_path(start: float = 0.85, step: float = 0.01, stop: float = 0.99) -> Iterator[dict[str, str]]:
    """SGLang's hint followed literally: set the context, then +0.01 of the fraction per restart."""
    fraction = start
    while fraction <= stop + 1e-9:
        yield {"context-length": "200000", "mem-fraction-static": f"{fraction:.2f}"}
        fraction += step
