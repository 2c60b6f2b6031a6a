"""End to end over real SSH into a real systemd host: apply, no-op, automatic and manual rollback."""

from __future__ import annotations

import re

import pytest

from agent.exitcodes import ExitCode
from agent.sglang.flags import parse_unit_flags
from tests.integration.conftest import cli, invocation, server_info, wait_pool

pytestmark = pytest.mark.integration


def test_plan_and_dry_run_print_the_same_plan(sim):
    wait_pool(sim)
    unit = sim.unit_text()
    plan = cli(sim, "plan", sim.name, "--context", "200k")
    dry = cli(sim, "apply", sim.name, "--context", "200k", "--dry-run")
    assert plan.returncode == ExitCode.OK and dry.returncode == ExitCode.OK, (plan.stderr, dry.stderr)
    assert "predicted pool" in plan.stdout
    assert plan.stdout.strip() in dry.stdout + dry.stderr
    assert "dry run: nothing was changed" in dry.stdout + dry.stderr
    assert sim.unit_text() == unit


def test_raise_to_200k_in_one_restart_then_rerun_is_a_noop(sim):
    before = invocation(sim)
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes")
    assert r.returncode == ExitCode.OK, r.stderr
    pool = wait_pool(sim)
    assert pool >= 200_000
    assert invocation(sim) != before  # exactly one restart happened ...
    flags = parse_unit_flags(sim.unit_text())
    assert flags["context-length"] == "200000"
    assert len(sim.backups()) == 1
    assert f"measured pool:         {pool:,} tokens (meets the target)" in r.stdout
    assert re.search(r"smoke test: +60,0\d\d prompt tokens.*'Dog' \(passed\)", r.stdout)
    assert f"deployctl rollback {sim.name} --to {sim.backups()[0]}" in r.stdout
    # ... and running it again changes nothing: no restart, no new backup
    restarted = invocation(sim)
    again = cli(sim, "apply", sim.name, "--context", "200k", "--yes")
    assert again.returncode == ExitCode.OK, again.stderr
    assert "UP TO DATE" in again.stdout
    assert invocation(sim) == restarted
    assert len(sim.backups()) == 1
    quiet = cli(sim, "apply", sim.name, "--context", "200k", "--yes", "--quiet")
    assert quiet.returncode == ExitCode.OK and quiet.stdout == ""


def test_target_the_pool_cannot_meet_rolls_back_to_a_healthy_old_service(sim):
    wait_pool(sim)
    old_unit, old_pool = sim.unit_text(), wait_pool(sim)
    refused = cli(sim, "apply", sim.name, "--context", "400k", "--yes")
    assert refused.returncode == ExitCode.USAGE and "cannot reach 400,000" in refused.stderr
    assert sim.unit_text() == old_unit
    r = cli(sim, "apply", sim.name, "--context", "400k", "--yes", "--force", "--allow-longer-context")
    assert r.returncode == ExitCode.ROLLED_BACK, r.stderr
    assert "ROLLED BACK" in r.stdout and "< target 400,000" in r.stdout
    assert "next recommendation:" in r.stdout
    assert sim.unit_text() == old_unit
    assert wait_pool(sim) == old_pool
    assert server_info(sim)["context_length"] == int(parse_unit_flags(old_unit)["context-length"])


def test_manual_rollback_to_a_chosen_backup_is_itself_reversible(sim):
    current = sim.unit_text()
    first = sim.backups()[0]
    listing = cli(sim, "backups", sim.name)
    assert listing.returncode == ExitCode.OK and first in listing.stdout
    r = cli(sim, "rollback", sim.name, "--to", first, "--yes")
    assert r.returncode == ExitCode.OK, r.stderr
    assert sim.unit_text() == sim.host.read(f"/etc/systemd/system/{first}").decode()
    assert wait_pool(sim) < 200_000
    undo = re.search(r"deployctl rollback \S+ --to (\S+)", r.stdout)
    assert undo, r.stdout
    back = cli(sim, "rollback", sim.name, "--to", undo.group(1), "--yes")
    assert back.returncode == ExitCode.OK, back.stderr
    assert sim.unit_text() == current


def test_cron_mode_refuses_without_yes_and_prints_plain_lines(sim):
    unit = sim.unit_text()
    r = cli(sim, "apply", sim.name, "--context", "190k")
    assert r.returncode == ExitCode.USAGE
    assert "not on a terminal" in r.stderr and "--yes" in r.stderr
    assert sim.unit_text() == unit
    assert "\x1b[" not in r.stderr + r.stdout


def test_a_unit_written_but_not_running_as_written_is_finished(sim):
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes")
    assert r.returncode == ExitCode.OK, r.stderr
    backups, unit, before = sim.backups(), sim.unit_text(), invocation(sim)
    # As if an earlier run died between writing the unit and restarting: systemd has not reloaded it.
    sim.host.ssh(["touch", "/etc/systemd/system/sglang.service"])
    show = sim.host.ssh(["systemctl", "show", "-p", "NeedDaemonReload", "--value", "sglang.service"])
    assert show.stdout.decode().strip() == "yes"
    r = cli(sim, "apply", sim.name, "--context", "200k", "--yes")
    assert r.returncode == ExitCode.OK, r.stderr
    assert "APPLIED" in r.stdout and "not running as written" in r.stderr
    assert invocation(sim) != before and sim.unit_text() == unit
    assert sim.backups() == backups  # nothing new to keep: the way back is the earlier backup
