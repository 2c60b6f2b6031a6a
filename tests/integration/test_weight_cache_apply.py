"""[weight_cache] end to end on the simulated ct200: the real CLI applies changes to an engine in client mode
and its weight-cache daemon's unit (agent/host/roles/daemon.py), and systemd runs both. A re-size restarts
only the engine (the daemon's InvocationID is kept and the engine maps its weights), a dtype change
restarts both, a rollback puts the daemon's unit back and restarts it, and a runner killed after the
restart is recovered with the daemon's unit of before."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from agent.exitcodes import ExitCode
from agent.inventory import load_host
from agent.render import render_unit, template_dir
from agent.sglang.flags import parse_unit_flags
from tests import faultkit as fk
from tests.integration.conftest import cli, invocation, popen, variant, wait_pool
from tests.simhost import SimHost

pytestmark = pytest.mark.integration

NAME = "ct200-wc"
DAEMON = "sglang-weight-cache.service"
DAEMON_FILE = f"/etc/systemd/system/{DAEMON}"
IPC = "Loaded model via IPC (mode=client)"


@pytest.fixture(scope="module")
def wc(sim: SimHost) -> Iterator[SimHost]:
    """The sim host through an inventory with [weight_cache] on and no draft model (SGLang refuses the
    weight cache with speculative decoding), its service switched to client mode by a first apply."""
    text = (sim.units_dir / "ct200-sim.toml").read_text()
    text = (
        re.sub(r"(?ms)^\[draft\]\n.*?(?=^\[)", "", text)
        + "\n[weight_cache]\nenabled = true\ntimeout_s = 120\n"
    )
    host = variant(sim, NAME, text)
    # The seed's unit runs DFLASH, whose draft the facts cannot read here: start the same service without
    # it first, by hand (the baseline an operator would have before turning the weight cache on).
    cfg = load_host(NAME, host.units_dir)
    plain = cfg.model_copy(update={"weight_cache": cfg.weight_cache.model_copy(update={"enabled": False})})
    host.host.put(fk.UNIT, render_unit(plain, {}, template_dir()).encode())
    fk.sh(host, "systemctl", "daemon-reload")
    fk.sh(host, "systemctl", "restart", "sglang.service")
    wait_pool(host)
    r = apply(host, "100k")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    yield host


def apply(host: SimHost, context: str, *extra: str):  # type: ignore[no-untyped-def]
    return cli(host, "apply", NAME, "--context", context, "--yes", *extra, timeout=300)


def daemon_invocation(host: SimHost) -> str:
    return fk.sh(host, "systemctl", "show", "-p", "InvocationID", "--value", DAEMON).strip()


def active(host: SimHost, unit: str) -> str:
    return host.host.ssh(["systemctl", "is-active", unit]).stdout.decode().strip()


def daemon_text(host: SimHost) -> str:
    return host.host.read(DAEMON_FILE).decode()


def engine_log(host: SimHost) -> str:
    """The running engine's own start, as journald has it."""
    return fk.sh(host, "journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation(host)}")


def test_a_resize_restarts_only_the_engine_a_dtype_change_both_and_a_rollback_puts_the_daemon_back(
    wc: SimHost,
) -> None:
    assert active(wc, DAEMON) == "active" and "--weight-cache-mode client" in wc.unit_text()
    assert IPC in engine_log(wc)  # the first start already mapped the daemon's weights
    daemon, engine = daemon_invocation(wc), invocation(wc)

    r = apply(wc, "150k")  # fraction and context only: the daemon's fingerprint is kept
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert daemon_invocation(wc) == daemon, "the daemon was restarted by a re-size"
    assert invocation(wc) != engine and IPC in engine_log(wc)
    kept = daemon_text(wc)

    r = apply(wc, "150k", "--set", "dtype=bfloat16")  # in SGLang's CacheConfig: both restart
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert "--dtype bfloat16" in daemon_text(wc) and daemon_invocation(wc) != daemon
    assert IPC in engine_log(wc)  # the new daemon holds what the new engine asks for
    backups = wc.host.root / "etc/systemd/system"
    assert any(p.read_text() == kept for p in backups.glob(f"{DAEMON}.bak.*"))
    changed = daemon_invocation(wc)

    r = cli(wc, "rollback", NAME, "--yes", timeout=300)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert daemon_text(wc) == kept and daemon_invocation(wc) != changed
    assert "dtype" not in parse_unit_flags(wc.unit_text()) and IPC in engine_log(wc)
    assert wait_pool(wc) > 0
    st = cli(wc, "status", NAME, timeout=120)  # the daemon's own state is shown beside the engine's
    assert f"weight-cache daemon {DAEMON}: active/running" in st.stdout, st.stdout + st.stderr
    assert "serves nothing" not in st.stdout


def test_a_runner_killed_after_the_restart_is_recovered_with_the_daemons_unit_of_before(wc: SimHost) -> None:
    old_engine, old_daemon = wc.unit_text(), daemon_text(wc)
    watcher = fk.Watcher(wc, "watch")
    proc = popen(wc, "apply", NAME, "--context", "120k", "--set", "dtype=float16", "--yes")
    hit = watcher.wait(timeout=240)
    assert "--dtype float16" in daemon_text(wc)  # stopped, then killed, with the new daemon running
    restarted = daemon_invocation(wc)
    fk.kill_runner(wc, hit.txn)
    proc.communicate(timeout=240)  # its follower finds the runner dead and recovers
    st = cli(wc, "status", NAME, timeout=300)  # recovers the killed change
    assert st.returncode == ExitCode.OK, st.stdout + st.stderr
    fk.wait_idle(wc, timeout=240)
    assert not fk.pending(wc)
    assert wc.unit_text() == old_engine and daemon_text(wc) == old_daemon
    assert daemon_invocation(wc) != restarted, "the daemon still runs the killed change's unit"
    assert active(wc, DAEMON) == "active" and IPC in engine_log(wc) and wait_pool(wc) > 0
