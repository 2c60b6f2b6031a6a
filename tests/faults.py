"""`make faults`: the fault matrix on real test hosts, through the real CLI over real SSH.

Every step of apply and of rollback is hit three ways, and the world fails in the ways the
integration tests name; each fault is a named case. The last line printed is one JSON object:
{"faults_tried": N, "survived": M, "units_lost": K, "needless_restarts": R, "failed": [names...]}; the
exit code is 1 if any case failed or restarted the service for nothing.

How a step is hit: a watcher inside the host polls the transaction's events file and stops the
runner with SIGSTOP the moment the step's event is on disk (tests.faultkit), then the fault is
injected while it stands still:
  cut      the client is killed (its SSH connection drops), then the runner resumes: the host must
           finish on its own (an outcome in the events file, no one re-attaching);
  kill     the transient unit deployctl-<txn>.service gets SIGKILL; the client stays attached and
           its host-side follower starts `recover` (the next agent start); `deployctl status` after;
  restart  the client is killed and the test host is powered off and booted again
           (TestHost.restart()); then `deployctl status` recovers what the record says (a client
           still attached re-attaches by itself: tests/integration/test_e2e_ssh.py).
Each case then checks the host: sglang.service active and serving the flags of the installed
unit, which is the old or the new unit, no recovery record left, and the old unit's content still
on disk (as the unit or a backup; a case without it counts in units_lost). A case also fails if
`kill` or `restart` kept a new unit that had never been verified.

The watcher reports the last step the runner had logged when it stopped; a case whose runner had
already logged a later step is marked `approx` in its line (the fast file-level steps backup,
write and reload are the ones that can be overrun; in practice the poll lands on the step).
Steps of the automatic rollback (rollback, restore, verify_old) come from an apply the pool cannot
meet (--context 400k --force). Hosts are reused between cases and cases run on a few hosts at once.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.exitcodes import ExitCode
from agent.sglang.flags import parse_unit_flags
from tests import daemonfaults, simhost
from tests import faultkit as fk
from tests.integration import test_faults as world
from tests.integration import test_recovery as recovery
from tests.integration import test_router_late as late_router
from tests.integration.conftest import cli, invocation, popen, wait_pool

WORKERS = 3
APPLY_STEPS = ["lock", "backup", "write", "reload", "restart", "watch", "gate"]
FAILED_APPLY_STEPS = ["rollback", "restore", "verify_old"]
INJECTIONS = ["cut", "kill", "restart"]
BEFORE_RESTART = ("lock", "backup", "write", "reload")  # the service must not be restarted for these
# the failures of the world: (case, a word of the integration test's name, its arguments)
WORLD: list[tuple[str, str, tuple[object, ...]]] = [
    ("no_space_for_backup", "no_space_left", (0, r"sglang\.service\.bak\.\S+")),
    ("no_space_for_unit", "no_space_left", (1, r"sglang\.service")),
    ("no_space_for_secrets_backup", "secrets_backup_on_a_full_disk", ()),
    ("read_only_unit_dir", "read_only_unit_directory", ()),
    ("hand_edit", "edited_by_hand", ()),
    ("journal_vacuum_pass", "journal_rotated", ("200k", ExitCode.OK)),
    ("journal_vacuum_reject", "journal_rotated", ("400k", ExitCode.ROLLED_BACK)),
    ("crash_loop", "crash_loop", ()),
    ("silent_death_restarted", "silent_death", ()),
    ("hang_before_pool", "never_logs_a_pool", ()),
    ("crash_loading", "failing_new_start", ("crash_loading",)),
    ("oom_graph", "failing_new_start", ("oom_graph",)),
    ("garbage_output", "garbage_output", ()),
    ("two_applies", "two_applies", ()),
    ("killed_after_verified", "after_the_new_unit_was_verified", ()),
    ("smoke_not_json", "odd_smoke_reply", ("not_json",)),
    ("smoke_no_choices", "odd_smoke_reply", ("no_choices",)),
    ("smoke_error_body", "odd_smoke_reply", ("error",)),
    ("smoke_json_list", "odd_smoke_reply", ("list",)),
    ("proxy_in_host_environment", "proxy_in_the_hosts_environment", ()),
    ("status_while_runner_starts", "has_not_locked_yet", ()),
    ("failed_recovery_stops_apply", "failed_recovery_stops_everything", ("apply",)),
    ("failed_recovery_of_an_orphan", "failed_recovery_stops_everything", ("orphan",)),
    ("corrupt_record", "corrupt_record", ()),
    ("unit_not_utf8", "not_utf8", ()),
    ("rollback_to_oldest", "oldest_backup_keeps_it", ()),
    ("rollback_default_differs", "restores_a_different_unit", ()),
    ("drop_in_sets_exec_start", "would_not_run_as_written", ("drop-in",)),
    ("shadowing_unit_copy", "would_not_run_as_written", ("run",)),
    ("verified_log_gone", "verified_starts_log_is_gone", ()),
    ("unit_outside_etc", "outside_etc_systemd_system", ("/usr/local/lib/systemd/system",)),
    ("unit_in_run_systemd_system", "outside_etc_systemd_system", ("/run/systemd/system",)),
    ("two_applies_lock_race", "loses_the_lock_race", ()),
    ("fleet_link_cut_before_txn", "link_cut_before_the_hosts_transaction", ()),
    ("apply_during_systemds_start", "during_a_start_systemd_began", ()),
    ("stalled_read_in_model_folder", "stalled_read_in_the_model_folder", ()),
    ("metrics_folder_is_a_link", "link_at_the_metrics_textfile", ("folder",)),
    ("metrics_textfile_is_a_link", "link_at_the_metrics_textfile", ("file",)),
    ("runner_killed_before_staged_secrets", "before_it_took_its_staged_secrets", ()),
    ("late_router_removal", "late_router_removal", ()),
]


@dataclass
class Outcome:
    name: str
    survived: bool = False
    unit_lost: bool = False
    needless_restart: bool = False
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Action:
    argv: list[str]
    new_text: Callable[[], str | None]


def apply_action(sim: simhost.SimHost, failing: bool) -> Action:
    """An apply to a context the host does not run yet (or one its pool cannot meet)."""
    current = parse_unit_flags(sim.unit_text())["context-length"]
    context = "400k" if failing else ("150k" if current == "200000" else "200k")
    argv = [
        "apply",
        sim.name,
        "--context",
        context,
        "--yes",
        *(["--force", "--allow-longer-context"] if failing else []),
    ]
    return Action(argv, lambda: None)


def rollback_action(sim: simhost.SimHost) -> Action:
    """A manual rollback to the newest backup that differs from the installed unit."""
    current = sim.unit_text()
    directory = sim.host.root / "etc/systemd/system"
    for path in sorted(directory.glob("sglang.service.bak.*"), reverse=True):
        if path.read_text() != current:
            text = path.read_text()
            return Action(["rollback", sim.name, "--to", path.name, "--yes"], lambda t=text: t)
    raise RuntimeError("no backup that differs from the installed unit")


def new_unit(sim: simhost.SimHost, txn: str) -> str | None:
    try:
        req = json.loads(sim.host.read(f"/var/lib/deployctl/txn/{txn}/request.json"))
    except FileNotFoundError:
        return None
    return req.get("unit_text")


def step_case(sim: simhost.SimHost, verb: str, step: str, injection: str, out: Outcome) -> None:
    old = sim.unit_text()
    if verb == "rollback" and not any(t != old for t in fk.backup_texts(sim)):
        r = cli(sim, *apply_action(sim, False).argv)  # a unit to roll back from
        assert r.returncode == ExitCode.OK, r.stderr
        old = sim.unit_text()
    action = rollback_action(sim) if verb == "rollback" else apply_action(sim, verb == "apply-failing")
    serving = invocation(sim)  # the start that serves before the change
    with fk.Watcher(sim, step) as watcher:
        proc = popen(sim, *action.argv)
        hit = watcher.wait(timeout=90)
    if not hit.exact:
        out.notes.append(f"approx: stopped after {hit.last}")
    new = action.new_text() or new_unit(sim, hit.txn)
    if injection == "cut":
        cut_connection(sim, proc, hit, out)
    elif injection == "kill":
        fk.kill_runner(sim, hit.txn)
        proc.communicate(timeout=180)
        out.notes.append(f"client exit {proc.returncode}")
    else:
        # the laptop's side goes with the host (a client still there would re-attach and recover by
        # itself, before the reboot's own start is recorded below): the next agent start recovers
        proc.kill()
        proc.communicate(timeout=30)
        fk.restart_host(sim)
        # The reboot itself started the service, from whatever unit file was on disk: recovery must
        # restart it only if that start is not the unit it keeps.
        wait_pool(sim)
        serving, booted_flags = invocation(sim), served(sim)
    if injection != "cut":
        st = cli(sim, "status", sim.name)  # the user's next run: recovers whatever is left
        assert st.returncode == ExitCode.OK, st.stderr
        if "recovering first" in st.stderr:
            out.notes.append("status recovered")
    settle(sim, out, old, new, must_be_old=injection != "cut")
    restarted = invocation(sim) != serving
    if injection == "kill" and step in BEFORE_RESTART:
        out.needless_restart = restarted
    elif injection == "restart":
        out.needless_restart = restarted and served(sim) == booted_flags
    if out.needless_restart:
        out.notes.append("NEEDLESS RESTART")


def cut_connection(sim: simhost.SimHost, proc: subprocess.Popen[str], hit: fk.Hit, out: Outcome) -> None:
    """The laptop's side dies mid-change: the host must finish on its own."""
    proc.kill()
    proc.communicate()
    fk.resume_runner(sim, hit.pid)
    deadline = time.monotonic() + 120
    while fk.outcome_of(sim, hit.txn) is None:
        assert time.monotonic() < deadline, "the host did not finish on its own"
        time.sleep(0.1)
    out.notes.append(f"finished on its own: {fk.outcome_of(sim, hit.txn)}")


def served(sim: simhost.SimHost) -> tuple[object, ...]:
    """The flags the running start serves with: a restart into the same ones was for nothing."""
    info = fk.serving_flags(sim)
    return tuple(info.get(k) for k in ("context_length", "mem_fraction_static", "max_running_requests"))


def settle(sim: simhost.SimHost, out: Outcome, old: str, new: str | None, must_be_old: bool) -> None:
    fk.wait_idle(sim)
    problems = fk.verified_problems(sim, old, new)
    out.unit_lost = old != sim.unit_text() and old not in fk.backup_texts(sim)
    if must_be_old and sim.unit_text() != old:
        problems.append("an unverified new unit was kept")
    out.notes += problems
    out.survived = not problems


def world_case(fn: Callable[..., None], *args: object) -> Callable[[simhost.SimHost, Outcome], None]:
    """One of the integration tests' faults: its own assertions, then the host must be verified."""

    def run(sim: simhost.SimHost, out: Outcome) -> None:
        to_baseline(sim)  # the integration tests start from the baseline unit
        old, pool = sim.unit_text(), wait_pool(sim)
        fn(sim, (old, pool), *args)
        settle(sim, out, old, sim.unit_text(), must_be_old=False)

    return run


def cases() -> list[tuple[str, Callable[[simhost.SimHost, Outcome], None]]]:
    found: list[tuple[str, Callable[[simhost.SimHost, Outcome], None]]] = []
    plan = [("apply", s) for s in APPLY_STEPS] + [("apply-failing", s) for s in FAILED_APPLY_STEPS]
    plan += [("rollback", s) for s in APPLY_STEPS]
    for verb, step in plan:
        for inj in INJECTIONS:
            found.append(
                (
                    f"{verb}:{step}:{inj}",
                    lambda sim, out, v=verb, s=step, i=inj: step_case(sim, v, s, i, out),
                )
            )
    for name, key, args in WORLD:
        test = next(
            getattr(m, n)
            for m in (world, recovery, late_router)
            for n in dir(m)
            if n.startswith("test_") and key in n
        )
        found.append((f"world:{name}", world_case(test, *args)))
    found.append(("world:old_unit_fails_too", old_unit_fails_too))
    for done in daemonfaults.JOBS:  # the weight-cache daemon's three jobs (tests/daemonfaults.py)
        for inj in INJECTIONS:
            found.append(
                (f"daemon:job{done}:{inj}", lambda sim, out, d=done, i=inj: daemon_case(sim, d, i, out))
            )
    for when in daemonfaults.CRASHES:  # the daemon killed by a signal (tests/daemonfaults.py)
        found.append((f"daemon:crash:{when}", lambda sim, out, w=when: daemon_crash(sim, w, out)))
    return found


def daemon_crash(sim: simhost.SimHost, when: str, out: Outcome) -> None:
    out.survived = daemonfaults.daemon_crash_case(sim, when, out.notes)


def daemon_case(sim: simhost.SimHost, done: int, injection: str, out: Outcome) -> None:
    out.survived = daemonfaults.daemon_job_case(sim, done, injection, out.notes)


def old_unit_fails_too(sim: simhost.SimHost, out: Outcome) -> None:
    """Exit 5, both units kept; then a person does what the message says and the host is verified."""
    to_baseline(sim)
    old = sim.unit_text()
    world.test_when_the_old_unit_fails_too_both_are_kept_and_the_message_says_what_to_do(sim, (old, 0))
    sim.set_sim_env({})  # the person fixes the host ...
    fk.sh(sim, "sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service")
    wait_pool(sim)
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes")  # ... and the next run finishes
    assert r.returncode in (ExitCode.OK, ExitCode.ROLLED_BACK), r.stdout + r.stderr
    settle(sim, out, old, sim.unit_text(), must_be_old=False)


BASELINE: dict[int, str] = {}  # id(sim) -> its baseline unit (the SGLang port differs per host)


def to_baseline(sim: simhost.SimHost) -> None:
    baseline = BASELINE[id(sim)]
    if sim.unit_text() != baseline:
        sim.host.put("/etc/systemd/system/sglang.service", baseline.encode())
        fk.sh(sim, "sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service")
        wait_pool(sim)


def repair(sim: simhost.SimHost, baseline: str) -> None:
    """Back to a healthy host after a case, whatever it left (the case's result is already taken)."""
    fk.repair(sim, baseline, sim.unit_text(), timeout=60)


def worker(todo: queue.Queue[tuple[str, Callable[..., None]]], results: list[Outcome]) -> None:
    if todo.empty():  # a subset asked for: no host to boot for nothing
        return
    sim = simhost.boot()
    try:
        wait_pool(sim)
        baseline = BASELINE[id(sim)] = sim.unit_text()
        while True:
            try:
                name, run = todo.get_nowait()
            except queue.Empty:
                return
            out = Outcome(name)
            t0 = time.monotonic()
            try:
                run(sim, out)
            except Exception as exc:  # a failed assertion or a timeout: the case did not survive
                out.survived = False
                first = (str(exc).strip().splitlines() or [""])[0]
                where = traceback.extract_tb(exc.__traceback__)[-1]
                out.notes.append(f"{type(exc).__name__} at {where.name}:{where.lineno}: {first[:300]}")
                with contextlib.suppress(Exception):
                    out.unit_lost = baseline != sim.unit_text() and baseline not in fk.backup_texts(sim)
            out.seconds = time.monotonic() - t0
            results.append(out)
            verdict = "survived" if out.survived else "FAILED"
            print(f"{name:42s} {verdict:8s} {out.seconds:5.1f} s  {'; '.join(out.notes)}", flush=True)
            try:
                repair(sim, baseline)
            except Exception:  # a host that cannot be repaired is replaced by a fresh one
                sim.stop()
                sim = simhost.boot()
                wait_pool(sim)
                baseline = BASELINE[id(sim)] = sim.unit_text()
    finally:
        sim.stop()


def group_worker(results: list[Outcome], only: list[str]) -> None:
    """The multi-node cases, one after another on one two-node group."""
    from tests import groupfaults, grouphosts
    from tests.integration.test_group import wait_for_group

    todo = [c for c in groupfaults.CASES if not only or any(o in c.name for o in only)]
    if not todo:
        return
    g = grouphosts.boot(2)
    try:
        wait_for_group(g)
        for case in todo:
            name = case.name
            out, t0 = Outcome(name), time.monotonic()
            try:
                ran = groupfaults.run_case(g, case, lambda: wait_for_group(g))
                out.survived, out.notes = ran.survived, list(ran.notes)
            except Exception as exc:
                out.notes.append(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}")
            out.seconds = time.monotonic() - t0
            results.append(out)
            verdict = "survived" if out.survived else "FAILED"
            print(f"{name:42s} {verdict:8s} {out.seconds:5.1f} s  {'; '.join(out.notes)}", flush=True)
    finally:
        g.stop()


def main() -> int:
    todo: queue.Queue[tuple[str, Callable[..., None]]] = queue.Queue()
    from tests import groupfaults

    only = sys.argv[1:]
    listed = [c.name for c in groupfaults.CASES if not only or any(o in c.name for o in only)]
    for name, run in cases():
        if not only or any(o in name for o in only):
            todo.put((name, run))
            listed.append(name)
    results: list[Outcome] = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(todo, results)) for _ in range(WORKERS)]
    threads.append(threading.Thread(target=group_worker, args=(results, only)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A case whose worker died (a host that did not boot) never ran: it fails, it is not left out.
    ran = {o.name for o in results}
    not_run = sorted(n for n in listed if n not in ran)
    failed = sorted(o.name for o in results if not o.survived) + not_run
    print(f"{len(results)} faults in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    summary = {
        "faults_tried": len(results),
        "survived": sum(o.survived for o in results),
        "units_lost": sum(o.unit_lost for o in results),
        "needless_restarts": sum(o.needless_restart for o in results),
        "not_run": not_run,
        "failed": failed,
    }
    print(json.dumps(summary))
    return 1 if failed or summary["needless_restarts"] else 0


if __name__ == "__main__":
    sys.exit(main())
