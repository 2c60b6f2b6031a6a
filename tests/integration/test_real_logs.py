"""deployctl against the real SGLang 0.5.23 (PyPI) on the test host's CPU: the pool raised in one restart by a
plan calibrated from the real start's lines (issue 21, 4.2), real stops and crashes read right (4.7), and the
real `Engine startup timings` line in the downtime's phases (4.8)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from agent.sglang.logs import events as ev
from agent.sglang.logs.summary import summarize
from tests import realhost
from tests.realhost import UNIT, RealHost

pytestmark = [pytest.mark.integration, pytest.mark.real_sglang]

SMALL_POOL = 2048  # the hand-written unit's --max-total-tokens before the change: below the model's context
CONTEXT = 4096  # the toy model's own context (max_position_embeddings)


def _events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def _pool_lines(real: RealHost, invocation: str) -> tuple[list[int], list[int]]:
    """The real `KV Cache is allocated` and `max_total_num_tokens=` figures of one start."""
    text = real.journal(lines=2000, invocation=invocation)
    kv = [int(m[1]) for m in re.finditer(r"KV Cache is allocated\. .*#tokens: (\d+)", text)]
    total = [int(m[1]) for m in re.finditer(r"max_total_num_tokens=(\d+)", text)]
    return kv, total


def _parse_log(real: RealHost, invocation: str) -> dict[str, Any]:
    """`deployctl parse-log --json` of one start's journal, as a person would run it on the host's log."""
    path = real.work / f"{invocation}.log"
    path.write_text(real.journal(lines=5000, invocation=invocation), encoding="utf-8")
    r = real.deployctl("parse-log", "--json", str(path))
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def _no_smoke(inventory: Path) -> None:
    doc = tomlkit.parse(inventory.read_text(encoding="utf-8"))
    smoke = doc.setdefault("smoke", tomlkit.table())
    smoke["enabled"] = False
    inventory.write_text(tomlkit.dumps(doc), encoding="utf-8")


def _wait_inactive(real: RealHost, timeout: float = realhost.START_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = real.systemctl("is-active", UNIT)
        if state in ("inactive", "failed"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"{UNIT} still {state} after {timeout:.0f} s")


def test_the_pool_is_raised_in_one_restart_by_a_plan_from_the_real_start(real: RealHost) -> None:
    real.install_unit(realhost.hand_unit(real.port, SMALL_POOL))
    before = real.invocation()
    assert real.pool() == SMALL_POOL
    _no_smoke(real.adopt())  # a random-weight model's words are noise (the real smoke test is 4.3's)
    r = real.deployctl("apply", real.name, "--context", str(CONTEXT), "--yes", "--json")
    events = _events(r.stdout)
    outcome = next((e for e in events if e.get("kind") == "outcome"), None)
    assert r.returncode == 0 and outcome is not None, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert outcome["data"]["outcome"] == "applied", outcome
    after = real.invocation()
    assert after != before
    kv, total = _pool_lines(real, after)
    measured = real.pool()
    assert kv == [measured] and total == [measured], (kv, total)
    planned = int(outcome["data"]["summary"]["kv_tokens"])
    assert planned == measured
    unit = real.unit_text()
    pin = int(re.search(r"--max-total-tokens[= ](\d+)", unit)[1])  # type: ignore[index]
    assert measured == pin > SMALL_POOL and measured >= CONTEXT
    # the real server_args= line (~15 KB, over journalctl's 4096-byte JSON limit) is read: the fraction
    fraction = float(re.search(r"--mem-fraction-static[= ]([0-9.]+)", unit)[1])  # type: ignore[index]
    assert outcome["data"]["summary"]["mem_fraction_static"] == fraction
    margin = 0.02  # planning.margin: the gate's tolerance below the planned pool
    assert abs(measured - pin) <= pin * margin
    # 4.8: the real `Engine startup timings` line in the downtime's phases (no CUDA graphs on CPU)
    phases = outcome["data"]["downtime"]["phases"]
    timings = summarize(real.journal(lines=5000, invocation=after).splitlines()).startup_timings
    assert timings is not None
    assert phases["weights"] == pytest.approx(timings.load_weight_s, abs=0.001)
    assert phases["pool"] == pytest.approx(timings.kv_cache_allocation_s, abs=0.001)
    assert "cuda_graphs" not in phases
    print(f"\nplan pin {pin}, measured pool {measured}, downtime {outcome['data']['downtime']}")


def test_a_control_group_stop_is_a_stop_and_a_killed_rank_a_crash(real: RealHost) -> None:
    real.ensure_hand()
    assert "KillMode" not in real.unit_text()  # systemd's default: control-group
    stopped = real.invocation()
    real.systemctl("stop", UNIT)
    _wait_inactive(real)
    log = real.journal(lines=5000, invocation=stopped)
    assert "crashed with exit code -15" in log or "SIGTERM received" in log, log[-2000:]
    figures = _parse_log(real, stopped)
    assert figures["stopped"] is True and figures["failure"] is None and figures["ready"] is True, figures
    # the facts the next plan reads: the host's RAM (no nvidia-smi on CPU) and a last start without failure
    real.adopt()
    r = real.deployctl("facts", real.name, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["device"] == "cpu" and doc["gpus"][0]["name"].startswith("host RAM"), doc["gpus"]
    assert doc["gpus"][0]["memory_free_mib"] > 0
    assert summarize(str(doc["last_start"]).splitlines()).failure is None

    # A rank killed while the service runs is a crash, not a stop.
    real.host.ssh(["systemctl", "start", UNIT])
    real.wait_ready()
    crashed = real.invocation()
    main = real.systemctl("show", "-p", "MainPID", "--value", UNIT)
    children = real.host.ssh(["ps", "-o", "pid=,args=", "--ppid", main]).stdout.decode()
    scheduler = next(line.split()[0] for line in children.splitlines() if "scheduler" in line)
    real.host.ssh(["kill", "-KILL", scheduler])
    _wait_inactive(real)
    figures = _parse_log(real, crashed)
    assert figures["failure"] is not None and figures["failure"]["kind"] == ev.RANK_DIED, figures
    assert figures["stopped"] is False
    # The unit's whole journal, as a person pipes it (`journalctl -u ... -o short-iso`, systemd's own lines
    # and every earlier start in it): one start is read, the last complete one, the crash; the stopped start
    # before it is listed as its own (ready, stopped), never mixed into the crash.
    whole = real.host.ssh(["journalctl", "-u", UNIT, "-o", "short-iso", "--no-pager", "-n", "50000"]).stdout
    path = real.work / "whole.log"
    path.write_bytes(whole)
    r = real.deployctl("parse-log", "--json", str(path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    starts = doc["starts"]
    assert len(starts) >= 2 and doc["start"] == starts[-1]["number"], starts
    assert (starts[-1]["outcome"], starts[-1]["failure"], starts[-1]["ready"]) == (
        "failed",
        ev.RANK_DIED,
        True,
    )
    assert (starts[-2]["outcome"], starts[-2]["failure"]) == ("ready", None), starts
    assert doc["failure"]["kind"] == ev.RANK_DIED and doc["stopped"] is False
    real.ensure_hand()
