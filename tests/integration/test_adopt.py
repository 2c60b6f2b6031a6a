"""Adopting a hand-written unit on the real test host: systemd runs the rendered one the same way, the first
apply changes exactly the planned flags, and a rollback gives back the hand-written file byte for byte."""

from __future__ import annotations

import json
import sys

import pytest

from agent.exitcodes import ExitCode
from agent.host.systemd import Systemd
from agent.inventory import load_host
from agent.render import render_unit, template_dir
from agent.sglang.flags import diff_flags, normalize, parse_flag_words, parse_unit_flags
from tests.integration.conftest import cli, invocation, wait_for, wait_pool
from tests.simhost import DROP_IN, TOKEN, SimHost, hand_unit, install_hand_written

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.integration

HOST = "ct200-hand"
UNIT = "/etc/systemd/system/sglang.service"
COPY = "dctl-adopted.service"  # the rendered unit, loaded next to the hand-written one to compare them
HAND_COPY = "dctl-hand.service"  # the hand-written unit under a name that differs as little


def _show(sim: SimHost, unit: str) -> dict[str, str]:
    out = sim.host.ssh(["systemctl", "show", "--all", unit]).stdout.decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _proc(sim: SimHost) -> tuple[list[str], dict[str, str]]:
    """The running main process's argv and environment, as the kernel holds them."""
    pid = sim.host.ssh(["systemctl", "show", "-p", "MainPID", "--value", "sglang.service"]).stdout.strip()
    argv = sim.host.ssh(["cat", f"/proc/{pid.decode()}/cmdline"]).stdout.decode().split("\0")[:-1]
    raw = sim.host.ssh(["cat", f"/proc/{pid.decode()}/environ"]).stdout.decode().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in raw)
    for per_start in ("INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"):
        env.pop(per_start, None)
    return argv, env


def _command(argv: list[str] | tuple[str, ...]) -> tuple[list[str], list[tuple[str, object]]]:
    """(the words before the first flag, the flags in order): how SGLang reads argv."""
    first = next(i for i, w in enumerate(argv) if w.startswith("--"))
    return list(argv[:first]), list(parse_flag_words(argv[first:]).items())


def _alive(sim: SimHost) -> bool:
    try:
        return wait_pool(sim, timeout=1) > 0
    except OSError:
        return False


def _assert_rendered_runs_the_same(sim: SimHost, hand: str) -> None:
    """Render with no change, load it next to the hand-written unit (the same drop-ins) and compare what
    systemd parsed from both: every property but the unit's name, the secret's place and ExecStart's
    `--flag=value` spelling."""
    host = load_host(HOST, sim.units_dir)
    rendered = render_unit(host, {}, template_dir())
    for name, text in ((COPY, rendered), (HAND_COPY, hand)):
        sim.host.put(f"/etc/systemd/system/{name}", text.encode())
        sim.host.put(f"/etc/systemd/system/{name}.d/10-hand.conf", DROP_IN.encode())
    assert sim.host.ssh(["systemctl", "daemon-reload"]).returncode == 0
    old, new = _show(sim, HAND_COPY), _show(sim, COPY)
    # systemd lists dependencies (After=...) in hash order: compare their words as sets
    differ = {
        k for k in old.keys() | new.keys() if sorted(old.get(k, "").split()) != sorted(new.get(k, "").split())
    }
    # the names of the units themselves; the secret moved into the root-only file; ExecStart compared below;
    # the stop, which gives SGLang's drain [drain] timeout_s (the hand unit's TimeoutStopSec=20 cut it)
    assert differ <= {
        "Id",
        "Names",
        "FragmentPath",
        "DropInPaths",
        "Environment",
        "EnvironmentFiles",
        "ExecStart",
        "ExecStartEx",
        "InvocationID",
        "TimeoutStopUSec",
        "TimeoutAbortUSec",
    }, differ
    assert (old["KillMode"], new["KillMode"], new["TimeoutStopUSec"]) == ("mixed", "mixed", "17min")
    assert new["EnvironmentFiles"].startswith("/etc/deployctl/secrets/sglang.service.env")
    with Systemd(sim.host.bus_address) as sd:
        ((_, hand_argv),) = sd.exec_commands(HAND_COPY)
        ((_, new_argv),) = sd.exec_commands(COPY)
        assert sd.exec_commands(HAND_COPY, "ExecStartPre") == sd.exec_commands(COPY, "ExecStartPre")
        hand_env, new_env = (list(sd.service_property(u, "Environment")) for u in (HAND_COPY, COPY))
    assert [e for e in hand_env if e != f"HF_TOKEN={TOKEN}"] == new_env and len(hand_env) == len(new_env) + 1
    assert _command(hand_argv) == _command(new_argv)  # `'--tp-size=8'` is rendered `--tp-size 8`
    for name in (COPY, HAND_COPY):
        sim.host.ssh(["rm", "-rf", f"/etc/systemd/system/{name}", f"/etc/systemd/system/{name}.d"])
    sim.host.ssh(["systemctl", "daemon-reload"])


def test_adopt_render_apply_rollback(fresh_sim: SimHost) -> None:
    sim = fresh_sim
    port = int(str(parse_unit_flags(sim.unit_text())["port"]))
    hand = hand_unit(port)
    install_hand_written(sim, hand)
    wait_for(lambda: _alive(sim), timeout=120, interval=0.3)
    argv_before, env_before = _proc(sim)
    assert env_before["HF_TOKEN"] == TOKEN and argv_before[1:3] == ["/usr/local/bin/sglang", "serve"]

    # adopt: the inventory names the secret but never holds its value; it takes the place of the file the
    # host was booted from (two inventory files of one unit on one host are refused)
    (sim.units_dir / f"{sim.name}.toml").unlink()
    r = cli(sim, "adopt", HOST, "--ssh", sim.name)
    assert r.returncode == ExitCode.OK, r.stderr
    path = sim.units_dir / f"{HOST}.toml"
    toml = path.read_text()
    assert "hf_" not in toml and "HF_TOKEN" in toml
    again = cli(sim, "adopt", HOST, "--ssh", sim.name)
    assert again.returncode == ExitCode.USAGE and "--force" in again.stderr
    assert path.read_text() == toml
    data = tomllib.loads(toml)
    assert data["sglang"]["executable"] == ["/usr/local/bin/sglang", "serve"]
    assert data["unit"]["verbatim"]["Service"][:2] == [
        "Group=sglang",
        "ExecStartPre=/bin/sh -c 'test -d /tmp || exit 1'",
    ]

    _assert_rendered_runs_the_same(sim, hand)

    # the first apply changes exactly the flags the plan chose, and nothing else systemd runs
    planned = cli(sim, "plan", HOST, "--context", "200k", "--json")
    assert planned.returncode == ExitCode.OK, planned.stderr
    plan_flags = {k: normalize(v) for k, v in json.loads(planned.stdout)["flags"].items()}
    before = invocation(sim)
    r = cli(sim, "apply", HOST, "--context", "200k", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert invocation(sim) != before and wait_pool(sim) >= 200_000
    changes = diff_flags(parse_unit_flags(hand), parse_unit_flags(sim.unit_text()))
    assert changes and {c.name: c.after for c in changes} == {
        k: v for k, v in plan_flags.items() if parse_unit_flags(hand).get(k) != v
    }
    argv_after, env_after = _proc(sim)
    assert env_after == env_before  # HF_TOKEN now from the root-only file, everything else as it was
    words_before, flags_before = _command(argv_before)
    words_after, flags_after = _command(argv_after)
    assert words_after == words_before
    assert dict(flags_after) == {**dict(flags_before), **{c.name: c.after for c in changes}}
    assert TOKEN not in sim.unit_text()
    mode = sim.host.ssh(["stat", "-c", "%a %u", "/etc/deployctl/secrets/sglang.service.env"]).stdout.decode()
    assert mode.split() == ["600", "0"]

    # rollback: the hand-written file, byte for byte, with its inline token and no secrets file
    back = cli(sim, "rollback", HOST, "--yes")
    assert back.returncode == ExitCode.OK, back.stdout + back.stderr
    assert sim.host.read(UNIT) == hand.encode()
    assert not (sim.host.root / "etc/deployctl/secrets/sglang.service.env").exists()
    assert _proc(sim)[1] == env_before


def test_several_sglang_units_need_unit(fresh_sim: SimHost) -> None:
    sim = fresh_sim
    sim.host.put("/etc/systemd/system/sglang-b.service", sim.unit_text().encode())  # loaded, never started
    sim.host.ssh(["systemctl", "daemon-reload"])
    r = cli(sim, "adopt", HOST, "--ssh", sim.name)
    assert r.returncode == ExitCode.USAGE
    assert "several units run SGLang: sglang-b.service, sglang.service" in r.stderr and "--unit" in r.stderr
    assert not (sim.units_dir / f"{HOST}.toml").exists()
    r = cli(sim, "adopt", HOST, "--ssh", sim.name, "--unit", "sglang-b.service")
    assert r.returncode == ExitCode.OK, r.stderr
    assert tomllib.loads((sim.units_dir / f"{HOST}.toml").read_text())["unit"]["name"] == "sglang-b.service"
