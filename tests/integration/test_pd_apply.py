"""A 1P1D service on one test host (the simulated server on GPUs 0-3 and 4-7, the real sglang-router 0.3.2
in PD mode as a unit of its own), applied as one group: prefill, then decode, then the router; a decode
start that fails rolls back every role and the router's unit. The host and its service: tests/pdhosts.py
(shared with `make demo`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from agent.exitcodes import ExitCode
from tests.pdhosts import UNITS, Pd, boot
from tests.testhost import TestHostUnavailable, missing_prerequisites

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pd() -> Iterator[Pd]:
    missing = missing_prerequisites()
    if missing:
        pytest.skip("test host unavailable: missing " + ", ".join(missing))
    try:
        booted = boot()
    except TestHostUnavailable as exc:
        pytest.skip(f"test host unavailable: {exc}")
    try:
        booted.routed()  # the old generation serves through the router
        yield booted
    finally:
        booted.stop()


def test_a_1p1d_apply_commits_prefill_then_decode_and_leaves_the_router_running(pd: Pd) -> None:
    t0 = time.monotonic()
    router = pd.show(UNITS[2], "InvocationID")
    r = pd.run("apply", "pd", "--context", "16k", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), said
    assert "routed check" in said, said
    # drained through the real sglang-router 0.3.2: each unit out before its stop, back with its role
    prefill_url, decode_url = (f"http://127.0.0.1:{port}" for port in (pd.ports[0], pd.ports[2]))
    for url in (prefill_url, decode_url):
        assert f"took {url} out of the router" in said and f"put {url} back in the router" in said, said
    assert "this unit served one" in said, said  # the decode's own request count grew
    assert "KV checksum: on in every role" in said, said
    kinds = {w["url"]: (w.get("worker_type"), w.get("bootstrap_port")) for w in pd.workers()}
    assert kinds == {prefill_url: ("prefill", pd.ports[1]), decode_url: ("decode", None)}, kinds
    texts = pd.texts()
    assert b"--context-length 16000" in texts[UNITS[0]] and b"--context-length 16000" in texts[UNITS[1]]
    assert pd.show(UNITS[2], "InvocationID") == router  # its unit is unchanged: not restarted
    assert pd.routed()
    print(f"\n1P1D apply committed in {time.monotonic() - t0:.1f} s")


def test_a_failed_decode_start_rolls_back_every_role_and_the_router(pd: Pd) -> None:
    t0 = time.monotonic()
    before = pd.texts()
    # the decode's next start (at 24,000 tokens) crashes loading; the router's flags change too
    pd.fail_decode_at(24000)
    pd.write(policy="random")
    r = pd.run("apply", "pd", "--context", "24k", "--yes")
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.ROLLED_BACK, said
    assert "wave 2: router" in said and "decode[0] failed" in said, said  # the decode's start, named
    assert pd.texts() == before  # every role and the router on its previous unit
    for unit in UNITS:
        assert pd.show(unit, "ActiveState") == "active", unit
    assert pd.routed()
    print(f"\nfailed 1P1D apply rolled back in {time.monotonic() - t0:.1f} s")


def test_rollback_takes_every_role_back_to_its_previous_unit_as_one_group(pd: Pd) -> None:
    """After the rolled-back apply above, each role's newest backup that differs is its unit before the
    first apply (32k): both go back as one group, prefill first, the router's unchanged unit left alone."""
    t0 = time.monotonic()
    pd.clear_fault()
    router = pd.show(UNITS[2], "InvocationID")
    r = pd.run("rollback", "pd", "--yes")
    said = r.stdout + r.stderr
    assert r.returncode == ExitCode.OK, said
    assert said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), said
    assert not re.search(r"wave \d: router", said), said
    texts = pd.texts()
    assert b"--context-length 32768" in texts[UNITS[0]] and b"--context-length 32768" in texts[UNITS[1]]
    assert pd.show(UNITS[2], "InvocationID") == router  # its unit has no earlier text: not restarted
    status = pd.run("status", "pd")
    assert status.returncode == ExitCode.OK and status.stdout.count("active/running") == 3, status.stdout
    assert pd.routed()
    print(f"\n1P1D rollback in {time.monotonic() - t0:.1f} s")


def test_backups_and_facts_ask_each_unit_of_the_service(pd: Pd) -> None:
    """After the applies and the rollback above: each role's backups, grouped by unit, and each role's facts
    with its transfer facts, read by the real agent over the host's one connection."""
    r = pd.run("backups", "pd")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    heads = [
        line for line in r.stdout.splitlines() if "backup(s), newest first" in line or ": no backups" in line
    ]
    assert [h.split()[0] for h in heads] == ["prefill[0]", "decode[0]", "router"], r.stdout
    assert "--context-length" in r.stdout.split("decode[0]")[1], r.stdout  # the decode's backups differ
    doc = json.loads(pd.run("backups", "pd", "--json").stdout)
    assert [u["unit"] for u in doc["units"]] == list(UNITS)
    r = pd.run("facts", "pd")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert r.stdout.count("  transfer installed: mooncake") == 2, r.stdout  # the simulated host's stand-in
    # the simulated units run as root (no User=): the venv's Python is never run as root, so not imported
    assert r.stdout.count("engine   mooncake_tcp: not checked: the unit has no User=") == 2, r.stdout
