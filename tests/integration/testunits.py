"""Tiny units the systemd and journal tests install on the test host."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agent.host.systemd import Systemd
from tests.testhost import TestHost

# Logs its invocation id on start, every 50 ms, and once more when told to stop, so a test can tell
# the lines of one start from the next. `sleep & wait` lets the TERM trap run at once.
CHATTY = (
    '/bin/sh -c \'trap "echo old-bye $INVOCATION_ID; exit 0" TERM; echo started $INVOCATION_ID; '
    "while :; do echo tick $INVOCATION_ID; sleep 0.05 & wait $!; done'"
)


def unit_text(exec_start: str, kind: str = "simple") -> bytes:
    """A service unit without start limit (tests restart units quickly)."""
    return f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nType={kind}\nExecStart={exec_start}\n".encode()


@contextmanager
def installed(host: TestHost, systemd: Systemd, name: str, exec_start: str) -> Iterator[str]:
    """Install a unit, reload, hand over its name; stop and remove it afterwards."""
    path = f"/etc/systemd/system/{name}"
    host.put(path, unit_text(exec_start))
    systemd.daemon_reload()
    try:
        yield name
    finally:
        systemd.stop(name, timeout=10)
        systemd.reset_failed(name)
        (host.root / path.lstrip("/")).unlink()
        systemd.daemon_reload()
