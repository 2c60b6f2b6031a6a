"""A log split into the starts it holds before anything is read from it, and the start that is the evidence.

A journal (`journalctl -u sglang.service -b`) or a pasted file often holds several starts: a failed try and
the one after it, or a restart. Their lines read as one would mix one start's fraction and failure with
another's pool. So the text is cut first, and each start is summarised alone. What opens a start, in the
order one launch logs them (decoration taken off first, agent/sglang/logs/decor.py):

0. journalctl's `-- Boot <id> --` (or `-- Reboot --`) between boots;
1. systemd's own `Starting <unit>...` / `Started <unit>.` of SGLang's own service: a `*.service` whose name
   says sglang (the inventory's unit name when the caller knows it), never the weight-cache daemon's, a PD
   router's (<unit>-router.service, agent/pd/units.py), a session's scope or another unit type
   (`journalctl -b` without `-u` starts other units mid-start: `Started session-5.scope - Session 5 of User
   sglang.`); an older systemd's description-only line counts when it says SGLang and is no session's. A
   `Started` once the start's HTTP server is up is the same start's (Type=notify after readiness, an
   ExecStartPost= that waits on /v1/models during warmup) unless it failed or stopped; before that
   (Type=simple) it opens the next start;
2. a pasted launch command (`python -m sglang.launch_server ...`, `sglang serve ...`);
3. the main process's `server_args=` line (0.5.23 a dict, earlier `ServerArgs(...)`), once per launch
   (srt/entrypoints/engine.py): every rank's lines after it, interleaved, are that one start's.

A mark opens a new start when the current one already logged a start's line, or a mark of the same step or
a later one (the launch command then its server_args line are one start); a pasted command, only after a
launch line of the current start (a paste's excerpts come in any order). Without any mark, a rank that loads
its weights again after its start ended (ready or stopped) is a new start; after a failure, only a rank that
loads its target weights again (its memory back, or a begin with no end before it): the other ranks' lines
that trail a failure (TP0 loading the draft after TP3 died) stay the failed start's.

systemd's and the kernel's lines about the service's end (agent/sglang/logs/system.py: an OOM kill, the main
process's exit, a stop) are read as the start's, of the server whose unit or PID they name.

The evidence is the latest complete start (ready, or failed: it ran to its end), else the last start; or the
one a person names by its number (parse-log lists them). Latest by SGLang's own timestamps where every
candidate logged one (rotated files pasted newest first, `cat sglang.log sglang.log.1`), else in the log's
order; a start that failed without logging any memory figure (NCCL init, before its weights) says nothing
about memory and is passed over for a complete one that did.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agent.sglang.logs import events as ev
from agent.sglang.logs import system
from agent.sglang.logs.decor import Line, split_lines, undecorated
from agent.sglang.logs.lines import parse_line
from agent.sglang.logs.summary import StartFigures, StartSummary, SummaryBuilder

BOOT, UNIT, COMMAND, ARGS = range(4)
_BOOT = re.compile(r"-- (?:Boot [0-9a-f]+|Reboot) --$")
_UNIT = re.compile(r"(Starting|Started) (\S+)")
_UNIT_NAME = re.compile(r"[\w@:.\\-]+\.(?:service|scope|slice|socket|timer|mount|target|path|swap|device)$")
_NOT_SGLANG = re.compile(r"weight[-_ ]?cache|\bsession\b|\buser\b|\brouter\b", re.IGNORECASE)
_RELOAD_GB = 1.0  # a rank's memory back by more than this after its weights: a new process loads them
_MARKS = {"command": COMMAND, "server_args": ARGS}
# SGLang's own prefix (utils configure_logger: `[%(asctime)s...]`): when a start's first line was written
_LOGGED_AT = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")


@dataclass(frozen=True)
class LoggedStart:
    """One start of a log: its number (1 = the first in the log), where it begins, its lines without
    decoration, and what it said."""

    number: int
    first_line: int  # the log's line (1-based) where the start begins
    lines: tuple[str, ...]
    summary: StartSummary
    graph_mem_gb: float | None = None  # the CUDA-graph memory one rank logged (most over ranks)

    @property
    def outcome(self) -> str:
        """failed (before it was ready or after: summary.ready says which), ready, stopped (asked to stop
        before it was ready) or cut (the log ends mid-start)."""
        s = self.summary
        if s.failure is not None:
            return "failed"
        if s.ready:
            return "ready"
        return "stopped" if s.stopped else "cut"

    @property
    def complete(self) -> bool:
        """It ran to its end: ready, or failed."""
        return self.outcome in ("ready", "failed")

    @property
    def logged_at(self) -> str | None:
        """SGLang's timestamp of the start's first line that has one (sortable: ISO date and time)."""
        return next((m[1] for line in self.lines if (m := _LOGGED_AT.match(line))), None)

    @property
    def measured(self) -> bool:
        """It logged its pool, or the memory before and after its weights: what a plan reads."""
        f = self.summary.to_dict()
        post = f.get("avail_mem_before_pool_gb") or f.get("avail_mem_after_weights_gb")
        return bool(
            f.get("kv_tokens")
            or f.get("max_total_num_tokens")
            or (f.get("avail_mem_before_weights_gb") and post)
        )

    def figures(self) -> StartFigures:
        """The summary's figures, with the CUDA-graph memory the planner credits per request."""
        figures = self.summary.to_dict()
        if self.graph_mem_gb is not None:
            figures["graph_mem_gb"] = self.graph_mem_gb
        return figures


@dataclass
class _Cut:
    first_line: int
    lines: list[str] = field(default_factory=list)
    builder: SummaryBuilder = field(default_factory=SummaryBuilder)
    mark: int = -1  # the latest launch step seen
    content: bool = False  # a line of the start itself (not a mark)
    sglang: bool = False  # any SGLang event at all
    serving: bool = False  # its HTTP server is up (warmup, then ready): systemd's Started is this start's
    loaded: set[str | None] = field(default_factory=set)  # ranks that began loading weights
    after: dict[str | None, float | None] = field(
        default_factory=dict
    )  # a rank's avail after weights, None mid-load
    graphs: dict[str | None, float] = field(default_factory=dict)

    def ended(self) -> bool:
        return self.builder.phase in ("ready", "failed") or self.builder.summary().stopped

    def dead(self) -> bool:
        """It failed or was stopped: a Type=simple restart's `Started` is the next start's."""
        return self.builder.phase == "failed" or self.builder.summary().stopped

    def opens_with(self, mark: int, line: Line, events: Sequence[ev.LogEvent]) -> bool:
        """Whether this line opens a new start after this one."""
        if mark >= 0:
            if mark == UNIT and line.text.startswith("Started") and self.serving and not self.dead():
                return False  # Type=notify after readiness, ExecStartPost= during warmup: the same start
            if mark == COMMAND:  # a person's paste: excerpts come in any order, a second launch opens one
                return self.mark >= COMMAND
            return self.content or self.mark >= mark
        if not self.ended():
            return False
        if self.builder.phase == "failed":  # other ranks go on after one died: only a target reload opens one
            return any(isinstance(e, ev.WeightsBegin) and self.reloads(e) for e in events)
        return any(isinstance(e, ev.WeightsBegin) and e.rank in self.loaded for e in events)

    def reloads(self, begin: ev.WeightsBegin) -> bool:
        """A rank loads its target weights again: it began before, and either never ended that load (one
        process loads one thing at a time) or has its memory back (a draft loads from what the target
        left)."""
        if begin.rank not in self.loaded:
            return False
        after = self.after.get(begin.rank)
        return after is None or begin.avail_gb > after + _RELOAD_GB

    def add(self, text: str, mark: int, events: list[ev.LogEvent], own: bool = True) -> None:
        """`own`: SGLang's line (not systemd's or the kernel's about its end: those alone make no start)."""
        self.lines.append(text)
        self.mark = max(self.mark, mark)
        self.sglang = self.sglang or (own and bool(events))
        self.content = self.content or any(
            not (isinstance(e, ev.ServerArgs) and e.source in _MARKS) for e in events
        )
        for e in self.builder.feed_events(events):
            if isinstance(e, (ev.UvicornRunning, ev.Ready)):
                self.serving = True
            if isinstance(e, ev.WeightsBegin):
                self.loaded.add(e.rank)
                self.after[e.rank] = None
            elif isinstance(e, ev.WeightsEnd):
                self.after[e.rank] = e.avail_gb
            elif isinstance(e, ev.GraphEnd) and e.usage_gb is not None:
                self.graphs[e.rank] = self.graphs.get(e.rank, 0.0) + e.usage_gb

    def done(self, number: int) -> LoggedStart:
        graphs = round(max(self.graphs.values()), 3) if self.graphs else None
        return LoggedStart(number, self.first_line, tuple(self.lines), self.builder.summary(), graphs)


def _sglang_unit(text: str, unit: str | None) -> bool:
    """systemd's Starting/Started line is of SGLang's own service (deployctl's: sglang.service, "SGLang
    server"): the unit named, else a *.service saying sglang that is not the weight-cache daemon."""
    m = _UNIT.match(text)
    if m is None:
        return False
    name = m[2].rstrip(".")
    if _UNIT_NAME.match(name):
        return _sglang_name(name, unit)
    # an older systemd logs the description alone
    return "sglang" in text.lower() and not _NOT_SGLANG.search(text)


def _sglang_name(name: str, unit: str | None) -> bool:
    """A unit's name is SGLang's own service's: the one named, else a *.service saying sglang."""
    if unit is not None:
        return name == unit
    return name.endswith(".service") and "sglang" in name.lower() and not _NOT_SGLANG.search(name)


def _system_events(line: Line, unit: str | None, pids: set[str]) -> list[ev.LogEvent]:
    """systemd's and the kernel's lines about SGLang's service ending (agent/sglang/logs/system.py). The
    kernel's OOM kill counts when its PID is one of the log's processes, or is named as SGLang names its
    own (setproctitle "sglang::scheduler_TP0", managers/scheduler.py:6294), or the log names no PIDs and a
    python process was killed."""
    if line.ident in (None, "systemd"):
        found = system.unit_events(line.text, lambda name: _sglang_name(name, unit))
        if found:
            return found
    if line.ident not in (None, "kernel"):
        return []
    killed = system.killed_process(line.text)
    if killed is None:
        return []
    pid, comm = killed
    if pid in pids or comm.startswith("sglang::") or (not pids and comm.startswith("python")):
        return system.kernel_events(line.text)
    return []


def _mark(line: Line, events: Sequence[ev.LogEvent], unit: str | None = None) -> int:
    """The launch step this line marks, -1 for none."""
    if events:
        return max((_MARKS.get(e.source, -1) for e in events if isinstance(e, ev.ServerArgs)), default=-1)
    text = line.text
    if text[:3] == "-- " and _BOOT.match(text):
        return BOOT
    if text[:5] == "Start" and line.ident in (None, "systemd") and _sglang_unit(text, unit):
        return UNIT
    return -1


def split(raw: Iterable[str], unit: str | None = None) -> list[LoggedStart]:
    """The starts of a log, in its order; lines before the first mark belong to the first start, and a
    stretch with no SGLang line in it (a journal's header, systemd's lines between starts) is none. `unit`:
    the service's own name (sglang.service) when the caller knows it."""
    if unit is not None and not unit.endswith(".service"):
        unit += ".service"
    lines = [
        undecorated(p)
        for item in raw
        for p in (split_lines(item) if ("\n" in item or "\r" in item) else (item,))
    ]
    numbered = list(enumerate(lines, 1))
    sources = {line.source for line in lines if line.source is not None}
    pids = {m[2] for s in sources if (m := _JOURNAL_PID.match(s))}
    owner = _owners(lines) if len(sources) > 1 else []
    servers = set(owner) - {None}
    if len(servers) < 2:
        cuts = _cuts(numbered, unit, pids)
    else:  # several servers in one log: a start is one server's lines (the others' never mix into it)
        mine = [[(n, ln) for n, ln in numbered if owner[n - 1] == s] for s in servers]
        cuts = [c for lines_of in mine for c in _cuts(lines_of, unit, pids)]
        cuts.sort(key=lambda c: c.first_line)
    kept = [c for c in cuts if c.sglang]
    return [c.done(i) for i, c in enumerate(kept, 1)]


def _owners(lines: Sequence[Line]) -> list[str | None]:
    """Each line's server: a line with no process (systemd's, a header) belongs to the server before it, a
    systemd Start line (and one before any process) to the server after it; but systemd's line about a unit
    whose Start line came before is that unit's server's, and the kernel's OOM kill of a process that
    process's server's."""
    server = _servers(lines)
    by_pid = {m[2]: s for src, s in server.items() if src and (m := _JOURNAL_PID.match(src))}
    after: list[str | None] = [None] * len(lines)
    nxt: str | None = None
    for i in range(len(lines) - 1, -1, -1):
        nxt = server.get(lines[i].source) or nxt
        after[i] = nxt
    owner: list[str | None] = []
    units: dict[str, str | None] = {}  # a unit's server: the one its latest Start line went to
    prev: str | None = None
    for i, line in enumerate(lines):
        mine = server.get(line.source)
        opens = line.text[:5] == "Start" or line.text[:3] == "-- "
        said = mine or _named_server(line, units, by_pid)
        owner.append(said or (after[i] if opens or prev is None else prev))
        if opens and (name := _start_unit(line)):
            units[name] = owner[-1]
        prev = mine or prev
    return owner


def _start_unit(line: Line) -> str | None:
    """The unit a systemd Starting/Started line names."""
    m = _UNIT.match(line.text) if line.ident in (None, "systemd") else None
    return m[2].rstrip(".") if m else None


def _named_server(line: Line, units: dict[str, str | None], by_pid: dict[str, str]) -> str | None:
    """The server a process-less line names: systemd's about a unit started before, the kernel's kill."""
    if line.ident in (None, "systemd") and (name := system.unit_named(line.text)):
        return units.get(name)
    killed = system.killed_process(line.text) if line.ident in (None, "kernel") else None
    return by_pid.get(killed[0]) if killed else None


_JOURNAL_PID = re.compile(r"([^\[\s]+)\[(\d+)\]$")


def _servers(lines: Sequence[Line]) -> dict[str | None, str]:
    """Each process's server. SGLang runs as several processes (the main one logs server_args, then spawns
    its scheduler and detokenizer, srt/entrypoints/engine.py), and journald names each by its own PID: a PID
    that never logs server_args is a child of the server whose server_args line came last before its first
    line (of the same identifier), or, before any, of the log's earlier server. A compose service or a pod is
    one server with all its processes."""
    first: dict[str, int] = {}
    mains: list[tuple[int, str]] = []  # (line, PID) of each server_args line
    for i, line in enumerate(lines):
        if line.source is None:
            continue
        first.setdefault(line.source, i)
        if ("server_args=" in line.text or "ServerArgs(" in line.text) and any(
            isinstance(e, ev.ServerArgs) and e.source == "server_args" for e in parse_line(line.text)
        ):
            mains.append((i, line.source))
    main_pids = {pid for _, pid in mains}
    server: dict[str | None, str] = {}
    for source, at in first.items():
        m = _JOURNAL_PID.match(source)
        if m is None or source in main_pids:
            server[source] = source
            continue
        parents = [pid for i, pid in mains if i < at and pid.startswith(m[1] + "[")]
        server[source] = parents[-1] if parents else f"{m[1]}[]"
    return server


def _cuts(numbered: Iterable[tuple[int, Line]], unit: str | None, pids: set[str]) -> list[_Cut]:
    """One process's (or one log's) lines cut into starts; `pids`: the log's processes."""
    cuts: list[_Cut] = []
    numbered = list(numbered)
    current = _Cut(numbered[0][0] if numbered else 1)
    for number, line in numbered:
        events = parse_line(line.text)
        own = bool(events)
        events = events or _system_events(line, unit, pids)
        mark = _mark(line, events, unit)
        if not events and mark < 0:  # most lines: serving traffic, tracebacks' text
            current.lines.append(line.text)
            continue
        if current.opens_with(mark, line, events):
            cuts.append(current)
            current = _Cut(number)
        current.add(line.text, mark, events, own)
    cuts.append(current)
    return cuts


def evidence(starts: Sequence[LoggedStart], number: int | None = None) -> LoggedStart | None:
    """The start a plan reads: the one named (1-based; the caller checks the range), else the latest
    complete one (a failure that logged no memory passed over for one that did), else the last one; None for
    a log without a start."""
    if number is not None:
        return starts[number - 1]
    complete = [s for s in starts if s.complete]
    usable = [s for s in complete if s.summary.failure is None or s.measured] or complete
    return latest(usable) if usable else (starts[-1] if starts else None)


def latest(starts: Sequence[LoggedStart]) -> LoggedStart:
    """The latest by SGLang's timestamps where each has one, else the last in the log."""
    stamps = [s.logged_at for s in starts]
    if None in stamps:
        return starts[-1]
    return max(starts, key=lambda s: (s.logged_at or "", s.number))


def evidence_said(starts: Sequence[LoggedStart], start: LoggedStart) -> str:
    """Which start the evidence is, in the words parse-log and plan say it."""
    if not start.complete:
        return "the last one: none is complete"
    later = [s for s in starts if s.number > start.number and s.complete]
    if any(not s.measured for s in later):
        return "the latest complete one that logged its memory"
    return "the latest complete one by its timestamps" if later else "the last complete one"


class NoSuchStart(ValueError):
    """A start number the log does not hold."""


def chosen(starts: Sequence[LoggedStart], number: int | None) -> LoggedStart | None:
    """evidence(), with a number out of range refused in one line."""
    if number is not None and not 1 <= number <= len(starts):
        held = f"{len(starts)} start{'s' if len(starts) != 1 else ''}"
        raise NoSuchStart(f"there is no start {number}: the log holds {held}")
    return evidence(starts, number)


def plan_figures(starts: Sequence[LoggedStart], start: LoggedStart) -> StartFigures:
    """What a plan reads of a log: the evidence start's figures, and each other start that failed with its
    own figures (its fraction and failure never mixed with the evidence's): they bound the fraction."""
    figures = start.figures()
    failed = [s.figures() for s in starts if s is not start and s.summary.failure is not None]
    if failed:
        figures["other_failures"] = failed
    return figures
