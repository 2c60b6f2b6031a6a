"""deployctl fleet on real Ansible, real systemd and real SSH: several test hosts at once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import load_host
from agent.plan.choose import Target
from agent.plan.from_facts import plan_for_host
from agent.sglang.flags import parse_unit_flags
from tests import fleethosts, testhost
from tests.fleethosts import Fleet, HostSpec
from tests.integration.conftest import DEPLOYCTL

pytestmark = pytest.mark.integration
BASELINE_POOL = 101_134  # the simulated ct200 at 0.85
# The new unit's start (context 200000) crashes while loading; the restored baseline starts cleanly.
CRASH_AT_200K = {"SGLANG_SIM_FAULT": "crash_loading", "SGLANG_SIM_FAULT_WHEN_CONTEXT": "200000"}
# Lighter weights than the inventory says: the architecture's guess asks for more memory than needed.
LIGHT = {"SGLANG_SIM_WEIGHTS_GIB": "66.0"}
BIN = Path(DEPLOYCTL).parent
COLLECTION = Path(__file__).resolve().parents[2] / "agent/fleet/ansible_collections/deployctl/sglang"


def _boot(specs: list[HostSpec]) -> Fleet:
    missing = testhost.missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    try:
        return fleethosts.boot(specs)
    except testhost.TestHostUnavailable as exc:
        pytest.skip(f"test host unavailable: {exc}")


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Four hosts at the baseline in ct-fleet, three never-started light hosts in fresh."""
    specs = [HostSpec(f"f{i}", ("ct-fleet", "blackwell")) for i in range(1, 5)]
    specs += [HostSpec(f"n{i}", ("fresh",), LIGHT, started=False) for i in range(1, 4)]
    f = _boot(specs)
    try:
        yield f
    finally:
        f.stop()


def fleet_cli(f: Fleet, *args: str, units: Path | None = None) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, **f.env}
    if units is not None:
        env["DEPLOYCTL_UNITS"] = str(units)
    proc = subprocess.run(
        [DEPLOYCTL, "fleet", *args, "--json"], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    report = next((e for e in lines if e.get("kind") == "report" or "hosts" in e), {})
    return proc.returncode, report, proc.stdout + proc.stderr


def by_host(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in report["hosts"]}


def invocation(f: Fleet, name: str) -> str:
    out = f.hosts[name].ssh(["systemctl", "show", "-p", "InvocationID", "--value", "sglang.service"])
    return out.stdout.decode().strip()


def test_a_host_short_in_a_later_batch_halts_there(fleet: Fleet) -> None:
    fleet.set_sim_env("f3", CRASH_AT_200K)
    before = {h: fleet.unit(h) for h in ("f3", "f4")}
    f4_invocation = invocation(fleet, "f4")
    rc, report, output = fleet_cli(fleet, "apply", "ct-fleet", "--context", "200k", "--batch", "2", "--yes")
    assert rc == 4, output
    hosts = by_host(report)
    assert hosts["f1"]["outcome"] == "applied" and hosts["f2"]["outcome"] == "applied", output
    assert hosts["f3"]["outcome"] == "rolled_back" and hosts["f3"]["failed"], output
    assert report["untouched"] == ["f4"] and report["halted"]
    # The host after the failing batch: not touched at all. The failing one: its old unit, serving.
    assert fleet.unit("f4") == before["f4"] and invocation(fleet, "f4") == f4_invocation
    assert fleet.backups("f4") == []
    assert fleet.unit("f3") == before["f3"]
    assert parse_unit_flags(fleet.unit("f3").decode())["context-length"] == "32768"
    status = fleet.hosts["f3"].ssh(["systemctl", "is-active", "sglang.service"]).stdout.decode().strip()
    assert status == "active"
    # The canary's measurement planned f2: predicted against measured is in the report.
    assert hosts["f2"]["plan"]["calibrated_from"] == ["canary f1", "own start"]
    # Identical hosts: planned from the canary's start plus their own, they get the canary's flags.
    keys = ("mem-fraction-static", "max-running-requests", "context-length")
    assert [hosts["f2"]["after"][k] for k in keys] == [hosts["f1"]["after"][k] for k in keys]
    assert hosts["f2"]["measured_pool"] >= 200_000


def test_the_rollout_finishes_once_the_fault_is_gone_then_is_a_no_op(fleet: Fleet) -> None:
    fleet.set_sim_env("f3", {})
    rc, report, output = fleet_cli(fleet, "apply", "ct-fleet", "--context", "200k", "--batch", "2", "--yes")
    assert rc == 0, output
    hosts = by_host(report)
    assert [hosts[h]["outcome"] for h in ("f1", "f2", "f3", "f4")] == [
        "up_to_date", "up_to_date", "applied", "applied",
    ], output  # fmt: skip
    assert all(hosts[h]["measured_pool"] >= 200_000 for h in ("f3", "f4"))
    assert hosts["f4"]["revert"].startswith("deployctl rollback f4 --to sglang.service.bak.")
    units = {h: fleet.unit(h) for h in hosts}
    backups = {h: fleet.backups(h) for h in hosts}
    invocations = {h: invocation(fleet, h) for h in hosts}
    rc, report, output = fleet_cli(fleet, "apply", "ct-fleet", "--context", "200k", "--batch", "2", "--yes")
    assert rc == 0, output
    assert {h["host"]: (h["outcome"], h["changed"]) for h in report["hosts"]} == {
        h: ("up_to_date", False) for h in units
    }
    assert {h: fleet.unit(h) for h in units} == units
    assert {h: fleet.backups(h) for h in units} == backups
    assert {h: invocation(fleet, h) for h in units} == invocations


def test_status_shows_no_drift_and_the_measured_pools(fleet: Fleet) -> None:
    rc, report, output = fleet_cli(fleet, "status", "ct-fleet", "--context", "200k")
    assert rc == 0, output
    rows = by_host(report)
    assert set(rows) == {"f1", "f2", "f3", "f4"}
    assert not any(r["drift"] for r in rows.values()), output
    assert all(r["measured_pool"] >= 200_000 for r in rows.values())
    rc, report, output = fleet_cli(fleet, "status", "ct-fleet", "--context", "300k")
    assert all(r["drift"] for r in by_host(report).values()), output
    # No target given: against the context each host was last deployed to.
    rc, report, output = fleet_cli(fleet, "status", "ct-fleet")
    assert rc == 0 and {(r["drift"], r["drift_against"]) for r in by_host(report).values()} == {
        (False, 200_000)
    }


def test_an_unreachable_host_counts_as_failed(fleet: Fleet, tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    for path in fleet.units_dir.glob("f*.toml"):
        (units / path.name).write_text(path.read_text())
    down = (fleet.units_dir / "f4.toml").read_text().replace('target = "f4"', 'target = "root@127.0.0.1:1"')
    (units / "f9.toml").write_text(down.replace("[ssh]\n", "[ssh]\nconnect_attempts = 1\n", 1))
    rc, report, output = fleet_cli(fleet, "apply", "ct-fleet", "--context", "200k", "--yes", units=units)
    assert rc == 3, output
    hosts = by_host(report)
    assert hosts["f9"]["outcome"] == "unreachable" and hosts["f9"]["failed"]
    assert all(hosts[h]["outcome"] == "up_to_date" for h in ("f1", "f2", "f3", "f4"))


def test_a_failing_canary_halts_before_any_other_host(fleet: Fleet) -> None:
    fleet.set_sim_env("f1", {**CRASH_AT_200K, "SGLANG_SIM_FAULT_WHEN_CONTEXT": "210000"})
    others = ("f2", "f3", "f4")
    units = {h: fleet.unit(h) for h in ("f1", *others)}
    invocations = {h: invocation(fleet, h) for h in others}
    backups = {h: fleet.backups(h) for h in others}
    try:
        rc, report, output = fleet_cli(
            fleet, "apply", "ct-fleet", "--context", "210k", "--batch", "3", "--yes"
        )
    finally:
        fleet.set_sim_env("f1", {})
    assert rc == 4, output
    assert [h["host"] for h in report["hosts"]] == ["f1"] and report["hosts"][0]["outcome"] == "rolled_back"
    assert report["untouched"] == list(others)
    assert {h: fleet.unit(h) for h in units} == units  # f1: its old unit again
    assert {h: invocation(fleet, h) for h in others} == invocations
    assert {h: fleet.backups(h) for h in others} == backups


def ansible(f: Fleet, tmp: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """An ad-hoc ansible run of one of the collection's modules on one host: its result."""
    inventory = tmp / "fleet.deployctl.yml"
    inventory.write_text(f"plugin: deployctl.sglang.units\nunits_dir: {f.units_dir}\n")
    env = {
        **os.environ,
        **f.env,
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTION.parents[2]),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",  # "host | CHANGED => {json}"
    }
    proc = subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    host, _, result = proc.stdout.partition(" => ")
    assert result, proc.stdout + proc.stderr
    return proc.returncode, {host.split(" |")[0]: json.loads(result)}


def test_check_mode_changes_nothing_and_sglang_rollback_restores(fleet: Fleet, tmp_path: Path) -> None:
    unit, backups = fleet.unit("f4"), fleet.backups("f4")
    rc, hosts = ansible(
        fleet, tmp_path, "f4", "-m", "deployctl.sglang.sglang_apply", "-a", "context=100k", "--check"
    )
    assert rc == 0 and hosts["f4"]["changed"] and hosts["f4"]["outcome"] == "would_change", hosts
    assert str(hosts["f4"]["after"]["context-length"]) == "100000"
    assert fleet.unit("f4") == unit and fleet.backups("f4") == backups
    rc, hosts = ansible(fleet, tmp_path, "f4", "-m", "deployctl.sglang.sglang_rollback")
    assert rc == 0 and hosts["f4"]["outcome"] == "applied", hosts
    assert parse_unit_flags(fleet.unit("f4").decode())["context-length"] == "32768"
    assert hosts["f4"]["measured_pool"] == BASELINE_POOL


def _watching(f: Fleet, name: str, since: float) -> bool:
    """Whether a transaction begun after `since` on the host is watching its start."""
    for events in (f.hosts[name].root / "var/lib/deployctl/txn").glob("*/events.jsonl"):
        try:
            if events.stat().st_mtime >= since and '"stage": "watch"' in events.read_text():
                return True
        except OSError:
            continue
    return False


def _session_of(f: Fleet, name: str, verb: str) -> int:
    """The host-side sshd process of the session that runs the agent following `verb` for the client."""
    root = f.hosts[name].root
    for status in root.glob("proc/[0-9]*/cmdline"):
        try:
            argv = status.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b".pyz") for a in argv) and argv[-2:-1] == [verb.encode()]:
            pid = int(status.parent.name)
            while pid > 1:
                comm = (root / f"proc/{pid}/comm").read_text().strip()
                if comm.startswith("sshd") and "root@" in (root / f"proc/{pid}/cmdline").read_text():
                    return pid
                pid = int((root / f"proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return 0


def test_a_dropped_connection_is_re_attached(fleet: Fleet, tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "f2.toml").write_text((fleet.units_dir / "f2.toml").read_text())
    fleet.set_sim_env("f2", {"SGLANG_SIM_LOAD_SECONDS": "8"})  # a start wide enough to cut into
    env = {**os.environ, **fleet.env, "DEPLOYCTL_UNITS": str(units)}
    argv = [DEPLOYCTL, "fleet", "apply", "ct-fleet", "--context", "100k", "--yes", "--json"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, started = time.monotonic() + 120, time.time()
        # the agent's session (facts, then the apply) once its transaction watches the new start
        while not (_watching(fleet, "f2", started) and (pid := _session_of(fleet, "f2", "session"))):
            assert proc.poll() is None and time.monotonic() < deadline, "the apply never started"
            time.sleep(0.05)
        fleet.hosts["f2"].ssh(["kill", "-KILL", str(pid)])
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        fleet.set_sim_env("f2", {})
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, out + err
    assert any(e.get("phase") == "reattach" for e in events), out
    (result,) = [e["result"] for e in events if e.get("kind") == "result"]
    assert result["outcome"] == "applied" and result["measured_pool"] >= 100_000
    assert parse_unit_flags(fleet.unit("f2").decode())["context-length"] == "100000"


def test_a_tolerated_failure_is_rolled_back_and_the_rollout_goes_on(fleet: Fleet) -> None:
    """Canary f1, then [f2, f3], [f4]; f3 fails: 1 of 2 is 50 %, which only --max-fail below 50 exceeds."""
    fleet.set_sim_env("f3", {**CRASH_AT_200K, "SGLANG_SIM_FAULT_WHEN_CONTEXT": "205000"})
    f3_unit, f4_unit, f4_invocation = fleet.unit("f3"), fleet.unit("f4"), invocation(fleet, "f4")
    apply = ("apply", "ct-fleet", "--context", "205k", "--batch", "2", "--yes", "--max-fail")
    try:
        rc, halted, output = fleet_cli(fleet, *apply, "49")
        assert rc == 4 and halted["halted"] and halted["untouched"] == ["f4"], output
        assert by_host(halted)["f3"]["outcome"] == "rolled_back", output
        assert fleet.unit("f4") == f4_unit and invocation(fleet, "f4") == f4_invocation
        f3_invocation = invocation(fleet, "f3")
        rc, report, output = fleet_cli(fleet, *apply, "50")
    finally:
        fleet.set_sim_env("f3", {})
    # Tolerated: every host ran, the failed one serves its old unit again, and the exit still says 4.
    assert rc == 4, output
    hosts = by_host(report)
    assert {h: hosts[h]["outcome"] for h in hosts} == {
        "f1": "up_to_date", "f2": "up_to_date", "f3": "rolled_back", "f4": "applied",
    }, output  # fmt: skip
    assert report["untouched"] == [] and not report["halted"] and report["exit_code"] == 4
    assert fleet.unit("f3") == f3_unit and invocation(fleet, "f3") != f3_invocation
    status = fleet.hosts["f3"].ssh(["systemctl", "is-active", "sglang.service"]).stdout.decode().strip()
    assert status == "active"
    assert fleet.unit("f4") != f4_unit
    assert parse_unit_flags(fleet.unit("f4").decode())["context-length"] == "205000"
    assert hosts["f4"]["measured_pool"] >= 205_000


def test_later_hosts_are_planned_from_the_canarys_measured_start(fleet: Fleet) -> None:
    rc, report, output = fleet_cli(fleet, "apply", "fresh", "--context", "200k", "--batch", "2", "--yes")
    assert rc == 0, output
    hosts = by_host(report)
    canary = hosts["n1"]
    assert canary["plan"]["basis"] == "architecture" and canary["plan"]["calibrated_from"] == []
    # Lighter weights than the inventory's guess: the canary measured more pool than predicted.
    assert canary["measured_pool"] > canary["plan"]["predicted_pool"] * 1.1
    cfg = load_host("n2", fleet.units_dir)
    implied = plan_for_host(cfg, Target(200_000), [canary["measured_start"]], dict(cfg.sglang.flags))
    for name in ("n2", "n3"):
        h = hosts[name]
        assert h["plan"]["calibrated_from"] == ["canary n1"], output
        assert h["plan"]["fraction"] == implied.mem_fraction_static < canary["plan"]["fraction"]
        flags = parse_unit_flags(fleet.unit(name).decode())
        assert float(flags["mem-fraction-static"]) == implied.mem_fraction_static
        # Predicted from the canary against measured on this host: within the planning margin.
        assert abs(h["measured_pool"] - h["plan"]["predicted_pool"]) < 0.02 * h["plan"]["predicted_pool"]


def test_the_inventory_plugin_serves_the_same_hosts_and_groups(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    base = (Path(__file__).resolve().parents[2] / "units/ct200-sim.toml").read_text()
    (units / "a.toml").write_text('groups = ["ct-fleet", "blackwell"]\n' + base)
    other = base.replace('target = "ct200-sim"', 'target = "ct200-b"')  # one service per host here
    (units / "b.toml").write_text('groups = ["ct-fleet"]\n' + other)
    (tmp_path / "fleet.deployctl.yml").write_text("plugin: deployctl.sglang.units\nunits_dir: units\n")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTION.parents[2])}
    argv = [str(BIN / "ansible-inventory"), "-i", str(tmp_path / "fleet.deployctl.yml"), "--list"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    assert sorted(listing["ct-fleet"]["hosts"]) == ["a", "b"]
    assert listing["blackwell"]["hosts"] == ["a"]
    folder = listing["_meta"]["hostvars"]["a"]["deployctl_units_dir"]
    assert str(units) in (folder, folder.get("__ansible_unsafe") if isinstance(folder, dict) else None)
    (units / "b.toml").write_text('groups = ["all"]\n' + other)  # a bad host file: Ansible says which
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert "b.toml: groups" in proc.stderr


def test_the_collection_builds_with_ansible_galaxy(tmp_path: Path) -> None:
    argv = [
        str(BIN / "ansible-galaxy"),
        "collection",
        "build",
        str(COLLECTION),
        "--output-path",
        str(tmp_path),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (built,) = tmp_path.glob("deployctl-sglang-*.tar.gz")
    listing = subprocess.run(["tar", "tzf", str(built)], capture_output=True, text=True, check=True).stdout
    for path in ("plugins/action/sglang_apply.py", "plugins/inventory/units.py", "playbooks/rollout.yml"):
        assert path in listing.splitlines()
    assert "__pycache__" not in listing
