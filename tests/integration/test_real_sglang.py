"""deployctl against the real SGLang 0.5.23 (PyPI) serving a tiny random-weight model on the test host's CPU
under systemd (tests/realhost.py): adopt and a first apply, the smoke test on the real chat endpoint, changes
the real server refuses, and secrets through LoadCredential= and --config.

One real server for the session (the `real` fixture): every real start costs 25-110 s here, so the tests
share it and each leaves it serving. The CPU planner's own fraction is not used yet (see
test_adopt_then_the_first_apply_changes_only_the_planned_flags): every apply names --mem-fraction-static.
"""

from __future__ import annotations

import json
import sys
import urllib.error

import pytest

from agent.exitcodes import ExitCode
from agent.host.watch.probe import Probe
from agent.protocol.requests import Smoke
from agent.sglang.flags import diff_flags, normalize, parse_unit_flags
from tests import realhost
from tests.realhost import RealHost

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = [pytest.mark.integration, pytest.mark.real_sglang]

HOST = realhost.NAME
CONTEXT = "4096"  # the tiny model's own context length
KEY = "sk-real-3f9c'q\"$x"  # a key with quotes and a dollar, as secrets come


def _events(real: RealHost, stage: str) -> list[dict[str, object]]:
    """Every event of this stage the host's transactions logged, oldest first."""
    found = []
    for path in sorted((real.host.root / "var/lib/deployctl/txn").glob("*/events.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("stage") == stage:
                found.append(event)
    return found


def _apply(real: RealHost, *extra: str) -> tuple[int, str]:
    r = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes", *extra)
    return r.returncode, r.stdout + r.stderr


def _load_weight_begin_us(real: RealHost) -> int:
    """When the running start logged "Load weight begin" (journal realtime, microseconds)."""
    inv = real.invocation()
    argv = ["journalctl", "--no-pager", "-o", "json", f"_SYSTEMD_INVOCATION_ID={inv}"]
    for line in real.host.ssh(argv).stdout.decode(errors="replace").splitlines():
        record = json.loads(line)
        if "Load weight begin" in str(record.get("MESSAGE")):
            return int(record["__REALTIME_TIMESTAMP"])
    raise AssertionError(f"no 'Load weight begin' in invocation {inv}")


def test_no_stand_in_is_used_once_the_weights_load(real: RealHost) -> None:
    """The four import stand-ins only answer imports: after "Load weight begin" nothing but module bodies
    (definitions of a module imported late) touches one, so every step that serves runs real torch."""
    real.ensure_hand()  # serving, whatever the test before left
    begin = _load_weight_begin_us(real) / 1e6
    records = [line.split(" ", 5) for line in real.host.read(realhost.TRACE).decode().splitlines()]
    assert len(records) > 1000  # the trace works: triton's decorators alone are used ~2,000 times
    late = [r for r in records if float(r[0]) >= begin]
    calls_from_code = [r for r in late if r[5] != "<module>"]
    assert not calls_from_code, calls_from_code[:5]
    assert not [r for r in records if r[3].startswith("triton.knobs")]
    assert real.pool() == realhost.POOL


def test_adopt_then_the_first_apply_changes_only_the_planned_flags(real: RealHost) -> None:
    real.ensure_hand()
    before = real.invocation()
    path = real.adopt()
    data = tomllib.loads(path.read_text())
    venv_python = f"{realhost.venv_dir()}/bin/python"
    assert data["sglang"]["executable"] == [venv_python, "-m", "sglang.launch_server"]
    assert data["sglang"]["flags"]["max-total-tokens"] == realhost.POOL
    assert data["unit"]["environment"]["SGLANG_USE_CPU_ENGINE"] == "1"
    real.inventory()  # the same, with a smoke test that expects no word (random weights)

    planned = real.deployctl("plan", HOST, "--context", CONTEXT, "--json")
    assert planned.returncode == ExitCode.OK, planned.stderr
    plan_flags = {k: normalize(v) for k, v in json.loads(planned.stdout)["flags"].items()}
    code, out = _apply(real)
    assert code == ExitCode.OK, out
    assert real.invocation() != before and real.pool() == realhost.POOL
    hand = parse_unit_flags(real.hand)
    changes = diff_flags(hand, parse_unit_flags(real.unit_text()))
    assert changes and {c.name: c.after for c in changes} == {
        k: v for k, v in plan_flags.items() if hand.get(k) != v
    }
    # the smoke test ran against the real chat endpoint: the whole prompt counted, an answer came
    (smoke,) = [e for e in _events(real, "smoke") if "prompt_tokens" in e["data"]][-1:]
    assert smoke["data"]["passed"] is True and int(smoke["data"]["prompt_tokens"]) > 3000


def test_the_smoke_test_on_the_real_chat_endpoint(real: RealHost) -> None:
    """Random weights answer noise: the verdict rests on usage (the prompt's token count) and an answer."""
    probe = Probe("127.0.0.1", real.port)
    res = probe.smoke(Smoke(prompt_tokens=2000, expect="", timeout_s=120))
    assert res.passed, res.detail
    # the tiny model's byte-level BPE gives about 1.1 tokens per word of the smoke sentence
    assert 2000 <= res.prompt_tokens < 2600
    cut = probe.smoke(Smoke(prompt_tokens=5000, expect="", timeout_s=120))  # above the 4,096 context
    assert not cut.passed and "HTTP 400" in cut.detail


def test_a_flag_the_real_server_does_not_know_is_refused_before_anything_changes(real: RealHost) -> None:
    """SGLang 0.5.23's own flag table (shipped as data) refuses a typo on the laptop: no restart at all."""
    if not real.healthy():
        real.ensure_hand()
    old_unit, started = real.unit_text(), real.invocation()
    real.inventory(flags="no-such-flag = true")
    r = real.deployctl("apply", HOST, "--context", CONTEXT, "--yes")
    assert r.returncode == ExitCode.USAGE, r.stdout + r.stderr
    assert "no-such-flag" in r.stderr.splitlines()[0]
    assert real.unit_text() == old_unit and real.invocation() == started


def test_a_value_the_real_server_refuses_rolls_back_by_itself(real: RealHost) -> None:
    """A fraction too small for the weights: every check before the restart lets it through (a number in
    (0, 1)), SGLang refuses it at start-up; deployctl rolls back and quotes SGLang's own line."""
    if not real.healthy():
        real.ensure_hand()
    old_unit, old_pool = real.unit_text(), real.pool()
    real.inventory(flags="")
    r = real.deployctl(
        "apply", HOST, "--context", CONTEXT, "--mem-fraction-static", "0.0001", "--yes", "--force"
    )
    assert r.returncode == ExitCode.ROLLED_BACK, r.stdout + r.stderr
    assert "Raise --mem-fraction-static above" in r.stdout  # SGLang's own line, quoted in the report
    assert real.unit_text() == old_unit
    real.wait_ready()
    assert real.pool() == old_pool


def test_api_key_through_load_credential_and_config(real: RealHost) -> None:
    real.inventory(flags=f"api-key = {json.dumps(KEY)}")
    code, out = _apply(real)
    assert code == ExitCode.OK, out
    unit = real.unit_text()
    assert "LoadCredential=" in unit and "--config /run/credentials/sglang.service/" in unit
    with pytest.raises(urllib.error.HTTPError) as denied:
        real.http("/v1/models")
    assert denied.value.code == 401
    assert real.http("/v1/models", key=KEY)
    # the key is nowhere it could leak from: unit, backups, systemctl show, argv, facts, what was printed
    assert KEY not in unit
    for name in real.backups():
        assert KEY not in real.host.read(f"/etc/systemd/system/{name}").decode()
    assert KEY not in real.systemctl("show", realhost.UNIT)
    pid = real.systemctl("show", "-p", "MainPID", "--value", realhost.UNIT)
    assert KEY not in real.host.read(f"/proc/{pid}/cmdline").decode(errors="replace")
    facts = real.deployctl("facts", HOST, "--json")
    assert facts.returncode == ExitCode.OK and KEY not in facts.stdout + facts.stderr
    assert KEY not in out  # the report, with the journal lines the host sent while it watched the start
    status = real.deployctl("status", HOST)
    assert status.returncode == ExitCode.OK and KEY not in status.stdout + status.stderr
    assert KEY not in real.journal(lines=5000)  # the unit's journal on the host: SGLang does not print it
