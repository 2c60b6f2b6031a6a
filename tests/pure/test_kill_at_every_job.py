"""The agent killed at every unit job of every class of change, before the job and after it: the next
agent's recovery ends with every unit on its old text and running, or on its new text and verified; never
"healthy" with an inactive engine (host/change/jobs.py, the record's job list).

The fake systemd here runs two units, the engine and its weight-cache daemon, with BindsTo='s two effects,
read off the engine's loaded unit as systemd's are: a stop of the daemon stops an engine whose loaded unit
is its client, a start of a client engine starts the daemon first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.host.change.transaction import Result
from agent.host.systemd import JobResult, UnitState
from agent.protocol.events import Outcome
from tests.pure.txnfakes import UNIT, FakeSystemd, Host, Script, unit_text

DAEMON = "sglang-weight-cache.service"
OLD, NEW, CRASH = 100_000, 200_000, 300_000
# A start's timestamp is the precise clock; a file's mtime the kernel's coarse one, up to a tick behind: a
# file written right after a start could look older than it. The fake dates each start a little earlier
# (a file written within that margin before a start then looks newer: the safe side, a restart).
EARLIER_US = 50_000


class Killed(BaseException):
    """The agent dies here: no `except Exception` of the agent catches it."""


class TwoUnits(FakeSystemd):
    """The engine (FakeSystemd's one unit) and the daemon; each job call may be the one the agent dies at."""

    def __init__(self, search: list[Path], script: Script) -> None:
        super().__init__(search, script)
        self.etc = search[1]
        self.d_active, self.d_invocation, self.d_text, self.d_entered = "inactive", "", "", 0
        self.running = ""  # the engine text its running start came from
        self.kill_at: tuple[int, str] | None = None  # (n-th job call, "before" | "after")
        self.calls: list[str] = []

    # BindsTo=: the engine goes with the daemon, and a client's start pulls the daemon in
    def _client(self) -> bool:
        return f"BindsTo={DAEMON}" in self.loaded

    def boot(self, lines: list[str], up: bool = True, later: tuple[str, ...] = ()) -> None:
        super().boot(lines, up, later)
        self.running = self.loaded
        self.entered_us -= EARLIER_US

    def _daemon_up(self) -> None:
        text = (self.etc / DAEMON).read_text() if (self.etc / DAEMON).is_file() else ""
        self.d_active, self.d_text = ("active", text) if text else ("inactive", "")
        self.d_invocation = f"d{time.monotonic_ns():031x}"
        self.d_entered = time.time_ns() // 1000 - EARLIER_US

    def _daemon_down(self) -> None:
        """A stop of the daemon reaches the engine through the engine's LOADED unit (after daemon-reload,
        whatever its running start was started from): systemd knows no other dependency."""
        self.d_active = "inactive"
        if self.active == "active" and self._client():
            self.active, self.sub = "inactive", "dead"

    def _job(self, what: str, unit: str, act: object) -> JobResult:
        self.calls.append(f"{what} {unit}")
        n, at = len(self.calls), self.kill_at
        if at == (n, "before"):
            raise Killed
        result = act()
        if at == (n, "after"):
            raise Killed
        assert isinstance(result, JobResult)
        return result

    def unit_state(self, unit: str) -> UnitState:
        if unit != DAEMON:
            return super().unit_state(unit)
        loaded = "loaded" if (self.etc / DAEMON).is_file() else "not-found"
        return UnitState(unit, loaded, self.d_active, "running", self.d_invocation, False, 0, 0, 0,
                         str(self.etc / DAEMON), self.d_entered)  # fmt: skip

    def restart(self, unit: str, timeout: float) -> JobResult:
        if unit == DAEMON:
            return self._job("restart", unit, lambda: self._d(restart=True))
        return self._job("restart", unit, lambda: self._engine(super(TwoUnits, self).restart, unit, timeout))

    def start(self, unit: str, timeout: float) -> JobResult:
        if unit == DAEMON:
            return self._job("start", unit, lambda: self._d(restart=False))
        return self._job("start", unit, lambda: self._engine(super(TwoUnits, self).start, unit, timeout))

    def stop(self, unit: str, timeout: float) -> JobResult:
        if unit == DAEMON:
            return self._job("stop", unit, self._d_stop)
        return self._job("stop", unit, lambda: super(TwoUnits, self).stop(unit, timeout))

    def _d(self, restart: bool) -> JobResult:
        if restart or self.d_active != "active":
            self._daemon_down()
            self._daemon_up()
        return JobResult(DAEMON, "1", "done" if self.d_active == "active" else "failed")

    def _d_stop(self) -> JobResult:
        self._daemon_down()
        return JobResult(DAEMON, "0", "done")

    def _engine(self, call: object, unit: str, timeout: float) -> JobResult:
        if self._client() and self.d_active != "active":
            self._daemon_up()
        assert callable(call)
        result = call(unit, timeout)
        assert isinstance(result, JobResult)
        return result


def client(context: int) -> str:
    text = unit_text(context).replace("--context-length", "--weight-cache-mode client --context-length")
    return text.replace("[Unit]\n", f"[Unit]\nBindsTo={DAEMON}\nAfter={DAEMON}\n")


def daemon(description: str = "cache") -> str:
    argv = "/opt/sglang/bin/python -m sglang.srt.weight_cache.daemon --model-path /m"
    return f"[Unit]\nDescription={description}\n\n[Service]\nExecStart={argv}\n"


@dataclass(frozen=True)
class Class:
    """One class of change: the units before, and what the apply sends."""

    name: str
    old: str
    daemon_running: bool  # the daemon runs before the change (started by deployctl, its text known)
    new: str
    sent: str | None  # the daemon unit the apply sends


def classes(context: int) -> list[Class]:
    return [
        Class("engine-only", unit_text(OLD), False, unit_text(context), None),
        Class("keep", client(OLD), True, client(context), daemon()),
        Class("restart", client(OLD), True, client(context), daemon("cache, new")),
        Class("start", unit_text(OLD), False, client(context), daemon()),
        Class("stop", client(OLD), True, unit_text(context), None),
    ]


CASES = [(c, verdict) for verdict, ctx in (("pass", NEW), ("reject", CRASH)) for c in classes(ctx)]


def rig(root: Path, c: Class) -> tuple[Host, TwoUnits]:
    host = Host(root, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
    units = TwoUnits(host.systemd.search, host.script)
    host.systemd = units
    host.journal.systemd = units
    host.probe.unit = lambda: units.loaded
    (host.etc / DAEMON).write_text(daemon())
    host.install(host.etc, c.old)
    if c.daemon_running:
        units._daemon_up()
        t = host.transaction(host.request(OLD))
        t.daemon._save(DAEMON, units.d_invocation, daemon())  # deployctl started it with this text
    return host, units


def apply(host: Host, c: Class, context: int) -> Result:
    return host.transaction(host.request(context, unit_text=c.new, daemon_text=c.sent)).apply()


def check_end(host: Host, units: TwoUnits, c: Class, old_daemon: str, said: Result) -> None:
    on_disk = (host.etc / UNIT).read_text()
    assert units.active == "active", f"the engine is {units.active}: {said.outcome} {said.message}"
    assert units.running == on_disk, "the engine runs another text than its file"
    if on_disk == c.old:
        assert said.outcome in (Outcome.ROLLED_BACK, Outcome.UP_TO_DATE), said.message
        want_daemon = old_daemon if f"BindsTo={DAEMON}" in c.old else None
    else:
        assert on_disk == c.new and said.outcome is Outcome.APPLIED, said.message  # verified, kept
        want_daemon = (c.sent or old_daemon) if f"BindsTo={DAEMON}" in c.new else None
    if want_daemon is None:
        running_before = c.daemon_running and f"BindsTo={DAEMON}" not in c.old
        assert units.d_active != "active" or running_before, "a daemon serves no engine"
    else:
        assert units.d_active == "active", "the client engine's daemon is down"
        assert units.d_text == want_daemon == (host.etc / DAEMON).read_text(), "the daemon runs another text"
    assert not (Path(host.request(OLD).state_dir) / "units" / UNIT / "pending.json").exists()


def jobs_of(root: Path, c: Class, context: int) -> int:
    host, units = rig(root, c)
    apply(host, c, context)
    return len(units.calls)


@pytest.mark.parametrize(("c", "verdict"), CASES, ids=[f"{c.name}-{v}" for c, v in CASES])
def test_an_agent_killed_at_any_job_recovers_to_old_and_running_or_new_and_verified(
    tmp_path: Path, c: Class, verdict: str
) -> None:
    context = NEW if verdict == "pass" else CRASH
    n = jobs_of(tmp_path / "count", c, context)
    assert n >= 1
    for k in range(1, n + 1):
        for where in ("before", "after"):
            host, units = rig(tmp_path / f"{k}-{where}", c)
            units.kill_at = (k, where)
            with pytest.raises(Killed):
                apply(host, c, context)
            units.kill_at = None
            said = host.transaction(host.request(OLD)).recover_only()
            try:
                check_end(host, units, c, daemon(), said)
            except AssertionError as exc:
                raise AssertionError(f"killed {where} job {k} ({units.calls[k - 1]}): {exc}") from None


def test_the_daemon_classes_run_their_jobs_in_order(tmp_path: Path) -> None:
    """What the matrix above kills: the daemon's three jobs, its stop, the engine's one."""
    want = {
        "engine-only": [f"restart {UNIT}"],
        "keep": [f"restart {UNIT}"],
        "restart": [f"stop {UNIT}", f"restart {DAEMON}", f"start {UNIT}"],
        "start": [f"stop {UNIT}", f"start {DAEMON}", f"start {UNIT}"],
        "stop": [f"stop {UNIT}", f"stop {DAEMON}", f"start {UNIT}"],
    }
    for c in classes(NEW):
        host, units = rig(tmp_path / c.name, c)
        assert apply(host, c, NEW).outcome is Outcome.APPLIED
        assert units.calls == want[c.name], c.name


# -- a group node: stop, "go", start, vote, the group's word (as far as the pure fakes reach) -------------
GROUP_CASES = ["commit", "abort"]


@pytest.mark.parametrize("word", GROUP_CASES)
def test_a_group_node_killed_at_any_job_never_ends_healthy_and_stopped(tmp_path: Path, word: str) -> None:
    """A node killed at each of its jobs, then recovered by its change's own coordinator (which sends the
    go-back once every rank stopped): the new unit only where the group committed, the old one running
    or, in doubt, stopped with its old file; never "rolled back, healthy" with an inactive server."""
    from dataclasses import replace

    from agent.host.change.folder import write_request
    from agent.host.state import StateDir
    from agent.protocol.groupmachine import Decision
    from tests.pure.test_group_node import coordinator, node_request, node_unit

    decision = Decision.COMMIT if word == "commit" else Decision.ABORT

    def run(root: Path, kill_at: tuple[int, str] | None) -> tuple[Host, TwoUnits, Result | None]:
        host, units = rig(root, Class("node", node_unit(OLD, 1), False, node_unit(NEW, 1), None))
        req = node_request(host, NEW, 1)
        write_request(StateDir(req.state_dir), req, "20261203T120000Z-abcdef")
        txn = host.transaction(req)
        signals = coordinator(txn, decision)
        units.kill_at = kill_at
        try:
            return host, units, txn.apply()
        except Killed:
            units.kill_at = None
            signals.for_rollback().go()  # the coordinator, still there, sees every rank stopped
            again = replace(host.request(OLD), verb="recover", died="20261203T120000Z-abcdef")
            return host, units, host.transaction(again, txn="20261203T120100Z-recover").recover_only()

    host, units, _ = run(tmp_path / "count", None)
    n = len(units.calls)
    assert n >= 2
    for k in range(1, n + 1):
        for where in ("before", "after"):
            host, units, said = run(tmp_path / f"{k}-{where}", (k, where))
            assert said is not None
            on_disk = (host.etc / UNIT).read_text()
            at = f"killed {where} job {k} ({units.calls[k - 1]}): {said.outcome} {said.message}"
            if on_disk == node_unit(NEW, 1):
                assert said.outcome is Outcome.APPLIED and units.active == "active", at
                assert decision is Decision.COMMIT, at
            else:
                assert on_disk == node_unit(OLD, 1), at
                if units.active == "active":
                    assert units.running == on_disk and said.outcome is Outcome.ROLLED_BACK, at
                else:  # stopped: never called healthy
                    assert said.outcome is Outcome.ROLLBACK_FAILED and "doubt" in said.message, at
