"""The fault matrix's weight-cache cases (`make faults`): the agent hit at each of the daemon's three jobs.

A change that restarts the daemon (a dtype change: its fingerprint) is the list [stop the engine, restart
the daemon and wait, start the engine], written to the record before the first (agent/host/change/jobs.py).
The runner is stopped the moment the record says `done=N` (N = 0: listed, the engine's stop under way;
1: the engine stopped; 2: the daemon restarted, the engine not started yet), then cut, killed or its host
rebooted, as tests/faults.py does with the steps. The host must end with the engine verified on the old or
the new unit, and the daemon running the unit file of the same side (its process's command line says
which), no record left.
"""

from __future__ import annotations

import re
import time

from agent.exitcodes import ExitCode
from agent.inventory import load_host
from agent.render import render_unit, template_dir
from agent.sglang.flags import parse_unit_flags
from tests import faultkit as fk
from tests import simhost
from tests.integration.conftest import cli, invocation, popen, variant, wait_pool

NAME = "ct200-wc"
DAEMON = "sglang-weight-cache.service"
DAEMON_FILE = f"/etc/systemd/system/{DAEMON}"
JOBS = (0, 1, 2)


def client_mode(sim: simhost.SimHost) -> simhost.SimHost:
    """The sim host through an inventory with [weight_cache] on, its engine in client mode."""
    text = (sim.units_dir / "ct200-sim.toml").read_text()
    text = (
        re.sub(r"(?ms)^\[draft\]\n.*?(?=^\[)", "", text)
        + "\n[weight_cache]\nenabled = true\ntimeout_s = 120\n"
    )
    wc = variant(sim, NAME, text)
    if "--weight-cache-mode client" not in wc.unit_text():
        cfg = load_host(NAME, wc.units_dir)
        plain = cfg.model_copy(
            update={"weight_cache": cfg.weight_cache.model_copy(update={"enabled": False})}
        )
        wc.host.put(fk.UNIT, render_unit(plain, {}, template_dir()).encode())
        fk.sh(wc, "sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service")
        wait_pool(wc)
        r = cli(wc, "apply", NAME, "--context", "100k", "--yes", timeout=300)
        assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    return wc


def daemon_runs(sim: simhost.SimHost) -> str:
    """The running daemon's command line ('' when it is not running)."""
    pid = fk.sh(sim, "systemctl", "show", "-p", "MainPID", "--value", DAEMON).strip()
    if pid in ("", "0"):
        return ""
    return fk.sh(sim, "sh", "-c", f"tr '\\0' ' ' < /proc/{pid}/cmdline").strip()


def daemon_job_case(sim: simhost.SimHost, done: int, injection: str, notes: list[str]) -> bool:
    """One case; True when the host ended verified, both units on one side."""
    wc = client_mode(sim)
    old, old_daemon = wc.unit_text(), wc.host.read(DAEMON_FILE).decode()
    dtype = "float16" if "--dtype float16" not in old_daemon else "bfloat16"
    with fk.Watcher(wc, "restart", phase=f"done={done}") as watcher:
        proc = popen(wc, "apply", NAME, "--context", "120k", "--set", f"dtype={dtype}", "--yes")
        hit = watcher.wait(timeout=240)
    if injection == "cut":
        proc.kill()
        proc.communicate()
        fk.resume_runner(wc, hit.pid)
        deadline = time.monotonic() + 240
        while fk.outcome_of(wc, hit.txn) is None:
            assert time.monotonic() < deadline, "the host did not finish on its own"
            time.sleep(0.2)
    elif injection == "kill":
        fk.kill_runner(wc, hit.txn)
        proc.communicate(timeout=300)
    else:
        proc.kill()
        proc.communicate(timeout=30)
        fk.restart_host(wc)
        wait_pool(wc, timeout=240)
    if injection != "cut":
        st = cli(wc, "status", NAME, timeout=300)  # the next run recovers what is left
        assert st.returncode == ExitCode.OK, st.stdout + st.stderr
    fk.wait_idle(wc, timeout=240)
    problems = (
        fk.verified_problems(wc, old)
        if wc.unit_text() == old
        else fk.verified_problems(wc, old, wc.unit_text())
    )
    if wc.unit_text() != old and injection != "cut" and not fk.outcome_of(wc, hit.txn):
        problems.append("an unverified new unit was kept")
    daemon_file, runs = wc.host.read(DAEMON_FILE).decode(), daemon_runs(wc)
    if not runs:
        problems.append("the daemon is not running")
    elif (f"--dtype {dtype}" in runs) != (f"--dtype {dtype}" in daemon_file):
        problems.append("the daemon runs another unit than its file")
    if (wc.unit_text() == old) != (daemon_file == old_daemon):
        problems.append("the engine and the daemon are on different sides")
    if fk.pending(wc):
        problems.append("a recovery record is left")
    notes += problems or ["new" if wc.unit_text() != old else "old"]
    return not problems


CRASHES = ("idle", "watch")  # no change running; the engine's new start under the agent's watch


def daemon_crash_case(sim: simhost.SimHost, when: str, notes: list[str]) -> bool:
    """`kill -9` of the daemon: with no change running, systemd brings the daemon and then the engine back
    (the engine's `Requires=`/`PartOf=`, the daemon's `Restart=always`); under an apply's watch, the agent
    follows the engine start systemd made and the change ends verified on one side. True when the host
    ended verified, both units on one side, the daemon running."""
    wc = client_mode(sim)
    old, old_daemon = wc.unit_text(), wc.host.read(DAEMON_FILE).decode()
    before = invocation(wc)
    if when == "watch":
        with fk.Watcher(wc, "watch") as watcher:
            proc = popen(wc, "apply", NAME, "--context", "110k", "--yes")
            hit = watcher.wait(timeout=240)
        fk.sh(wc, "systemctl", "kill", "--signal=SIGKILL", DAEMON)
        fk.resume_runner(wc, hit.pid)
        proc.communicate(timeout=900)
        notes.append(f"apply exit {proc.returncode}")
    else:
        fk.sh(wc, "systemctl", "kill", "--signal=SIGKILL", DAEMON)
        deadline = time.monotonic() + 240
        while invocation(wc) in ("", before):  # the engine's new start, after the daemon's
            assert time.monotonic() < deadline, "the engine was not started again after the daemon's crash"
            time.sleep(0.5)
    wait_pool(wc, timeout=300)
    fk.wait_idle(wc, timeout=240)
    new = wc.unit_text()
    problems = fk.verified_problems(wc, old) if new == old else fk.verified_problems(wc, old, new)
    daemon_file = wc.host.read(DAEMON_FILE).decode()
    runs = daemon_runs(wc)
    if not runs:
        problems.append("the daemon is not running")
    elif not runs_its_file(runs, daemon_file):
        problems.append("the daemon runs another unit than its file")
    # A context change leaves the daemon's unit as it was (the apply may still write back one that drifted):
    # rolled back, it must be the old one; either way the old one is kept, as the file or a backup.
    if new == old and daemon_file != old_daemon:
        problems.append("the engine is back on its old unit but the daemon is not")
    kept = [p.read_text() for p in (wc.host.root / "etc/systemd/system").glob(f"{DAEMON}*") if p.is_file()]
    if old_daemon not in kept:
        problems.append("the daemon's old unit is lost")
    if fk.pending(wc):
        problems.append("a recovery record is left")
    notes += problems or ["new" if new != old else "old"]
    return not problems


def runs_its_file(cmdline: str, daemon_file: str) -> bool:
    """Every flag of the daemon's unit file is on the running daemon's command line."""
    words = cmdline.split()
    for flag, value in parse_unit_flags(daemon_file).items():
        if f"--{flag}" not in words or (isinstance(value, str) and value not in words):
            return False
    return True
