"""End to end over real SSH: host keys, unreachable hosts, a fresh host's bundle, cron and terminal use,
a dropped connection with re-attach, and the rollback/backups/status commands."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agent.exitcodes import ExitCode
from agent.remote import bundle
from tests import simhost
from tests.integration.conftest import DEPLOYCTL, invocation, wait_for, wait_pool
from tests.testhost.instance import free_ports

pytestmark = pytest.mark.integration

BIN = "/var/lib/deployctl/bin"
TXN = "/var/lib/deployctl/txn"
PLAIN_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} ct200-sim (->|!!) \S")


# -- helpers ------------------------------------------------------------------------------------
def deployctl(
    sim: simhost.SimHost,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: int | None = subprocess.DEVNULL,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """The real CLI as cron starts it: no terminal, stdin empty (or closed with stdin=-1)."""
    full = {**os.environ, **sim.env, **(env or {})}
    if stdin == -1:  # fd 0 closed, as some schedulers leave it
        return subprocess.run(
            ["/bin/sh", "-c", 'exec "$@" 0<&-', "sh", DEPLOYCTL, *args],
            env=full, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    return subprocess.run(
        [DEPLOYCTL, *args], env=full, capture_output=True, text=True, timeout=timeout, stdin=stdin
    )


def spawn(sim: simhost.SimHost, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [DEPLOYCTL, *args],
        env={**os.environ, **sim.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def on_host(sim: simhost.SimHost, *argv: str) -> str:
    return sim.host.ssh(list(argv)).stdout.decode()


def txn_dirs(sim: simhost.SimHost) -> set[str]:
    root = sim.host.root / TXN.lstrip("/")
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def sglang_starts(sim: simhost.SimHost) -> int:
    """How many times systemd has started the service since the host booted."""
    text = on_host(sim, "journalctl", "-u", "sglang.service", "-o", "cat", "--no-pager")
    return sum(1 for line in text.splitlines() if line.startswith("Started sglang.service"))


def deployctl_journal(sim: simhost.SimHost) -> str:
    return on_host(sim, "journalctl", "-t", "deployctl", "-o", "cat", "--no-pager")


def ssh_config_with(sim: simhost.SimHost, known_hosts: Path) -> dict[str, str]:
    """The sim's ssh config, but checking host keys against `known_hosts`."""
    path = sim.work / f"ssh_config.{known_hosts.name}"
    path.write_text(sim.ssh_config.read_text().replace(str(sim.host.known_hosts_path), str(known_hosts)))
    return {"DEPLOYCTL_SSH_CONFIG": str(path)}


def inventory_with(sim: simhost.SimHost, name: str, target: str) -> dict[str, str]:
    """A copy of the sim's inventory with one more host at `target`, tried twice, 2 s per attempt."""
    units = sim.work / "units-unreachable"
    units.mkdir(exist_ok=True)
    for p in sim.units_dir.glob("*.toml"):
        (units / p.name).write_text(p.read_text())
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    text = text.replace('target = "ct200-sim"', f'target = "{target}"\nconnect_attempts = 2')
    (units / f"{name}.toml").write_text(text.replace("sudo = false", "sudo = false\nconnect_timeout_s = 2"))
    return {"DEPLOYCTL_UNITS": str(units)}


def drop_deployctl_connections(sim: simhost.SimHost) -> None:
    """Kill the sshd processes serving deployctl's sessions, as a dropped network link would end them."""
    # This ssh's own session is one of them: it ends with "closed by remote host", as intended.
    sim.host.ssh(["pkill", "-KILL", "-f", "sshd: root@notty"])


def one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("deployctl: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def run_on_pty(
    sim: simhost.SimHost, *args: str, answer: bytes | None = None, timeout: float = 120
) -> tuple[int, bytes]:
    """Run deployctl with a pseudo-terminal as stdin, stdout and stderr; answer its prompt if asked."""
    master, slave = pty.openpty()
    env = {**os.environ, **sim.env, "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [DEPLOYCTL, *args], env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    seen, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not chunk:
                break
            seen += chunk
            if answer is not None and b"[y/N]" in seen:
                os.write(master, answer)
                answer = None
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), seen
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def slow_start(sim: simhost.SimHost):  # type: ignore[no-untyped-def]
    """Weights load this long at the next restart, so a test can act while the transaction watches."""

    def set_slow(seconds: float | None) -> None:
        sim.set_sim_env({"SGLANG_SIM_LOAD_SECONDS": str(seconds)} if seconds else {})

    try:
        yield set_slow
    finally:
        set_slow(None)


# -- a fresh host ---------------------------------------------------------------------------
def current_bundle() -> tuple[str, str]:
    """The bundle this checkout builds now: its name on the host and its sha256."""
    _, sha = bundle.build.__wrapped__()
    return bundle.remote_name(sha), sha


def test_a_fresh_host_gets_the_agent_bundle_and_a_damaged_one_is_replaced(sim):
    bin_dir = sim.host.root / BIN.lstrip("/")
    assert not bin_dir.exists()  # nothing installed by hand
    first = deployctl(sim, "status", sim.name)
    assert first.returncode == ExitCode.OK, first.stderr
    bundles = list(bin_dir.glob("agent-*.pyz"))
    assert len(bundles) == 1
    sha = hashlib.sha256(bundles[0].read_bytes()).hexdigest()
    assert bundles[0].name == f"agent-{sha[:16]}.pyz"  # named by its checksum
    # damaged in place, then swapped for another bundle under the same name: each run puts it right
    good = bundles[0].read_bytes()
    for bad in (good[: len(good) // 2], good.replace(b"tenacity", b"tenacitx")):
        name, sha = current_bundle()
        sim.host.put(f"{BIN}/{name}", bad)
        again = deployctl(sim, "status", sim.name)
        assert again.returncode == ExitCode.OK, again.stderr
        assert hashlib.sha256((bin_dir / name).read_bytes()).hexdigest() == sha


# -- host keys ------------------------------------------------------------------------------
def test_unknown_host_key_is_refused_then_accepted_once_and_a_changed_key_always_refused(sim):
    known = sim.work / "known_hosts.e2e"
    env = ssh_config_with(sim, known)
    unit, txns, started = sim.unit_text(), txn_dirs(sim), invocation(sim)
    refused = deployctl(sim, "apply", sim.name, "--context", "190k", "--yes", env=env)
    assert refused.returncode == ExitCode.UNREACHABLE
    line = one_error(refused.stderr)
    address = f"127.0.0.1:{sim.host.ssh_port}"
    assert f"{sim.name}: unknown host key for {address}: ssh-ed25519 {sim.host.host_key_fingerprint}" in line
    assert "deployctl: hint:" in refused.stderr and "--accept-new-host-key" in refused.stderr
    assert refused.stdout == ""
    assert (sim.unit_text(), txn_dirs(sim), invocation(sim)) == (unit, txns, started)
    assert not known.exists()

    accepted = deployctl(sim, "status", sim.name, "--accept-new-host-key", env=env)
    assert accepted.returncode == ExitCode.OK, accepted.stderr
    recorded = known.read_text()
    assert f"[127.0.0.1]:{sim.host.ssh_port} ssh-ed25519 " in recorded
    later = deployctl(sim, "status", sim.name, env=env)
    assert later.returncode == ExitCode.OK, later.stderr

    # a different key on record: the host now looks like an impostor, with or without the flag
    other = sim.work / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    other_b64 = (other.with_suffix(".pub")).read_text().split()[1]
    known.write_text(re.sub(r"ssh-ed25519 \S+", f"ssh-ed25519 {other_b64}", recorded))
    for extra in ((), ("--accept-new-host-key",)):
        changed = deployctl(sim, "backups", sim.name, *extra, env=env)
        assert changed.returncode == ExitCode.UNREACHABLE
        line = one_error(changed.stderr)
        assert f"{sim.name}: host key for {address} changed" in line
        assert sim.host.host_key_fingerprint in line and "refusing" in line
    assert other_b64 in known.read_text() and recorded not in known.read_text()


# -- unreachable hosts ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "cause"),
    [("closed", "connection refused (after 2 attempts)"), ("root@no-such-host.invalid", "cannot resolve")],
)
def test_an_unreachable_host_fails_fast_in_one_line(sim, target, cause):
    if target == "closed":
        (port,) = free_ports(1)  # nothing listens there
        target = f"root@127.0.0.1:{port}"
    env = inventory_with(sim, "gone", target)
    t0 = time.monotonic()
    r = deployctl(sim, "apply", "gone", "--context", "200k", "--yes", env=env)
    elapsed = time.monotonic() - t0
    assert r.returncode == ExitCode.UNREACHABLE
    line = one_error(r.stderr)
    assert line.startswith("deployctl: error: gone: ") and cause in line
    assert target.split("@", 1)[1].split(":")[0] in line
    assert elapsed < 10, elapsed
    assert r.stdout == ""


# -- cron -----------------------------------------------------------------------------------
def test_cron_needs_yes_and_never_prompts(sim):
    unit = sim.unit_text()
    for stdin in (subprocess.DEVNULL, -1):
        r = deployctl(sim, "apply", sim.name, "--context", "180k", stdin=stdin)
        assert r.returncode == ExitCode.USAGE, r.stderr
        assert "not on a terminal and --yes not given" in one_error(r.stderr)
        assert "[y/N]" not in r.stdout + r.stderr
    for bad in (("apply", sim.name, "--context", "lots", "--yes"), ("apply", "nosuch", "--context", "1k")):
        r = deployctl(sim, *bad)
        assert r.returncode == ExitCode.USAGE and one_error(r.stderr)
    assert sim.unit_text() == unit


def test_cron_outcomes_plain_lines_json_quiet_exit_codes_and_the_hosts_journal(sim):
    applied = deployctl(sim, "apply", sim.name, "--context", "180k", "--yes")
    assert applied.returncode == ExitCode.OK, applied.stderr
    assert "APPLIED" in applied.stdout and "measured pool:" in applied.stdout  # the report on stdout
    progress = [line for line in applied.stderr.splitlines() if PLAIN_LINE.match(line)]
    assert any("-> done: " in line for line in progress) and len(progress) >= 8
    assert "\r" not in applied.stderr + applied.stdout and "\x1b" not in applied.stderr + applied.stdout

    noop = deployctl(sim, "apply", sim.name, "--context", "180k", "--yes", "--json")
    assert noop.returncode == ExitCode.OK, noop.stderr
    events = [json.loads(line) for line in noop.stdout.splitlines()]
    assert events and all(e["kind"] in ("step", "progress", "log", "warning", "outcome") for e in events)
    assert events[-1]["kind"] == "outcome" and events[-1]["data"]["outcome"] == "up_to_date"
    assert len({e["txn"] for e in events}) == 1

    quiet = deployctl(sim, "apply", sim.name, "--context", "180k", "--yes", "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (ExitCode.OK, "", "")

    forced = deployctl(
        sim, "apply", sim.name, "--context", "400k", "--yes", "--force", "--allow-longer-context", "--json"
    )
    assert forced.returncode == ExitCode.ROLLED_BACK, forced.stderr
    last = json.loads(forced.stdout.splitlines()[-1])
    assert last["kind"] == "outcome" and last["data"]["outcome"] == "rolled_back"
    assert all(json.loads(line) for line in forced.stdout.splitlines())

    assert noop.stderr == "" and forced.stderr == ""

    # the crontab line itself, in cron's bare environment: back at 180k, so it prints nothing
    bare = {"HOME": os.environ.get("HOME", "/root"), "LOGNAME": "root", "PATH": "/usr/bin:/bin", **sim.env}
    line = f"{DEPLOYCTL} apply {sim.name} --context 180k --yes --quiet"
    cron = subprocess.run(
        ["/bin/sh", "-c", line],
        env=bare,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (cron.returncode, cron.stdout, cron.stderr) == (ExitCode.OK, "", "")

    journal = deployctl_journal(sim)
    for event in (events[-1], last):
        assert f"{event['message']} (transaction {event['txn']})" in journal
    assert re.search(r"applied: KV pool [\d,]+ tokens, server ready \(transaction ", journal)


# -- a dropped connection -------------------------------------------------------------------
def reached(sim: simhost.SimHost, txn: str, stage: str) -> bool:
    """Whether this transaction has logged an event of this stage."""
    path = sim.host.root / TXN.lstrip("/") / txn / "events.jsonl"
    return path.is_file() and f'"stage": "{stage}"' in path.read_text()


def test_a_dropped_connection_is_re_attached_to_status_follows_and_a_second_change_is_locked(sim, slow_start):
    wait_pool(sim)
    slow_start(12)
    txns, starts = txn_dirs(sim), sglang_starts(sim)
    first = spawn(sim, "apply", sim.name, "--context", "150k", "--yes")
    try:
        wait_for(lambda: len(txn_dirs(sim) - txns) == 1, timeout=60)
        (txn,) = txn_dirs(sim) - txns
        wait_for(lambda: reached(sim, txn, "watch"), timeout=60)
        drop_deployctl_connections(sim)
        st = deployctl(sim, "status", sim.name)
        assert st.returncode == ExitCode.OK, st.stderr
        assert f"running: apply transaction {txn}" in st.stdout and "--follow" in st.stdout
        follower = spawn(sim, "status", sim.name, "--follow")
        other = deployctl(sim, "apply", sim.name, "--context", "120k", "--yes")
        assert other.returncode == ExitCode.LOCKED, other.stderr
        assert "LOCKED" in other.stdout and txn in other.stdout + other.stderr
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    # The apply itself re-attached (it used to end with exit 3 and "re-run to re-attach") and reports
    # its own transaction's outcome.
    assert first.returncode == ExitCode.OK, err
    assert "connection lost during apply" in err and "re-attaching" in err
    assert "APPLIED" in out and "-> done: " in err
    f_out, f_err = follower.communicate(timeout=60)
    assert follower.returncode == ExitCode.OK, f_err
    assert f"last transaction {txn}: applied" in f_out and "running:" not in f_out
    assert "-> done: " in f_err
    assert txn_dirs(sim) - txns == {txn}  # no second transaction
    assert sglang_starts(sim) == starts + 1  # and one restart
    journal = deployctl_journal(sim)
    assert f"server ready (transaction {txn})" in journal
    assert re.search(r"locked: held by pid \d+ .*transaction " + txn, journal)
    slow_start(None)


# -- a terminal -----------------------------------------------------------------------------
def test_on_a_terminal_apply_asks_and_no_changes_nothing_and_yes_shows_a_live_line(sim, slow_start):
    wait_pool(sim)
    unit, txns = sim.unit_text(), txn_dirs(sim)
    rc, seen = run_on_pty(sim, "apply", sim.name, "--context", "170k", answer=b"n\n")
    assert rc == ExitCode.USAGE, seen.decode(errors="replace")
    assert b"restart sglang.service? [y/N]" in seen and b"not confirmed; nothing was changed" in seen
    assert (sim.unit_text(), txn_dirs(sim)) == (unit, txns)

    slow_start(3)
    rc, seen = run_on_pty(sim, "apply", sim.name, "--context", "170k", "--yes")
    slow_start(None)
    text = seen.decode(errors="replace")
    assert rc == ExitCode.OK, text
    assert "[y/N]" not in text
    redraws = text.count("\r\x1b[2K")
    assert redraws >= 5 and "loading_weights" in text, text
    assert "APPLIED" in text


# -- rollback, backups, status --------------------------------------------------------------
def test_rollback_without_to_restores_the_newest_backup(sim):
    wait_pool(sim)
    listing = deployctl(sim, "backups", sim.name)
    assert listing.returncode == ExitCode.OK, listing.stderr
    names = re.findall(r"^  (sglang\.service\.bak\.\S+)", listing.stdout, re.M)
    assert len(names) >= 2 and names == sorted(names, reverse=True)  # newest first
    assert sorted(names) == sim.backups()
    assert re.search(r"--context-length: \d+ in the backup, \d+ installed", listing.stdout)
    newest = sim.host.read(f"/etc/systemd/system/{names[0]}").decode()

    r = deployctl(sim, "rollback", sim.name, "--yes")
    assert r.returncode == ExitCode.OK, r.stderr
    assert f"rollback of {sim.name} to {names[0]}" in r.stderr
    assert sim.unit_text() == newest
    wait_pool(sim)

    st = deployctl(sim, "status", sim.name)
    assert st.returncode == ExitCode.OK, st.stderr
    lines = st.stdout.splitlines()
    assert lines[0] == f"{sim.name} sglang.service: active/running"
    assert re.match(r"  last transaction \S+: applied at \d{4}-\d\d-\d\dT", lines[1]), st.stdout


# -- one agent call -----------------------------------------------------------------------------
class CountingTransport:
    """The real SSH transport, counting the commands deployctl starts on the host."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("run", "stream", "converse", "put"):
            self.calls.append(name)
        return getattr(self.inner, name)


def _apply_in_process(
    sim: simhost.SimHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], context: str
) -> tuple[CountingTransport, list[dict[str, Any]]]:
    import agent.orchestrate.session
    from agent.cli import main as cli_main

    for key, value in sim.env.items():
        monkeypatch.setenv(key, value)
    opened: list[CountingTransport] = []
    real_open = agent.orchestrate.session.open_transport

    def counting_open(*args: Any) -> Any:
        opened.append(CountingTransport(real_open(*args)))
        return opened[-1]

    monkeypatch.setattr(agent.orchestrate.session, "open_transport", counting_open)
    capsys.readouterr()
    rc = cli_main.main(["apply", sim.name, "--context", context, "--yes", "--json"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert rc == ExitCode.OK, events[-3:]
    return opened[0], events


def _runner_logged(sim: simhost.SimHost, txn: str) -> str:
    """What systemd logged about the transaction's transient runner unit (empty: there was none)."""
    argv = ["journalctl", "--no-pager", "-o", "cat", "-u", f"deployctl-{txn}.service"]
    return sim.host.ssh(argv).stdout.decode()


def test_facts_and_the_apply_share_one_agent_call_and_a_no_op_starts_no_runner(sim, monkeypatch, capsys):
    changed, events = _apply_in_process(sim, monkeypatch, capsys, "190k")
    assert events[-1]["data"]["outcome"] == "applied"
    assert changed.calls == ["converse"]  # facts, then the apply planned from them: one agent process
    assert "deployctl apply" in _runner_logged(sim, events[-1]["txn"])  # a change runs detached

    same, events = _apply_in_process(sim, monkeypatch, capsys, "190k")
    assert events[-1]["data"]["outcome"] == "up_to_date"
    assert same.calls == ["converse"]
    assert "deployctl" not in _runner_logged(sim, events[-1]["txn"])  # answered in the agent's own process
    status = json.loads(deployctl(sim, "status", sim.name, "--json").stdout)
    assert status["last_txn"] == events[-1]["txn"]  # recorded as any run is
    assert status["last_outcome"]["data"]["outcome"] == "up_to_date"
