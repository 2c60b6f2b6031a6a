"""Fault injection on the simulated ct200: hit a transaction at a named step, then check what is left.

Step targeting: a small watcher runs inside the test host and polls the transaction's events file (the
runner fsyncs every step event) every 0.2 ms; the moment the step's event appears it stops the runner
with SIGSTOP, so the runner cannot go on to the next step while the fault is injected from outside
(SIGKILL of the transient unit, a host restart, or the client's connection cut before SIGCONT). The
watcher reports the last event the runner had logged when it stopped: `exact` says it was the step
asked for. No hook in the agent is needed; the simulated server's start-up time keeps the slow steps
(watch, verify_old) wide, and the fast file-level ones (backup, write, reload) are hit by the poll.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from agent.protocol.common import unit_sha256
from agent.sglang.flags import parse_unit_flags
from tests.simhost import SimHost
from tests.testhost import TestHost


class Hosted(Protocol):
    """What the watcher and the kill need: a test host (a SimHost, or any other host's holder)."""

    @property
    def host(self) -> TestHost: ...


RESTART_DROPIN = "/etc/systemd/system/sglang.service.d/restart.conf"  # Restart=always, for crash loops

UNIT = "/etc/systemd/system/sglang.service"
STATE = "/var/lib/deployctl"
# Point the unit's last transaction at argv[1], as the agent does before it starts a runner.
SET_LAST_TXN = f"""
import json, sys
with open("{STATE}/units/sglang.service/last_txn.json", "w") as f:
    json.dump({{"txn": sys.argv[1]}}, f)
"""
WATCHER_PATH = "/root/deployctl-fault-watcher.py"
# Runs inside the test host (its python3, stdlib only). argv: step nth [record-phase [unit]].
WATCHER = r"""
import json, os, signal, sys, time
state = os.environ.get("DEPLOYCTL_WATCH_STATE", "/var/lib/deployctl")  # a pure test's own folder
root = f"{state}/txn"
step, nth = sys.argv[1], int(sys.argv[2])
phase = sys.argv[3] if len(sys.argv) > 3 else ""
unit = sys.argv[4] if len(sys.argv) > 4 else "sglang.service"
record = f"{state}/units/{unit}/pending.json"
known = set(os.listdir(root)) if os.path.isdir(root) else set()
parent = os.getppid()
print("armed", os.getpid(), flush=True)

def events(txn):
    try:
        with open(f"{root}/{txn}/events.jsonl", "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [json.loads(x) for x in data[: data.rfind(b"\n") + 1].splitlines()]

def hit(txn):
    evs = events(txn)
    # the unit's own transaction: another unit of the host changing in the same group has one too
    if not any(e["stage"] == "lock" and e["message"] == f"locked {unit}" for e in evs):
        return None
    if phase:
        try:
            with open(record) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        if phase.startswith("done="):  # the record's unit jobs: listed, and this many done
            return evs if rec.get("jobs") and rec.get("done", 0) == int(phase[5:]) else None
        return evs if rec.get("phase") == phase else None
    seen = [e for e in evs if e["stage"] == step and e["kind"] != "outcome"]
    return evs if len(seen) >= nth else None

deadline = time.monotonic() + 120
while time.monotonic() < deadline and os.getppid() == parent:  # gone with its ssh session
    new = sorted(set(os.listdir(root)) - known) if os.path.isdir(root) else []
    for txn in reversed(new):  # newest first: the unit's own, not the last of the host's
        evs = hit(txn)
        if evs is None:
            continue
        pid = next((e["data"]["pid"] for e in evs if e["stage"] == "lock" and "pid" in e["data"]), None)
        if pid is None:
            continue
        os.kill(pid, signal.SIGSTOP)
        last = events(txn)[-1]["stage"]
        print(json.dumps({"txn": txn, "pid": pid, "last": last}), flush=True)
        sys.exit(0)
    time.sleep(0.0002)
print(json.dumps({"txn": None}), flush=True)
"""


@dataclass
class Hit:
    """Where the runner was stopped: its transaction, pid, and the last step it had logged."""

    txn: str
    pid: int
    last: str | None
    step: str

    @property
    def exact(self) -> bool:
        return self.last == self.step


class Watcher:
    """The in-host watcher for one step; arm it before starting the action."""

    def __init__(
        self, sim: Hosted, step: str, nth: int = 1, phase: str = "", unit: str = "sglang.service"
    ) -> None:
        sim.host.put(WATCHER_PATH, WATCHER.encode())
        self.step = phase or step
        argv = ["python3", WATCHER_PATH, step, str(nth), phase, unit]
        self.proc = subprocess.Popen(
            [*sim.host.ssh_argv(), shlex.join(argv)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().split()
        if first[:1] != ["armed"]:
            raise RuntimeError("fault watcher did not start")
        self.sim, self.remote_pid = sim, first[1]

    def wait(self, timeout: float = 90) -> Hit:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"the step {self.step!r} never came") from None
        data = json.loads(out.strip().splitlines()[-1])
        if not data.get("txn"):
            raise AssertionError(f"the step {self.step!r} never came")
        return Hit(data["txn"], int(data["pid"]), data.get("last"), self.step)

    def close(self) -> None:
        """Stop the watcher in the host too: a stale one would stop the next transaction's runner."""
        if self.proc.poll() is None:
            self.sim.host.ssh(["kill", self.remote_pid], timeout=30)
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sh(sim: Hosted, *argv: str, timeout: float = 60) -> str:
    """A command inside the test host; its stdout, or AssertionError with its stderr."""
    r = sim.host.ssh(list(argv), timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: rc {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r.stdout.decode(errors="replace")


def kill_runner(sim: Hosted, txn: str, timeout: float = 30) -> None:
    """SIGKILL the transaction's runner and wait until systemd has seen it die.

    `systemctl kill` returns once the signal is sent; until systemd reaps the process the transient
    unit still reads active, and the host (rightly) does not call a live runner's change orphaned.
    """
    unit = f"deployctl-{txn}.service"
    sh(sim, "systemctl", "kill", "--signal=SIGKILL", unit)
    deadline = time.monotonic() + timeout
    while True:
        r = sim.host.ssh(["systemctl", "is-active", unit], timeout=30)
        if r.stdout.decode().strip() not in ("active", "activating", "deactivating", "reloading"):
            return
        assert time.monotonic() < deadline, f"{unit} still running {timeout:.0f} s after SIGKILL"
        time.sleep(0.05)


def kill_followers(sim: SimHost, verb: str) -> None:
    """SIGKILL the agents that follow a transaction for a client (`agent-<sha>.pyz VERB`), by pid.

    `apply` runs in the agent's `session` (facts, then the apply), so that is the word to look for there.
    """
    r = sim.host.ssh(["pgrep", "-f", f"pyz( --sha256 [0-9a-f]+)? {verb}$"], timeout=30)
    for pid in r.stdout.decode().split():
        sim.host.ssh(["kill", "-KILL", pid], timeout=30)


def resume_runner(sim: SimHost, pid: int) -> None:
    sh(sim, "kill", "-CONT", str(pid))


def restart_host(sim: SimHost) -> None:
    """TestHost.restart(): a reboot that keeps the disk (/etc, /var) as a real one does."""
    sim.host.restart()
    assert (sim.host.root / "etc/systemd/system").is_dir(), "the restarted host's init is not systemd"


def unit_state(sim: SimHost) -> dict[str, str]:
    out = sh(sim, "systemctl", "show", "-p", "ActiveState,SubState,NRestarts", "sglang.service")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def backup_texts(sim: SimHost) -> list[str]:
    directory = sim.host.root / "etc/systemd/system"
    return [p.read_text(errors="surrogateescape") for p in sorted(directory.glob("sglang.service.bak.*"))]


def pending(sim: SimHost) -> bool:
    return (sim.host.root / STATE.lstrip("/") / "units/sglang.service/pending.json").exists()


def txn_events(sim: SimHost, txn: str) -> list[dict[str, object]]:
    path = sim.host.root / STATE.lstrip("/") / "txn" / txn / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def outcome_of(sim: SimHost, txn: str) -> str | None:
    ends = [e for e in txn_events(sim, txn) if e["kind"] == "outcome"]
    return str(ends[-1]["data"].get("outcome")) if ends else None  # type: ignore[union-attr]


def serving_flags(sim: SimHost, timeout: float = 60) -> dict[str, object]:
    """server_info of the running service, once it answers."""
    from tests.integration.conftest import server_info

    deadline = time.monotonic() + timeout
    while True:
        try:
            return server_info(sim)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def verified_problems(sim: SimHost, old: str, new: str | None = None) -> list[str]:
    """What keeps the host from a verified state with the old (or new) unit; [] when it is in one."""
    problems = []
    unit = sim.unit_text()
    if unit not in (old, new):
        problems.append(f"the unit is neither the old nor the new one (sha {unit_sha256(unit)[:12]})")
    if old != unit and old not in backup_texts(sim):
        problems.append("the old unit's content is lost (neither installed nor a backup)")
    state = unit_state(sim)
    if (state.get("ActiveState"), state.get("SubState")) != ("active", "running"):
        return [*problems, f"sglang.service is {state.get('ActiveState')}/{state.get('SubState')}"]
    if pending(sim):
        problems.append("a recovery record is still pending")
    leftovers = list((sim.host.root / "etc/systemd/system").glob(".sglang.service.deployctl-tmp.*"))
    if leftovers:
        problems.append(f"temporary files left: {[p.name for p in leftovers]}")
    try:
        info = serving_flags(sim, timeout=30)
    except OSError as exc:
        return [*problems, f"the server does not answer: {exc}"]
    flags = parse_unit_flags(unit)
    if int(str(info.get("context_length"))) != int(str(flags["context-length"])):
        problems.append(
            f"serving context {info.get('context_length')}, the unit says {flags['context-length']}"
        )
    if not info.get("max_total_num_tokens"):
        problems.append("no KV pool served")
    return problems


# Whether anyone holds a lock file's flock, read from /proc/locks: taking the lock to find out (`flock -n`)
# would itself make a starting runner's acquire fail.
_HELD = """
import os, sys
try:
    st = os.stat(sys.argv[1])
except FileNotFoundError:
    sys.exit(1)
dev = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
rows = [line.split() for line in open("/proc/locks")]
sys.exit(0 if any(r[1:2] == ["FLOCK"] and r[5:6] == [dev] for r in rows) else 1)
"""


def lock_held(sim: SimHost) -> bool:
    r = sim.host.ssh(["python3", "-c", _HELD, "/run/deployctl/sglang.service.lock"], timeout=30)
    return r.returncode == 0


def wait_idle(sim: SimHost, timeout: float = 90) -> None:
    """Until no transaction holds the unit's lock (a runner or a recovery is finishing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not lock_held(sim):
            return
        time.sleep(0.2)
    raise AssertionError("a transaction still holds the lock")


@contextmanager
def timeouts(sim: SimHost, **values: float) -> Iterator[None]:
    """The inventory's [timeouts] changed for a while (e.g. a hang detected in seconds)."""
    path = sim.units_dir / f"{sim.name}.toml"
    original = path.read_text()
    text = original
    for key, value in values.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    path.write_text(text)
    try:
        yield
    finally:
        path.write_text(original)


@contextmanager
def small_unit_dir(sim: SimHost, free_pages: int) -> Iterator[None]:
    """The unit directory on a full tmpfs (its content copied), with `free_pages` pages left free."""
    with small_dir(sim, "/etc/systemd/system", free_pages):
        yield


@contextmanager
def small_dir(sim: SimHost, directory: str, free_pages: int) -> Iterator[None]:
    """`directory` on a full tmpfs of its own (its content and mode copied), `free_pages` pages left free."""
    tmp = "/run/small" + directory.replace("/", "-")
    script = (
        f"set -e; mkdir -p {directory} {tmp}; mount -t tmpfs -o size=1m tmpfs {tmp}; "
        f"cp -a {directory}/. {tmp}/; mount --bind {tmp} {directory}; "
        f"dd if=/dev/zero of={directory}/.filler bs=4096 2>/dev/null || true; "
        f"truncate -s -{free_pages * 4096} {directory}/.filler; sync"
    )
    sh(sim, "sh", "-c", script)
    try:
        yield
    finally:
        sh(sim, "sh", "-c", f"umount {directory}; umount {tmp}; systemctl daemon-reload")


@contextmanager
def read_only_unit_dir(sim: SimHost) -> Iterator[None]:
    d = "/etc/systemd/system"
    sh(sim, "sh", "-c", f"mount --bind {d} {d} && mount -o remount,bind,ro {d}")
    try:
        yield
    finally:
        sh(sim, "umount", d)


def repair(sim: SimHost, old: str, new: str | None = None, timeout: float = 90) -> None:
    """Back to a healthy host after a case, whatever it left: no fault knobs, the old unit if need be."""
    from tests.integration.conftest import wait_pool

    sim.set_sim_env({})
    with contextlib.suppress(FileNotFoundError):
        (sim.host.root / RESTART_DROPIN.lstrip("/")).unlink()
    with contextlib.suppress(subprocess.SubprocessError, AssertionError):
        wait_idle(sim, timeout=timeout)
    if verified_problems(sim, old, new):
        sim.host.put("/etc/systemd/system/sglang.service", old.encode())
        with contextlib.suppress(FileNotFoundError):
            (sim.host.root / "var/lib/deployctl/units/sglang.service/pending.json").unlink()
        sh(sim, "sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service")
    else:
        sh(sim, "systemctl", "daemon-reload")
    wait_pool(sim)
