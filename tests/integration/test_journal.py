"""The journal port against the test host's journald (read from its journal folder)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agent.host.systemd import Systemd
from agent.host.watch.journal import Journal, JournalLine, stop_when
from tests.integration.testunits import CHATTY, installed
from tests.testhost import TestHost

pytestmark = pytest.mark.integration


@pytest.fixture
def systemd(testhost: TestHost) -> Iterator[Systemd]:
    with Systemd(testhost.bus_address) as bus:
        yield bus


@pytest.fixture
def journal(testhost: TestHost) -> Journal:
    return Journal(directory=testhost.journal_dir)


def _collect(lines: Iterator[JournalLine | None], count: int) -> list[tuple[float, JournalLine]]:
    started = time.monotonic()
    got = []
    for line in lines:
        if line is not None:
            got.append((time.monotonic() - started, line))
            if len(got) >= count:
                break
    return got


def test_follow_yields_only_the_new_start(testhost: TestHost, systemd: Systemd, journal: Journal) -> None:
    with installed(testhost, systemd, "dctl-journal.service", CHATTY) as unit:
        systemd.start(unit, timeout=10)
        old = systemd.unit_state(unit).invocation_id
        time.sleep(0.2)  # let the old start log a few lines
        cursor = journal.cursor()
        systemd.restart(unit, timeout=10)
        new = systemd.unit_state(unit).invocation_id
        follow = journal.follow(unit, cursor, new, deadline_s=time.monotonic() + 5)
        got = _collect(follow, 10)
        everything = [ln for ln in journal.follow(unit, cursor, None, time.monotonic() + 0.3) if ln]
    messages = [line.message for _, line in got]
    assert messages[0] == f"started {new}"  # the very first line of the start is not lost
    assert all(m.endswith(new) for m in messages) and {line.invocation_id for _, line in got} == {new}
    assert got[0][0] < 0.5
    # Without the invocation filter the old process's last words do come through after the cursor.
    assert f"old-bye {old}" in [line.message for line in everything]


def test_follow_ticks_while_silent_and_ends_at_deadline(
    testhost: TestHost, systemd: Systemd, journal: Journal
) -> None:
    with installed(testhost, systemd, "dctl-quiet.service", "/bin/sleep 1000") as unit:
        systemd.start(unit, timeout=10)
        invocation = systemd.unit_state(unit).invocation_id
        started = time.monotonic()
        items = list(journal.follow(unit, journal.cursor(), invocation, started + 0.5))
        elapsed = time.monotonic() - started
    assert elapsed < 0.7
    assert items and all(item is None for item in items) and len(items) >= 5


def test_stop_when_ends_a_follow_early(testhost: TestHost, systemd: Systemd, journal: Journal) -> None:
    with installed(testhost, systemd, "dctl-stop.service", CHATTY) as unit:
        systemd.start(unit, timeout=10)
        invocation = systemd.unit_state(unit).invocation_id
        seen: list[JournalLine] = []
        lines = journal.follow(unit, None, invocation, time.monotonic() + 10)
        started = time.monotonic()
        for line in stop_when(lambda: len(seen) >= 3, lines):
            seen.append(line)
        elapsed = time.monotonic() - started
    assert len(seen) == 3 and elapsed < 2


def test_non_utf8_message_is_decoded_with_replacement(
    testhost: TestHost, systemd: Systemd, journal: Journal
) -> None:
    exec_start = "/bin/sh -c 'printf \"pool \\\\377 end\\\\n\"; sleep 1000'"
    with installed(testhost, systemd, "dctl-bytes.service", exec_start) as unit:
        systemd.start(unit, timeout=10)
        invocation = systemd.unit_state(unit).invocation_id
        got = _collect(journal.follow(unit, None, invocation, time.monotonic() + 5), 1)
    assert got[0][1].message == "pool \ufffd end"


def test_last_invocation_lines_are_from_the_latest_start(
    testhost: TestHost, systemd: Systemd, journal: Journal
) -> None:
    with installed(testhost, systemd, "dctl-last.service", CHATTY) as unit:
        systemd.start(unit, timeout=10)
        systemd.restart(unit, timeout=10)
        latest = systemd.unit_state(unit).invocation_id
        time.sleep(0.3)
        lines = journal.last_invocation_lines(unit, max_lines=3)
    assert lines == [f"started {latest}", f"tick {latest}", f"tick {latest}"]
    assert journal.last_invocation_lines("dctl-never-ran.service") == []


def test_unusable_cursor_falls_back_to_the_restart_time(
    testhost: TestHost, systemd: Systemd, journal: Journal
) -> None:
    with installed(testhost, systemd, "dctl-cursor.service", CHATTY) as unit:
        since_us = time.time_ns() // 1000
        systemd.start(unit, timeout=10)
        invocation = systemd.unit_state(unit).invocation_id
        lines = journal.follow(unit, "s=gone", None, time.monotonic() + 5, since_us=since_us)
        got = _collect(lines, 2)
    assert [line.message for _, line in got] == [f"started {invocation}", f"tick {invocation}"]


def test_a_line_over_4096_bytes_comes_through(testhost: TestHost, systemd: Systemd, journal: Journal) -> None:
    """Real SGLang 0.5.23 logs its settings as one `server_args={...}` line of ~15 KB (mem_fraction_static
    among them); `journalctl -o json` gives null for a field over 4096 bytes unless --all."""
    long = "server_args={" + ", ".join(f"k{i}: {i}" for i in range(900)) + ", mem_fraction_static: 0.716}"
    assert len(long) > 8000
    exec_start = f"/bin/sh -c 'echo \"{long}\"; sleep 30'"
    with installed(testhost, systemd, "dctl-long.service", exec_start) as unit:
        cursor = journal.cursor()
        systemd.start(unit, timeout=10)
        new = systemd.unit_state(unit).invocation_id
        got = _collect(journal.follow(unit, cursor, new, deadline_s=time.monotonic() + 10), 1)
        assert [line.message for _, line in got] == [long]
        assert journal.last_invocation_lines(unit) == [long]
