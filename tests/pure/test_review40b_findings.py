"""Review findings on the [pd] role switch, rollback by generation and the transfer engine fact: each test
states the behaviour that should hold and fails today for the finding's reason (xfail, strict)."""

from __future__ import annotations

import os
import pwd
import subprocess
from typing import Any

import pytest

from agent.host.change.decide import Action, Verdict
from agent.host.watch.start import WatchResult
from agent.pd.switch import Restart, Running, Said, answer, decide
from tests.pure.test_pd_switch import PEER, unit


def test_a_switch_to_decode_keeps_the_bootstrap_port_its_start_bound() -> None:
    # the prefill's start bound 8999 (disagg_service.py:26, never rebuilt on a flip); the decode's unit says
    # 8998: the server keeps 8999, the file and refusals (bound_bootstrap) say 8998, and a later switch back
    # to prefill passes _bootstrap(old) == 8998 and registers 8998 in the router while 8999 listens
    port: dict[str, Any] = {"disaggregation-bootstrap-port": 8998}
    got = decide(Running(unit("prefill", 8999), True), unit("decode", **port), PEER)
    assert isinstance(got, Restart)


def test_a_decode_switched_to_prefill_is_not_left_without_its_radix_cache() -> None:
    # SGLang resolves disable_radix_cache=True at a decode's start unless
    # --disaggregation-decode-enable-radix-cache; role_switch.py:267-292 only resets the tree. A restart of
    # the same prefill unit runs a radix cache; the switched one never does until its next restart.
    got = decide(Running(unit("decode"), True), unit("prefill", 8998), None)
    assert isinstance(got, Restart)


def test_a_switch_turned_away_at_auth_is_not_a_broken_server() -> None:
    # utils/auth.py:133-143 and :192-203: {"error": "Unauthorized"}, status 401, before any handler ran;
    # pdswitch.switch sends only the api key (secrets.api_key), never an admin key
    assert answer(401, {"error": "Unauthorized"}).said is Said.REFUSED


def test_the_engine_import_never_runs_as_a_uid_0_account(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.host import argcheck

    text = (
        "[Service]\nUser=toor\n"
        "ExecStart=/opt/sglang/bin/python -m sglang.launch_server --disaggregation-mode prefill\n"
    )
    cmd = argcheck.command_for(text)
    ran: list[dict[str, Any]] = []
    toor = pwd.struct_passwd(("toor", "x", 0, 0, "", "/root", "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: toor)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "getegid", lambda: 0)

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        ran.append(kw)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    if not isinstance(cmd, str):
        argcheck.run_as_user(cmd, ["-c", "pass"], 1.0)
    assert ran == []  # never run: its uid is root's


def test_a_rollback_takes_a_restarted_unit_out_of_the_router_that_stays() -> None:
    from agent.group.pdrollback import chosen_backups, rollback_nodes
    from tests.pure.test_pd import example, host_of
    from tests.pure.test_pd_ops import DECODE_BAK, backups_of

    host = host_of(example())
    listings = [backups_of(), backups_of((DECODE_BAK, False)), backups_of()]  # the decode's change alone
    picked = chosen_backups(host, listings)  # type: ignore[arg-type]
    assert [c.label for c in picked] == ["decode[0]"]  # the router stays, running
    nodes, _ = rollback_nodes(host, picked, [object()])  # type: ignore[list-item]
    req = nodes[0].request
    assert req.router_url is not None and req.router_worker_type == "decode"


def test_a_switched_unit_with_no_known_pool_does_not_pass_the_gate() -> None:
    from agent.host.roles.pdswitch import short_of_need

    started = WatchResult(Verdict(Action.READY), {}, 0.0, "inv")  # type: ignore[arg-type]
    assert short_of_need(started, 100_000) is not None
