"""The real 1P1D (tests/realpd.py: SGLang 0.5.23 on the test host's CPU as a prefill and a decode, the KV
moved by Mooncake over TCP, sglang-router 0.3.2 in PD mode) changed by deployctl's own `apply` and
`rollback` as one group: a new context restarts the prefill, then the decode; the rollback takes both
back; a decode on another page size fails the routed check with SGLang's own line and the group rolls
back by itself.

One host for the module, its pair started once from the units `apply` itself renders (planned_units), so
the first apply changes what it says and nothing else; the tests run in file order, each from the state
the one before left. Every real start costs 20-55 s on two cores: every
wait is bounded by a readiness check, never by a sleep.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from agent.exitcodes import ExitCode
from agent.inventory import load_service
from tests import realhost, realpd
from tests.realpd import DECODE, PREFILL, ROUTER, PdHost
from tests.testhost import TestHostUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.real_sglang]

CONTEXT, NEW_CONTEXT = int(realpd.CONTEXT), 3072
PROMPT = list(range(100, 400))  # 300 token ids of the tiny model's 2,048
REQUEST = {
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
}
APPLY_TIMEOUT_S = 900.0  # two or three real starts in a row, each up to realhost.START_TIMEOUT_S
MISMATCH = "Page size mismatch: prefill server has page_size=1, but decode server has page_size=16."


@pytest.fixture(scope="module")
def pd() -> Iterator[PdHost]:
    booted = realpd.booted()
    try:
        host = booted.__enter__()
    except TestHostUnavailable as exc:
        pytest.skip(f"real PD unavailable: {exc}")
    try:
        t0 = time.monotonic()
        _start_pair(host)
        print(f"\nreal 1P1D started from apply's own units in {time.monotonic() - t0:.1f} s")
        yield host
    finally:
        booted.__exit__(None, None, None)


def _start_pair(pd: PdHost) -> None:
    """The three units `apply` would write at CONTEXT, installed and started: prefill and decode together
    (a decode needs its prefill only at its first request), the router once both serve."""
    from agent.group.pdapply import planned_units

    pd.write_inventory()
    units = planned_units(load_service(realpd.SERVICE, pd.units_dir), CONTEXT)
    pd.install({u.host.unit.name: u.text for u in units})
    pd.systemctl("start", "--no-block", PREFILL)
    pd.systemctl("start", "--no-block", DECODE)
    pd.wait_ready(PREFILL, pd.ports.prefill)
    pd.wait_ready(DECODE, pd.ports.decode)
    pd.systemctl("start", ROUTER)
    pd.wait_routed()
    _served(pd)


def _served(pd: PdHost) -> None:
    """A routed /generate through the real router: 200, the whole prompt counted, every new token made."""
    status, out = realpd.http(pd.ports.router, "/generate", REQUEST, timeout=120)
    assert status == 200 and isinstance(out, dict), out
    meta = out["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(PROMPT), 8), meta


def _apply(pd: PdHost, *args: str) -> tuple[int, str]:
    r = pd.deployctl(*args, "--yes", timeout=APPLY_TIMEOUT_S)
    return r.returncode, r.stdout + r.stderr


def _context(pd: PdHost, unit: str) -> int:
    text = pd.host.read(f"/etc/systemd/system/{unit}").decode()
    found = re.search(r"--context-length (\d+)", text)
    assert found, text
    return int(found[1])


def _invocations(pd: PdHost) -> dict[str, str]:
    return {unit: pd.invocation(unit) for unit in (PREFILL, DECODE, ROUTER)}


def _running(pd: PdHost) -> None:
    for unit in (PREFILL, DECODE, ROUTER):
        assert pd.systemctl("show", "-p", "ActiveState", "--value", unit) == "active", unit


def test_a_new_context_restarts_the_real_prefill_then_the_decode_and_commits(pd: PdHost) -> None:
    t0 = time.monotonic()
    before = _invocations(pd)
    code, said = _apply(pd, "apply", realpd.SERVICE, "--context", str(NEW_CONTEXT))
    assert code == ExitCode.OK, said
    assert said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), said
    assert "this unit served one" in said, said  # the decode's own request count grew: it served it
    for unit in (PREFILL, DECODE):
        assert _context(pd, unit) == NEW_CONTEXT
    after = _invocations(pd)
    assert after[PREFILL] != before[PREFILL] and after[DECODE] != before[DECODE]
    assert after[ROUTER] == before[ROUTER]  # its unit is unchanged: it kept running
    _running(pd)
    _served(pd)
    print(f"\nreal 1P1D apply (prefill, then decode) committed in {time.monotonic() - t0:.1f} s")


def test_rollback_takes_the_real_pair_back_as_one_group(pd: PdHost) -> None:
    t0 = time.monotonic()
    before = _invocations(pd)
    code, said = _apply(pd, "rollback", realpd.SERVICE)
    assert code == ExitCode.OK, said
    assert said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), said
    for unit in (PREFILL, DECODE):
        assert _context(pd, unit) == CONTEXT
    after = _invocations(pd)
    assert after[PREFILL] != before[PREFILL] and after[DECODE] != before[DECODE]
    assert after[ROUTER] == before[ROUTER]
    _running(pd)
    _served(pd)
    took = time.monotonic() - t0
    # each unit runs as installed: an apply of the same file would restart nothing
    dry = pd.deployctl("apply", realpd.SERVICE, "--context", str(CONTEXT), "--dry-run", timeout=300)
    assert dry.returncode == ExitCode.OK, dry.stdout + dry.stderr
    assert "an apply would restart nothing" in dry.stdout + dry.stderr, dry.stdout + dry.stderr
    print(f"\nreal 1P1D rollback in {took:.1f} s")


def test_a_decode_on_another_page_size_fails_the_routed_check_and_the_group_rolls_back(pd: PdHost) -> None:
    """deployctl refuses to render a decode on another page size (no flag passes that refusal), so the
    decode's new unit carries DEPLOYCTL_STANDIN_PAGE_SIZE=16 and the real-SGLang stand-ins turn its
    `--page-size 1` into 16 (tests/realsglang/site/sitecustomize.py), as a hand edit would: the real
    SGLang decode starts, and the first routed request meets SGLang's own refusal."""
    t0 = time.monotonic()
    old = pd.host.read(f"/etc/systemd/system/{DECODE}")
    pd.write_inventory(decode_env={"DEPLOYCTL_STANDIN_PAGE_SIZE": "16"})
    code, said = _apply(pd, "apply", realpd.SERVICE, "--context", str(CONTEXT))
    assert code == ExitCode.ROLLED_BACK, said
    assert "wave 0: decode[0]" in said and "wave 1" not in said, said  # the decode alone changed
    assert MISMATCH in said and "pd_page_size_mismatch" in said, said
    assert pd.host.read(f"/etc/systemd/system/{DECODE}") == old  # back on the unit it had
    _running(pd)
    pd.wait_routed()
    _served(pd)
    status = pd.deployctl("status", realpd.SERVICE)
    assert status.returncode == ExitCode.OK and status.stdout.count("active/running") == 3, status.stdout
    # parse-log of that start's journal: ready, then failed with SGLang's line, and the fix
    doc = json.loads(_parse_log(_failed_start(pd)))
    assert doc["failure"]["kind"] == "pd_page_size_mismatch" and MISMATCH in doc["failure"]["line"], doc
    assert "--page-size 1" in doc["fix"] and "--page-size 16" in doc["fix"], doc
    print(f"\nreal 1P1D decode on page 16: rolled back in {time.monotonic() - t0:.1f} s")


def _failed_start(pd: PdHost) -> str:
    """The journal of the decode's start that logged the mismatch."""
    said = pd.host.ssh(["journalctl", "--no-pager", "-o", "json", "-u", DECODE]).stdout
    for line in said.decode(errors="replace").splitlines():
        entry = json.loads(line)
        if MISMATCH in str(entry.get("MESSAGE")):
            return pd.journal(DECODE, str(entry["_SYSTEMD_INVOCATION_ID"]))
    raise AssertionError("no start of the decode logged the mismatch")


def _parse_log(log: str) -> str:
    r = subprocess.run(
        [realhost.DEPLOYCTL, "parse-log", "-", "--json"], input=log, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == ExitCode.OK, r.stderr
    return r.stdout
