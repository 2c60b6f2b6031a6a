"""Fake systemd, journal and probe for pure tests of the host transaction: each fault is one fast test.

The fake systemd loads the unit from the first folder of its search path that has it (as systemd does:
/etc before /run before /usr/local/lib before /usr/lib), an empty file is masked, and every start of it
logs what `Script` says for that unit text. The journal shows each start's lines by invocation.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.host.change.transaction import ProbePort, Transaction
from agent.host.events import EventLog
from agent.host.systemd import JobResult, UnitState
from agent.host.watch.loadcheck import LoadResult, LoadSpec, Reply, verdict
from agent.host.watch.probe import ProbeError, SmokeResult
from agent.protocol.requests import Request, Smoke, Timeouts
from agent.sglang.flags import parse_unit_flags

UNIT = "sglang.service"
TXN = "20261203T120000Z-abcdef"


def unit_text(context: int, extra: str = "") -> str:
    argv = f"/opt/sglang/bin/python -m sglang.launch_server --model-path /m --context-length {context}"
    return f"[Unit]\nDescription=SGLang\n\n[Service]\nExecStart={argv}\n{extra}"


def kv_line(tokens: int) -> str:
    return f"[2026-12-03 12:00:00 TP0] KV Cache is allocated. #tokens: {tokens}, KV size: 13.75 GB"


READY_LINE = "[2026-12-03 12:00:05] The server is fired up and ready to roll!"
OOM_LINE = "[2026-12-03 12:00:03 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@dataclass
class Script:
    """What a start of each unit text logs: its pool (then ready), or a crash; the rest hang silent."""

    pools: dict[str, int] = field(default_factory=dict)  # a unit's --context-length -> its KV pool
    crash: set[str] = field(default_factory=set)  # contexts whose start dies of an OOM

    def lines(self, text: str) -> tuple[list[str], bool]:
        """The start's journal lines, and whether its process stays up."""
        context = next((w for w in text.split() if w.isdigit()), "")
        if context in self.crash:
            return [OOM_LINE], False
        if context in self.pools:
            # a node rank >= 1 of a multi-node service never logs "fired up" (it serves no HTTP)
            follower = "--node-rank 0" not in text and "--node-rank" in text
            return [kv_line(self.pools[context]), *([] if follower else [READY_LINE])], True
        return [], True


@dataclass(frozen=True)
class Line:
    message: str
    cursor: str
    invocation_id: str


class FakeSystemd:
    """One service unit; counts the calls that matter (restarts, stops, reloads)."""

    def __init__(self, search: list[Path], script: Script) -> None:
        self.search, self.script = search, script
        self.active, self.sub, self.invocation, self.n_restarts = "inactive", "dead", "", 0
        self.lines: dict[str, list[str]] = {}  # invocation -> what it logged so far
        self.later: dict[str, list[str]] = {}  # invocation -> what it logs once someone follows it
        self.restarts = self.stops = self.reloads = self.starts = 0
        self.left: list[int] = []  # processes a stop leaves behind (a failed final kill)
        self.killed: list[int] = []  # signals sent with kill()
        self.fragment, self.loaded = "", ""
        self.drop_ins: tuple[str, ...] = ()  # drop-in files systemd reports for the unit
        self._ids = itertools.count(1)
        self.entered_us = 0
        self.on_poll: Callable[[], None] | None = None  # what happens on the host while deployctl looks
        self._load()

    # the port ----------------------------------------------------------------------------------
    def daemon_reload(self) -> None:
        self.reloads += 1
        self._load()

    def unit_state(self, unit: str) -> UnitState:
        if self.on_poll is not None:
            self.on_poll()
        masked = self.fragment != "" and self.loaded == ""
        return UnitState(
            unit, "masked" if masked else ("loaded" if self.fragment else "not-found"),
            self.active, self.sub, self.invocation, self._drop_ins() != self.loaded_drop_ins,
            self.n_restarts, 0, 0,
            self.fragment, self.entered_us, self.drop_ins,
        )  # fmt: skip

    def restart(self, unit: str, timeout: float) -> JobResult:
        self.restarts += 1
        if not self.fragment or not self.loaded:  # not found, or masked: systemd refuses the job
            self.active, self.sub = "inactive", "dead"
            return JobResult(unit, "0", "failed")
        self.boot(*self.script.lines(self.loaded))
        return JobResult(unit, str(self.restarts), "done")

    def start(self, unit: str, timeout: float) -> JobResult:
        self.starts += 1
        if self.active == "active":  # systemd: starting a running unit is a no-op
            return JobResult(unit, str(self.starts), "done")
        if not self.fragment or not self.loaded:
            return JobResult(unit, "0", "failed")
        self.boot(*self.script.lines(self.loaded))
        return JobResult(unit, str(self.starts), "done")

    def leftovers(self, unit: str) -> list[int]:
        return list(self.left)

    def kill(self, unit: str, signal: int) -> None:
        self.killed.append(signal)
        self.left = []

    def stop(self, unit: str, timeout: float) -> JobResult:
        self.stops += 1
        self.active, self.sub = "inactive", "dead"
        return JobResult(unit, "0", "done")

    # the test's hands ---------------------------------------------------------------------------
    def boot(self, lines: list[str], up: bool = True, later: tuple[str, ...] = ()) -> None:
        """A start (systemd's own, or the restart's): it has logged `lines`, and logs `later` next."""
        self.invocation = f"{next(self._ids):032x}"
        self.lines[self.invocation] = list(lines)
        self.later[self.invocation] = list(later)
        self.active, self.sub = ("active", "running") if up else ("failed", "failed")
        self.entered_us = time.time_ns() // 1000

    def _load(self) -> None:
        found = next((d / UNIT for d in self.search if (d / UNIT).is_file()), None)
        self.fragment = str(found) if found else ""
        self.loaded = found.read_text() if found else ""
        self.loaded_drop_ins = self._drop_ins()

    def _drop_ins(self) -> dict[str, str]:
        """The unit's drop-in files now (NeedDaemonReload= once they differ from those last loaded); the
        unit's own file is judged by `loaded` alone, as the tests always had it."""
        return {
            str(f): f.read_text()
            for d in self.search
            if (d / f"{UNIT}.d").is_dir()
            for f in (d / f"{UNIT}.d").glob("*.conf")
        }


class FakeJournal:
    def __init__(self, systemd: FakeSystemd) -> None:
        self.systemd = systemd
        self.followed: list[str] = []  # the invocations whose lines someone followed, in order

    def cursor(self) -> str | None:
        return None

    def follow(
        self, unit: str, after_cursor: str | None, invocation_id: str | None, deadline_s: float
    ) -> Iterator[Line | None]:
        inv = invocation_id or self.systemd.invocation
        self.followed.append(inv)
        shown = self.systemd.lines.setdefault(inv, [])
        shown += self.systemd.later.pop(inv, [])  # followed: the start goes on
        for n, message in enumerate(list(shown)):
            yield Line(message, f"{inv}:{n}", inv)
        # then silence, polled as the real journal does (None): the watch decides on its timeouts (the
        # tests set them to nothing) or on what it polls
        yield None

    def invocation_tail(self, unit: str, invocation_id: str, max_lines: int) -> list[str]:
        return list(self.systemd.lines.get(invocation_id, [])[-max_lines:])

    def last_invocation_lines(self, unit: str, max_lines: int) -> list[str]:
        with_lines = [inv for inv, lines in self.systemd.lines.items() if lines]
        return list(self.systemd.lines[with_lines[-1]][:max_lines]) if with_lines else []


@dataclass
class FakeProbe:
    """The HTTP checks: healthy unless `down`; the smoke test answers `answer`."""

    down: bool = False
    answer: str = "dog"
    asked: list[str] = field(default_factory=list)
    unit: Callable[[], str] | None = None
    load_fails: str | None = None
    load_spec: LoadSpec | None = None
    served: int | None = None  # its sglang:num_requests_total; None: no /metrics counter
    info: dict[str, Any] = field(default_factory=dict)  # /server_info's scheduler fields besides the flags

    def __call__(self, host: str, port: int, api_key: str | None) -> ProbePort:
        return self

    def wait_ready(self, timeout_s: float) -> None:
        self.asked.append("health")
        if self.down:
            raise ProbeError("http://127.0.0.1:30000/health did not answer")

    def smoke(self, smoke: Smoke) -> SmokeResult:
        self.asked.append("smoke")
        return SmokeResult(smoke.prompt_tokens, 0.1, self.answer, smoke.expect in self.answer)

    def requests_served(self) -> int | None:
        return self.served

    def load(self, smoke: Smoke, spec: LoadSpec) -> LoadResult:
        """The load check: every reply fine, unless `load_fails` names what went wrong."""
        self.asked.append("load")
        self.load_spec = spec
        ok = Reply(200, None, spec.chunk_tokens, 32, 0.5, 1.5)
        long = Reply(200, None, spec.long_tokens, 32, 2.0, 5.1)
        if self.load_fails:
            long = Reply(500, self.load_fails)
        return verdict([ok] * spec.concurrent, long, 5.2)

    def server_info(self) -> dict[str, Any]:
        """What the server resolved: the flags of the unit systemd runs (`unit` gives its text)."""
        self.asked.append("server_info")
        flags = parse_unit_flags(self.unit()) if self.unit else {}
        return {**{name.replace("-", "_"): value for name, value in flags.items()}, **self.info}


@dataclass
class Host:
    """A host's folders under tmp_path, its fakes, and a request against them."""

    root: Path
    script: Script
    probe: FakeProbe = field(default_factory=FakeProbe)
    router: Callable[[str], Any] | None = None  # the model gateway's API, where a test gives one
    role_switch: Callable[[str, int, str | None], Any] | None = None  # SGLang's POST /pd_role_switch

    def __post_init__(self) -> None:
        self.control = self.root / "etc/systemd/system.control"
        self.etc = self.root / "etc/systemd/system"
        self.run = self.root / "run/systemd/system"
        self.usr_local = self.root / "usr/local/lib/systemd/system"
        self.usr = self.root / "usr/lib/systemd/system"
        search = [self.control, self.etc, self.run, self.usr_local, self.usr]
        for d in search:
            d.mkdir(parents=True, exist_ok=True)
        self.systemd = FakeSystemd(search, self.script)
        self.journal = FakeJournal(self.systemd)
        self.probe.unit = lambda: self.systemd.loaded

    def request(self, context: int, **kw: object) -> Request:
        quick = Timeouts(weights_s=0, pool_s=0, ready_s=0, no_progress_s=0)
        req = Request(
            verb="apply", unit_dir=str(self.etc), state_dir=str(self.root / "state"),
            secrets_dir=str(self.root / "secrets"), unit_text=unit_text(context), target_context=context,
            smoke=Smoke(enabled=False), timeouts=quick, prewarm=False,
        )  # fmt: skip
        return replace(req, **kw)  # type: ignore[arg-type]

    def put(self, where: Path, text: str) -> None:
        """A unit put there by hand or by a package, and loaded."""
        (where / UNIT).write_text(text)
        self.systemd.daemon_reload()

    def install(self, where: Path, text: str) -> None:
        """A unit put there by hand or by a package, loaded and started by systemd (not by deployctl)."""
        self.put(where, text)
        self.systemd.boot(*self.script.lines(text))

    def transaction(self, req: Request, txn: str = TXN) -> Transaction:
        log = EventLog(txn, Path(req.state_dir) / "txn" / txn / "events.jsonl")
        t = Transaction(req, txn, self.systemd, self.journal, log)
        t.probe = self.probe
        if self.router is not None:
            t.router = self.router
        if self.role_switch is not None:
            t.ports.role_switch = self.role_switch
        t.ports.run_dir = self.root / "run/deployctl"  # the boot guard's marker (a tmpfs on a host)
        return t
