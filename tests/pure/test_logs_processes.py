"""A journal names each of SGLang's processes by its own PID: the main one (server_args, HTTP) and the
scheduler and detokenizer it spawns. One server's processes are one start; two servers' are two."""

from __future__ import annotations

import re
from pathlib import Path

from agent.sglang.logs import events as ev
from agent.sglang.logs.starts import evidence, split

# The unit's whole journal (`journalctl -u sglang.service -o short-iso`) on the real server on this kind of
# machine's CPU: a start stopped by systemd (main PID 73, children 218/219...), then a start whose scheduler
# (PID 826, a child of 728) was killed with SIGKILL. Captured verbatim from the real tier.
REAL = Path(__file__).resolve().parents[1] / "data" / "sglang-real-cpu-journal.log"
_PREFIX = re.compile(r"^(\S+ \S+ )(\w+)\[\d+\]: ")


def test_a_servers_child_processes_are_its_start_not_starts_of_their_own() -> None:
    lines = REAL.read_text(encoding="utf-8").splitlines()
    pids = {m[0] for line in lines for m in [re.search(r"python\[\d+\]", line)] if m}
    assert len(pids) >= 4  # two mains and their children: the case
    starts = split(lines, "sglang.service")
    assert [(s.outcome, s.summary.failure and s.summary.failure.failure_kind) for s in starts] == [
        ("ready", None),
        ("failed", ev.RANK_DIED),
    ]
    assert all(s.summary.kv_tokens == 16384 for s in starts)
    assert evidence(starts) is starts[-1]


def test_one_servers_journal_cuts_the_same_with_or_without_its_pids() -> None:
    """The PIDs only tell servers apart: one server's journal read with them is read as without them."""
    lines = REAL.read_text(encoding="utf-8").splitlines()
    anonymous = [_PREFIX.sub(r"\1\2: ", line) for line in lines]
    with_pids, without = split(lines, "sglang.service"), split(anonymous, "sglang.service")
    assert [(s.first_line, s.outcome, s.summary) for s in with_pids] == [
        (s.first_line, s.outcome, s.summary) for s in without
    ]


def _renamed(lines: list[str], pids: dict[str, str]) -> list[str]:
    return [re.sub(r"python\[(\d+)\]", lambda m: f"python[{pids.get(m[1], m[1])}]", line) for line in lines]


def test_two_servers_with_children_interleaved_are_two_starts() -> None:
    """Two servers of one host started one after the other (a PD pair's two units), then logging together:
    each one's children join it, by the server_args line that came last before a child's first line. (Two
    mains that both log server_args before either's children appear cannot be told apart by a journal.)"""
    lines = REAL.read_text(encoding="utf-8").splitlines()
    second = next(i for i, line in enumerate(lines) if "python[728]" in line) - 1  # systemd's Started
    a = [line for line in lines[second:] if "systemd[" not in line]
    b = _renamed(a, {"728": "1728", "826": "1826", "827": "1827"})
    b = [line.replace("16384", "8192") for line in b]
    child = next(i for i, line in enumerate(a) if "python[826]" in line) + 1
    # b starts once a's scheduler is up; then the two go line by line
    mixed = a[:child] + b[:child] + [x for pair in zip(a[child:], b[child:], strict=True) for x in pair]
    starts = split(mixed)
    assert sorted(s.summary.kv_tokens or 0 for s in starts) == [8192, 16384], [s.summary for s in starts]
