"""Faults on the real test host through the real CLI over SSH: every one ends with a verified host.

Faults in the new start come from the simulated server's drop-in, limited to the new unit's
--context-length (SGLANG_SIM_FAULT_WHEN_CONTEXT) so the restored old unit starts cleanly. Steps of a
transaction are hit with the in-host watcher of tests.faultkit (the runner is stopped right at the step).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from datetime import datetime

import pytest

from agent.exitcodes import ExitCode
from agent.sglang.flags import parse_unit_flags
from tests import faultkit as fk
from tests.integration.conftest import cli, invocation, popen, server_info, variant, wait_pool
from tests.pure import facts_fixtures as cfg

pytestmark = pytest.mark.integration

RESTART_DROPIN = fk.RESTART_DROPIN
NEW_CONTEXT = "200000"


@pytest.fixture
def base(sim) -> Iterator[tuple[str, int]]:
    """The baseline unit and its pool; afterwards the host is put back to it, whatever the test did."""
    wait_pool(sim)
    old, pool = sim.unit_text(), wait_pool(sim)
    try:
        yield old, pool
    finally:
        fk.repair(sim, old)


def fault_in_new_start(sim, fault: str) -> None:
    sim.set_sim_env({"SGLANG_SIM_FAULT": fault, "SGLANG_SIM_FAULT_WHEN_CONTEXT": NEW_CONTEXT})


def assert_old_back(sim, old: str, pool: int) -> None:
    assert sim.unit_text().encode() == old.encode()
    assert wait_pool(sim) == pool
    assert server_info(sim)["context_length"] == int(parse_unit_flags(old)["context-length"])
    assert fk.verified_problems(sim, old) == []


def apply(sim, context: str = "200k", *extra: str):
    return cli(sim, "apply", sim.name, "--context", context, "--yes", *extra)


def last_txn(sim) -> str:
    raw = sim.host.read("/var/lib/deployctl/units/sglang.service/last_txn.json")
    return str(json.loads(raw)["txn"])


def stage_times(sim, txn: str) -> dict[str, datetime]:
    times: dict[str, datetime] = {}
    for e in fk.txn_events(sim, txn):
        times.setdefault(str(e["stage"]), datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")))
    return times


@pytest.mark.parametrize("fault", ["crash_loading", "oom_graph"])
def test_a_failing_new_start_rolls_back_by_itself(sim, base, fault):
    old, pool = base
    fault_in_new_start(sim, fault)
    r = apply(sim)
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert "ROLLED BACK" in r.stdout
    assert_old_back(sim, old, pool)


@pytest.mark.parametrize("kind", ["not_json", "no_choices", "error", "list"])
def test_an_odd_smoke_reply_is_a_failed_smoke_test_and_rolls_back(sim, base, kind):
    old, pool = base
    fault_in_new_start(sim, f"odd_reply_{kind}")
    r = apply(sim)
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert "smoke test failed" in r.stdout and "agent error" not in r.stdout + r.stderr
    assert_old_back(sim, old, pool)


def test_a_proxy_in_the_hosts_environment_never_reaches_the_probes(sim, base):
    """Transient units inherit systemd's manager environment: a proxy set there must not fail checks."""
    proxy = "http://127.0.0.1:9"  # nothing listens: any probe sent through it fails
    names = ("HTTP_PROXY", "http_proxy", "ALL_PROXY")
    # SGLang itself is kept out of it (its own warm-up request would go to the proxy too).
    noproxy = sim.host.root / "etc/systemd/system/sglang.service.d/noproxy.conf"
    noproxy.write_text("[Service]\nUnsetEnvironment=" + " ".join(names) + "\n")
    fk.sh(sim, "systemctl", "set-environment", *(f"{n}={proxy}" for n in names))
    try:
        r = apply(sim)
    finally:
        fk.sh(sim, "systemctl", "unset-environment", *names)
        noproxy.unlink()
        fk.sh(sim, "systemctl", "daemon-reload")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert parse_unit_flags(sim.unit_text())["context-length"] == NEW_CONTEXT


def test_a_start_that_never_logs_a_pool_times_out_and_rolls_back(sim, base):
    old, pool = base
    fault_in_new_start(sim, "hang_before_pool")
    with fk.timeouts(sim, pool_s=3, no_progress_s=3):
        r = apply(sim)
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert "nothing logged for 3 s" in r.stdout or "no KV pool logged 3 s" in r.stdout, r.stdout
    assert_old_back(sim, old, pool)


def test_a_crash_loop_under_restart_always_is_seen_at_once(sim, base):
    old, pool = base
    sim.host.put(RESTART_DROPIN, b"[Service]\nRestart=always\nRestartSec=100ms\n")
    fault_in_new_start(sim, "crash_loading")
    r = apply(sim)
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    t = stage_times(sim, last_txn(sim))
    # seen at the crash (half-way through a 1.5 s load), not after the phase timeouts of 30 s and more
    assert (t["rollback"] - t["restart"]).total_seconds() < 8.0
    assert_old_back(sim, old, pool)


def test_a_silent_death_that_systemd_restarts_is_seen_on_the_bus(sim, base):
    """No log line tells of this crash: NRestarts growing is what the watcher sees."""
    old, pool = base
    sim.host.put(RESTART_DROPIN, b"[Service]\nRestart=always\nRestartSec=100ms\n")
    watcher = fk.Watcher(sim, "watch")
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()
    n0 = int(fk.unit_state(sim)["NRestarts"])
    fk.sh(sim, "systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", "sglang.service")
    fk_wait(lambda: int(fk.unit_state(sim)["NRestarts"]) > n0)
    fk.resume_runner(sim, hit.pid)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.ROLLED_BACK, out + err
    assert "systemd restarted it" in out, out
    assert_old_back(sim, old, pool)


def test_garbage_output_never_crashes_the_agent(sim, base):
    old, _ = base
    sim.set_sim_env({"SGLANG_SIM_FAULT": "garbage"})  # both starts: invalid UTF-8, a 70k-char line, NULs
    r = apply(sim)
    assert r.returncode in (ExitCode.OK, ExitCode.ROLLED_BACK), r.stdout + r.stderr
    assert "AGENT ERROR" not in r.stdout and "internal error" not in r.stderr
    new = sim.unit_text()
    assert fk.verified_problems(sim, old, new) == []
    if r.returncode == ExitCode.OK:
        assert wait_pool(sim) >= 200_000


def test_when_the_old_unit_fails_too_both_are_kept_and_the_message_says_what_to_do(sim, base):
    old, _ = base
    sim.set_sim_env({"SGLANG_SIM_FAULT": "crash_loading"})  # every start crashes, the old one too
    r = apply(sim)
    assert r.returncode == ExitCode.ROLLBACK_FAILED, r.stdout + r.stderr
    txn = last_txn(sim)
    rejected = sim.host.read(f"/var/lib/deployctl/txn/{txn}/rejected-sglang.service").decode()
    assert parse_unit_flags(rejected)["context-length"] == NEW_CONTEXT
    assert sim.unit_text() == old  # the old unit is back in place ...
    assert old in fk.backup_texts(sim)  # ... and kept as a backup
    assert "journalctl -u sglang.service" in r.stdout
    assert f"rejected unit is kept at /var/lib/deployctl/txn/{txn}/rejected-sglang.service" in r.stdout
    assert f"deployctl status {sim.name}" in r.stdout
    # a failed rollback waits for a person: status does not restart the service behind their back
    st = cli(sim, "status", sim.name)
    assert st.returncode == ExitCode.OK and "recovering first" not in st.stdout
    assert "recovery record is present" in st.stdout


def test_agent_sigkilled_while_watching_the_old_unit_comes_back(sim, base):
    old, pool = base
    watcher = fk.Watcher(sim, "watch")
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()
    fk.kill_runner(sim, hit.txn)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.ROLLED_BACK, out + err  # the follower started `recover`
    assert "agent died" in out + err
    assert_old_back(sim, old, pool)


def orphan_a_change(sim) -> None:
    """Kill a 200k apply's client, its follower on the host and its runner while the start is watched."""
    watcher = fk.Watcher(sim, "watch")
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()
    proc.kill()
    proc.communicate()
    fk.kill_followers(sim, "session")  # else the host's follower of the killed client recovers by itself
    fk.kill_runner(sim, hit.txn)


def test_agent_and_client_killed_then_status_recovers(sim, base):
    old, pool = base
    orphan_a_change(sim)
    assert fk.pending(sim)
    st = cli(sim, "status", sim.name)
    assert st.returncode == ExitCode.OK, st.stderr
    said = st.stderr + st.stdout
    assert "recovering first" in said, said
    fk.wait_idle(sim)
    assert_old_back(sim, old, pool)


def test_status_never_recovers_under_a_runner_that_has_not_locked_yet(sim, base):
    """A runner that systemd started but that has not taken the lock is a change starting, not an orphan."""
    old, pool = base
    orphan_a_change(sim)
    # The next change's runner, started by systemd and not locking yet (as in its Python start-up).
    starting = "20990101T000000Z-0abcde"
    fk.sh(sim, "systemd-run", f"--unit=deployctl-{starting}", "--collect", "--quiet", "sleep", "600")
    fk.sh(sim, "python3", "-c", fk.SET_LAST_TXN, starting)
    try:
        st = cli(sim, "status", sim.name)
        assert st.returncode == ExitCode.OK, st.stderr
        said = st.stderr + st.stdout
        assert "recovering first" not in said and f"running: ? transaction {starting}" in said, said
        assert fk.pending(sim) and not fk.lock_held(sim)
    finally:
        fk.sh(sim, "systemctl", "stop", f"deployctl-{starting}.service")
    st = cli(sim, "status", sim.name)  # systemd says it is gone: now the change is an orphan
    assert "recovering first" in st.stderr + st.stdout, st.stderr + st.stdout
    fk.wait_idle(sim)
    assert_old_back(sim, old, pool)


def test_agent_sigkilled_after_the_new_unit_was_verified_keeps_it(sim, base):
    old, _ = base
    watcher = fk.Watcher(sim, "", phase="verified")
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()
    fk.kill_runner(sim, hit.txn)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.OK, out + err
    new = sim.unit_text()
    assert parse_unit_flags(new)["context-length"] == NEW_CONTEXT
    assert fk.verified_problems(sim, old, new) == []
    assert wait_pool(sim) >= 200_000


def restart_host_at(sim, step: str) -> None:
    """Start a 200k apply, restart the test host when its transaction reaches `step`, the laptop's side
    gone too (a client still there re-attaches and recovers by itself: test_e2e_ssh.py), so the next
    agent start is what recovers."""
    watcher = fk.Watcher(sim, step)
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    watcher.wait()
    proc.kill()
    proc.communicate(timeout=30)
    fk.restart_host(sim)


def test_host_restarted_mid_transaction_recovers_at_the_next_agent_start(sim, base):
    old, pool = base
    restart_host_at(sim, "watch")
    assert fk.pending(sim)  # the record survived the reboot; the host booted the unverified unit
    st = cli(sim, "status", sim.name)
    assert st.returncode == ExitCode.OK and "recovering first" in st.stderr + st.stdout
    assert_old_back(sim, old, pool)


def test_host_restarted_then_apply_again_recovers_first_then_applies(sim, base):
    old, _ = base
    restart_host_at(sim, "restart")
    r = apply(sim)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert "recovering first" in r.stderr + r.stdout
    assert fk.verified_problems(sim, old, sim.unit_text()) == []
    assert wait_pool(sim) >= 200_000


def test_two_applies_at_once_one_runs_the_other_gets_the_lock_code(sim, base):
    old, _ = base
    watcher = fk.Watcher(sim, "watch")
    first = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()  # the first holds the lock, stopped in its watch
    second = apply(sim, "190k")
    assert second.returncode == ExitCode.LOCKED, second.stdout + second.stderr
    assert f"transaction {hit.txn}" in second.stdout + second.stderr
    assert f"pid {hit.pid}" in second.stdout + second.stderr
    fk.resume_runner(sim, hit.pid)
    out, err = first.communicate(timeout=120)
    assert first.returncode == ExitCode.OK, out + err
    assert parse_unit_flags(sim.unit_text())["context-length"] == NEW_CONTEXT
    # started together: still exactly one runs
    a, b = popen(sim, "apply", sim.name, "--context", "150k", "--yes"), apply(sim, "160k")
    a.communicate(timeout=120)
    assert sorted([a.returncode, b.returncode]) == [ExitCode.OK, ExitCode.LOCKED], b.stdout + b.stderr
    assert fk.verified_problems(sim, old, sim.unit_text()) == []


def test_a_unit_edited_by_hand_after_the_plan_is_refused_never_overwritten(sim, base):
    old, _ = base
    watcher = fk.Watcher(sim, "lock")
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()  # planned against `old`; stopped before it compares
    edited = old.replace("[Service]\n", "[Service]\n# edited by hand\n")
    sim.host.put("/etc/systemd/system/sglang.service", edited.encode())
    fk.resume_runner(sim, hit.pid)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.REFUSED, out + err
    assert "edited by hand" in out + err
    assert sim.unit_text() == edited
    assert fk.outcome_of(sim, hit.txn) == "error"
    sim.host.put("/etc/systemd/system/sglang.service", old.encode())


@pytest.mark.parametrize(("free_pages", "what"), [(0, r"sglang\.service\.bak\.\S+"), (1, r"sglang\.service")])
def test_no_space_left_leaves_the_old_unit_intact(sim, base, free_pages, what):
    old, _ = base
    before = invocation(sim)
    with fk.small_unit_dir(sim, free_pages):
        r = apply(sim)
        assert r.returncode == ExitCode.REFUSED, r.stdout + r.stderr
        assert re.search(f"cannot write /etc/systemd/system/{what}: no space left on the device", r.stderr)
        assert sim.unit_text().encode() == old.encode()
        assert not list((sim.host.root / "etc/systemd/system").glob(".sglang.service.deployctl-tmp.*"))
        assert not fk.pending(sim)
    assert invocation(sim) == before  # never restarted


def test_a_read_only_unit_directory_changes_nothing(sim, base):
    old, _ = base
    before, backups = invocation(sim), sim.backups()
    with fk.read_only_unit_dir(sim):
        r = apply(sim)
    assert r.returncode == ExitCode.REFUSED, r.stdout + r.stderr
    assert "Read-only file system" in r.stdout + r.stderr
    assert sim.unit_text() == old and sim.backups() == backups and invocation(sim) == before
    assert not fk.pending(sim)


@pytest.mark.parametrize(("context", "code"), [("200k", ExitCode.OK), ("400k", ExitCode.ROLLED_BACK)])
def test_journal_rotated_and_vacuumed_while_watching_the_gate_still_decides(sim, base, context, code):
    old, _ = base
    watcher = fk.Watcher(sim, "watch")
    proc = popen(sim, "apply", sim.name, "--context", context, "--yes", "--force", "--allow-longer-context")
    hit = watcher.wait()
    fk.sh(sim, "journalctl", "--rotate", "--vacuum-files=1")
    fk.resume_runner(sim, hit.pid)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, out + err
    assert fk.verified_problems(sim, old, sim.unit_text()) == []
    if code == ExitCode.OK:
        assert wait_pool(sim) >= 200_000


def fk_wait(predicate, timeout: float = 30) -> None:
    from tests.integration.conftest import wait_for

    wait_for(predicate, timeout=timeout, interval=0.05)


def test_agent_killed_before_its_first_change_is_no_success(sim, base):
    old, pool = base
    before = invocation(sim)
    watcher = fk.Watcher(sim, "lock")
    proc = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()
    fk.kill_runner(sim, hit.txn)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.REFUSED, out + err
    assert "died before it changed anything; nothing changed" in out + err
    assert invocation(sim) == before
    assert_old_back(sim, old, pool)


def _pool_on(port: str, timeout: float = 60) -> int:
    """The served pool, read from the port itself (there may be no unit in /etc/systemd/system)."""
    from tests.integration.conftest import wait_for

    found: list[int] = []

    def served() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
                found.append(int(json.load(r)["max_total_num_tokens"]))
            return True
        except OSError:
            return False

    wait_for(served, timeout=timeout, interval=0.2)
    return found[-1]


@pytest.mark.parametrize("where", ["/usr/local/lib/systemd/system", "/run/systemd/system"])
def test_a_unit_outside_etc_systemd_system_is_restarted_and_verified_on_rollback(sim, base, where):
    """The inventory says /etc/systemd/system; systemd loads the unit from a package's folder (or /run).
    The first apply finds no file of its own there; its rollback must bring that unit's service back."""
    old, pool = base
    etc, theirs = "/etc/systemd/system/sglang.service", f"{where}/sglang.service"
    before = invocation(sim)
    fk.sh(sim, "sh", "-c", f"mkdir -p {where} && mv {etc} {theirs} && systemctl daemon-reload")
    show = ["systemctl", "show", "-p", "FragmentPath", "--value", "sglang.service"]
    try:
        assert fk.sh(sim, *show).strip() == theirs and invocation(sim) == before
        fault_in_new_start(sim, "crash_loading")
        r = apply(sim)
        assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
        assert "old unit restored and healthy" in r.stdout, r.stdout
        assert not (sim.host.root / etc.lstrip("/")).exists()  # the host as it was: their unit loads
        assert fk.sh(sim, *show).strip() == theirs
        assert fk.unit_state(sim)["ActiveState"] == "active" and invocation(sim) != before
        assert _pool_on(str(parse_unit_flags(old)["port"])) == pool
        assert not fk.pending(sim)
    finally:
        sim.set_sim_env({})
        fk.sh(
            sim, "sh", "-c", f"[ -e {etc} ] && rm -f {theirs} || mv {theirs} {etc}; systemctl daemon-reload"
        )
    assert sim.unit_text() == old


# The next change's runner, as start() leaves it before it runs: its request, and the marker of a runner
# asked for (argv: state dir, the running transaction, the new one).
LOSER_ASKED = """
import json, os, shutil, sys
state, running, txn = sys.argv[1:4]
os.makedirs(f"{state}/txn/{txn}", mode=0o700)
shutil.copy(f"{state}/txn/{running}/request.json", f"{state}/txn/{txn}/request.json")
with open(f"{state}/units/sglang.service/starting_txn.json", "w") as f:
    json.dump({"txn": txn}, f)
"""


def test_a_runner_that_loses_the_lock_race_leaves_status_to_the_winner(sim, base):
    """Two applies passed the "is one running?" check before either locked: the second runner meets the
    first one's lock. Its LOCKED outcome must not hide the winner's from status (nor a fleet re-attach)."""
    old, _ = base
    watcher = fk.Watcher(sim, "watch")
    first = popen(sim, "apply", sim.name, "--context", "200k", "--yes")
    hit = watcher.wait()  # the winner holds the lock, stopped in its watch
    argv = fk.sh(sim, "cat", f"/proc/{hit.pid}/cmdline").split("\0")[:-1]
    loser = "20991231T000000Z-0fedcb"
    fk.sh(sim, "python3", "-c", LOSER_ASKED, fk.STATE, hit.txn, loser)
    r = sim.host.ssh([*argv[:-1], loser], timeout=60)  # the loser's runner: `... run <txn>`
    assert r.returncode == ExitCode.LOCKED, r.stderr.decode(errors="replace")
    fk.resume_runner(sim, hit.pid)
    out, err = first.communicate(timeout=120)
    assert first.returncode == ExitCode.OK, out + err
    assert fk.outcome_of(sim, loser) == "locked" and last_txn(sim) == hit.txn
    st = cli(sim, "status", sim.name)
    assert st.returncode == ExitCode.OK, st.stderr
    assert f"last transaction {hit.txn}: applied" in st.stdout, st.stdout
    assert fk.verified_problems(sim, old, sim.unit_text()) == []


def test_a_link_cut_before_the_hosts_transaction_started_is_not_started(sim, base):
    """The fleet's link drops after the facts answer, before the apply reached the host: the host's last
    outcome (an earlier APPLIED) is not this run's, so the host is reported not started and fails."""
    from unittest import mock

    from agent.fleet import hostrun
    from agent.inventory import load_host
    from agent.remote.client import Conversation
    from agent.remote.transport import ConnectionLost

    r = apply(sim)  # an earlier change: its APPLIED is the host's last outcome
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    before, installed, txns = invocation(sim), sim.unit_text(), fk.sh(sim, "ls", f"{fk.STATE}/txn")

    def cut(self: Conversation, req: object) -> Iterator[object]:
        raise ConnectionLost("the link dropped before the request reached the host")
        yield

    with mock.patch.dict(os.environ, sim.env), mock.patch.object(Conversation, "events", cut):
        result = hostrun.apply_host(load_host(sim.name, sim.units_dir), 150_000, (), lambda p, m: None)
    assert result.outcome == "not_started" and result.failed, result
    assert result.measured_start is None  # nothing stale for later hosts to plan from
    assert invocation(sim) == before and sim.unit_text() == installed
    assert fk.sh(sim, "ls", f"{fk.STATE}/txn") == txns  # no transaction began


def test_an_apply_during_a_start_systemd_began_waits_for_it_instead_of_restarting_it(sim, base):
    """Cron's apply meets a start that systemd itself began (a reboot, Restart=): its pool is logged, it
    is not ready yet. The apply waits for that start; restarting it would cost a model load for nothing."""
    old, _ = base
    r = apply(sim)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    sim.set_sim_env({"SGLANG_SIM_WARMUP_SECONDS": "12"})  # pool logged, then 12 s before it is ready
    fk.sh(sim, "sh", "-c", "systemctl daemon-reload && systemctl restart --no-block sglang.service")

    def pool_logged() -> bool:
        inv = invocation(sim)
        lines = fk.sh(sim, "journalctl", "-q", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={inv}")
        return bool(inv) and "KV Cache is allocated" in lines

    fk_wait(pool_logged, timeout=60)
    starting = invocation(sim)
    try:
        r = apply(sim)
    finally:
        sim.set_sim_env({})
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert invocation(sim) == starting, r.stdout  # waited for, not restarted
    assert "waiting for that start" in r.stdout + r.stderr, r.stdout
    assert fk.verified_problems(sim, old, sim.unit_text()) == []


SECRET_DIR = "/etc/deployctl/secrets"
SECRET_FILES = ("sglang.service.env", "sglang.service.flags.yaml")


def test_a_secrets_backup_on_a_full_disk_keeps_the_live_secrets(sim, base):
    """The unit's backup fits, its secrets' copies do not: the live secrets stay, nothing restarts."""
    old, _ = base
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    text = text.replace("[unit]\n", '[unit]\nenvironment = { HF_TOKEN = "secret-token-1" }\n')
    text = text.replace("[sglang.flags]\n", '[sglang.flags]\napi-key = "secret-key-1"\n')
    view = variant(sim, "ct200-fullsecrets", text)
    try:
        r = cli(view, "apply", "ct200-fullsecrets", "--context", "120k", "--yes")
        assert r.returncode == ExitCode.OK, r.stdout + r.stderr
        live = {n: sim.host.read(f"{SECRET_DIR}/{n}") for n in SECRET_FILES}
        unit, before, backups = sim.unit_text(), invocation(sim), sim.backups()
        with fk.small_dir(sim, SECRET_DIR, 0):
            r = cli(view, "apply", "ct200-fullsecrets", "--context", "200k", "--yes")
            assert r.returncode == ExitCode.REFUSED, r.stdout + r.stderr
            assert re.search(
                r"cannot write /etc/deployctl/secrets/sglang\.service\.bak\.\S+: no space left on the device",
                r.stderr,
            ), r.stderr
            assert {n: sim.host.read(f"{SECRET_DIR}/{n}") for n in SECRET_FILES} == live
        assert {n: sim.host.read(f"{SECRET_DIR}/{n}") for n in SECRET_FILES} == live
        assert sim.unit_text() == unit and sim.backups() == backups and not fk.pending(sim)
        assert invocation(sim) == before  # never restarted
        assert fk.verified_problems(sim, old, unit) == []
    finally:  # back to the baseline unit, which has no secrets (the fault matrix reuses the host)
        fk.sh(sim, "sh", "-c", f"rm -f {SECRET_DIR}/sglang.service.*")
        if sim.unit_text() != old:
            sim.host.put("/etc/systemd/system/sglang.service", old.encode())
            fk.sh(sim, "sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service")
            wait_pool(sim)


UNIT_PATH = "/etc/systemd/system/sglang.service"
STALL_WEIGHTS = "/srv/models/stall-weights"  # what the new unit loads: the shards, and a FIFO named *.bin
STALL_FACTS = "/srv/models/stall-facts"  # what the installed unit names: a config, an index naming a FIFO


def stalled_model_folders(sim) -> None:
    """Writable model folders holding FIFOs (no writer: a blocking open or read of one never returns).

    The simulated server only globs *.safetensors, so the FIFO named like a .bin shard is read by
    pre-warm alone; the facts follow the index of the installed unit's folder to the FIFO it names.
    """
    script = f"""set -e
rm -rf {STALL_WEIGHTS} {STALL_FACTS}
mkdir -p {STALL_WEIGHTS} {STALL_FACTS}
for f in /models/Kimi-K2.6/*.safetensors; do ln -s "$f" {STALL_WEIGHTS}/; done
mkfifo {STALL_WEIGHTS}/extra-00001.bin {STALL_FACTS}/extra-00001.bin"""
    fk.sh(sim, "sh", "-c", script)
    sim.host.put(f"{STALL_FACTS}/config.json", json.dumps(cfg.KIMI_K26).encode())
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "extra-00001.bin"}}
    sim.host.put(f"{STALL_FACTS}/model.safetensors.index.json", json.dumps(index).encode())


def test_a_stalled_read_in_the_model_folder_never_hangs_the_apply(sim, base):
    """FIFOs where weights are read: pre-warm skips the one among the shards, the facts the one the index
    names; the apply finishes (a blocking open would wait for a writer forever)."""
    old, _ = base
    stalled_model_folders(sim)
    # the weight files pre-warm may read: the target's shards and the draft's
    listing = f"ls {STALL_WEIGHTS}/*.safetensors /models/Kimi-K2.6-DFlash/*.safetensors | wc -l"
    shards = int(fk.sh(sim, "sh", "-c", listing).strip())
    # The installed unit names the facts' folder (by hand, not restarted); the inventory the weights'.
    hand_edited = re.sub(r"(--model-path[= ])/models/Kimi-K2\.6(?=\s)", rf"\g<1>{STALL_FACTS}", old)
    assert hand_edited != old
    sim.host.put(UNIT_PATH, hand_edited.encode())
    fk.sh(sim, "systemctl", "daemon-reload")
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    text = text.replace('path = "/models/Kimi-K2.6"', f'path = "{STALL_WEIGHTS}"')
    view = variant(sim, "ct200-stall", text)
    try:
        r = cli(view, "apply", "ct200-stall", "--context", "200k", "--yes", "--json", timeout=300)
        assert r.returncode == ExitCode.OK, r.stdout + r.stderr
        events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        warm = next(e for e in events if e["kind"] == "outcome")["data"]["prewarm"]
        assert warm["files"] == shards, warm  # the FIFO is no weight file (read or not, by what is cached)
        assert re.search(rf"--model-path[= ]{STALL_WEIGHTS}\s", sim.unit_text())
        assert fk.verified_problems(sim, hand_edited, sim.unit_text()) == []
    finally:  # back to the baseline unit (the fault matrix reuses the host)
        sim.host.put(UNIT_PATH, old.encode())
        fk.sh(sim, "sh", "-c", "systemctl daemon-reload && systemctl restart sglang.service")
        wait_pool(sim)
        fk.sh(sim, "rm", "-rf", STALL_WEIGHTS, STALL_FACTS)


METRICS_DIR = "/srv/metrics-fault"  # the inventory's textfile folder
METRICS_VICTIM = "/srv/metrics-victim"  # where a link there points: nothing may be written in it


@pytest.mark.parametrize("link", ["folder", "file"])
def test_a_link_at_the_metrics_textfile_never_takes_the_write(sim, base, link):
    """The textfile folder is a link, or a link is planted as the textfile: the outcome is the same,
    nothing is written through the link (the agent runs as root)."""
    old, _ = base
    prom = f"{METRICS_DIR}/deployctl.prom"
    script = f"""set -e
rm -rf {METRICS_DIR} {METRICS_VICTIM}
mkdir -p {METRICS_VICTIM}
printf 'keep\\n' > {METRICS_VICTIM}/target"""
    if link == "folder":
        script += f"\nln -s {METRICS_VICTIM} {METRICS_DIR}"
    else:
        script += f"\nmkdir {METRICS_DIR}\nln -s {METRICS_VICTIM}/target {prom}"
    fk.sh(sim, "sh", "-c", script)
    text = (sim.units_dir / f"{sim.name}.toml").read_text() + f'\n[metrics]\npath = "{prom}"\n'
    view = variant(sim, "ct200-metricslink", text)
    try:
        r = cli(view, "apply", "ct200-metricslink", "--context", "200k", "--yes")
        assert r.returncode == ExitCode.OK, r.stdout + r.stderr
        said = r.stdout + r.stderr
        victim = fk.sh(sim, "sh", "-c", f"ls -A {METRICS_VICTIM}; cat {METRICS_VICTIM}/target").split()
        assert victim == ["target", "keep"], victim  # nothing written, nothing created through the link
        if link == "folder":
            assert f"metrics not written to {prom}" in said, said
            # the folder is opened with O_DIRECTORY | O_NOFOLLOW: a link to a folder is "not a directory"
            assert f"Not a directory: '{METRICS_DIR}'" in said, said
        else:
            assert "metrics not written" not in said, said
            kind = fk.sh(sim, "stat", "-c", "%F %a %u", prom).strip()
            assert kind == "regular file 644 0", kind  # the link was replaced by the textfile itself
            assert "deployctl_last_run_outcome" in sim.host.read(prom).decode()
        assert parse_unit_flags(sim.unit_text())["context-length"] == NEW_CONTEXT
        assert fk.verified_problems(sim, old, sim.unit_text()) == []
    finally:
        fk.sh(sim, "rm", "-rf", METRICS_DIR, METRICS_VICTIM)


STAGED_DIR = "/var/lib/deployctl/staged"
# Run by Python's site at every start (.pth import lines run under -I too): a process of a runner's unit
# (deployctl-<txn>.service) is SIGKILLed in its start-up, before it reads anything.
KILL_RUNNER_PTH = (
    "import os, signal; os.kill(os.getpid(), signal.SIGKILL) "
    "if 'deployctl-' in open('/proc/self/cgroup').read() else None\n"
)


def test_a_runner_killed_before_it_took_its_staged_secrets_leaves_none_behind(sim, base):
    """The runner is killed in its start-up, before it reads the secret values staged for it: nothing
    changes, nothing restarts, and no staged value is left behind on the host."""
    old, _ = base
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    text = text.replace("[unit]\n", '[unit]\nenvironment = { HF_TOKEN = "staged-token-1" }\n')
    text = text.replace("[sglang.flags]\n", '[sglang.flags]\napi-key = "staged-key-1"\n')
    view = variant(sim, "ct200-staged", text)
    site = fk.sh(sim, "python3", "-c", "import site; print(site.getsitepackages()[0])").strip()
    pth = f"{site}/zz-deployctl-fault.pth"
    sim.host.put(pth, KILL_RUNNER_PTH.encode())
    before = invocation(sim)
    try:
        r = cli(view, "apply", "ct200-staged", "--context", "200k", "--yes")
        said = r.stdout + r.stderr
        assert r.returncode == ExitCode.REFUSED, said
        assert "the agent died before it changed anything" in said, said
        assert sim.unit_text() == old and invocation(sim) == before  # nothing changed, nothing restarted
        assert fk.sh(sim, "stat", "-c", "%a %u", STAGED_DIR).strip() == "700 0"  # root's alone
        left = fk.sh(sim, "sh", "-c", "grep -rlE 'staged-(token|key)-1' /var/lib/deployctl || true").split()
        assert left == [], left  # the values are gone from the host, not merely unreadable
    finally:
        fk.sh(sim, "rm", "-f", pth)
        if sim.unit_text() != old:  # the fault missed: back to the baseline unit, without secrets
            sim.host.put("/etc/systemd/system/sglang.service", old.encode())
            fk.sh(sim, "sh", "-c", f"rm -f {SECRET_DIR}/sglang.service.* && systemctl daemon-reload")
            fk.sh(sim, "systemctl", "restart", "sglang.service")
            wait_pool(sim)
