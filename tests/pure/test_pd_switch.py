"""The role-switch decision (agent/pd/switch.py): a unit whose role alone changes, started with
--enable-pd-role-switch, is switched; anything else restarts with one line saying why not a switch; what
SGLang's answer means."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.pd.switch import (
    ROUTER_RESTARTS,
    SGL_13054,
    Restart,
    Running,
    Said,
    Settled,
    Switch,
    answer,
    decide,
    router_keeps,
    running_of,
    settle,
)
from agent.protocol.common import unit_sha256
from agent.sglang.flags import format_exec_start

PEER = "http://127.0.0.1:30021"
BASE: dict[str, object] = {
    "model-path": "/models/m",
    "port": 30010,
    "tp-size": 1,
    "disaggregation-transfer-backend": "mooncake",
    "enable-pd-role-switch": True,
}


def unit(role: str, bootstrap: int | None = 8998, env: str = "", **flags: object) -> str:
    merged = {**BASE, "disaggregation-mode": role, **flags}
    if role == "prefill" and bootstrap is not None:
        merged["disaggregation-bootstrap-port"] = bootstrap
    merged = {k: v for k, v in merged.items() if v is not None}
    start = format_exec_start(["/opt/sglang/bin/python", "-m", "sglang.launch_server"], merged)  # type: ignore[arg-type]
    environment = f"Environment={env}\n" if env else ""
    return f"[Unit]\nDescription=x\n\n[Service]\n{environment}ExecStart={start}\nRestart=on-failure\n"


def test_prefill_to_decode_is_a_switch_with_the_peer() -> None:
    got = decide(Running(unit("prefill"), True), unit("decode"), PEER)
    assert got == Switch("prefill", "decode", None, PEER)
    assert got.line.startswith("switch: prefill -> decode")


RADIX: dict[str, object] = {"disaggregation-decode-enable-radix-cache": True}


def test_decode_to_prefill_keeps_the_bootstrap_port_its_start_bound() -> None:
    # a decode rendered without the port bound SGLang's default, 8998
    assert decide(Running(unit("decode", **RADIX), True), unit("prefill", 8998, **RADIX), None) == Switch(
        "decode", "prefill", 8998, None
    )
    got = decide(Running(unit("decode", **RADIX), True), unit("prefill", 9000, **RADIX), None)
    assert isinstance(got, Restart) and "listens on 8998" in got.line and "9000" in got.line


def test_prefill_to_decode_keeps_the_bootstrap_port_its_start_bound() -> None:
    # every role-switch instance binds its port at start (disagg_service.py:26): a decode's too
    port: dict[str, object] = {"disaggregation-bootstrap-port": 8999}
    assert isinstance(decide(Running(unit("prefill", 8999), True), unit("decode", **port), PEER), Switch)
    got = decide(Running(unit("prefill", 8999), True), unit("decode"), PEER)
    assert got == Restart(
        "its bootstrap server listens on 8999 since its start (a switch does not rebuild it), the new "
        "decode's --disaggregation-bootstrap-port is 8998"
    )


def test_a_decode_switches_to_prefill_only_with_the_radix_cache_its_prefill_runs() -> None:
    got = decide(Running(unit("decode"), True), unit("prefill"), None)
    assert isinstance(got, Restart) and "without the prefix cache" in got.line and "\n" not in got.line
    off: dict[str, object] = {"disable-radix-cache": True}  # neither runs one: nothing lost
    assert isinstance(decide(Running(unit("decode", **off), True), unit("prefill", **off), None), Switch)
    assert isinstance(decide(Running(unit("decode", **RADIX), True), unit("prefill", **RADIX), None), Switch)


def test_no_role_change_says_nothing() -> None:
    assert decide(Running(unit("prefill"), True), unit("prefill", **{"tp-size": 2}), PEER) is None
    assert decide(Running(None, False), unit("decode"), PEER) is None


def why(running: str, new: str, peer: str | None = PEER, as_written: bool = True) -> str:
    got = decide(Running(running, as_written), new, peer)
    assert isinstance(got, Restart), got
    return got.line


def test_each_reason_not_to_switch_is_one_line() -> None:
    off = {"enable-pd-role-switch": None}
    assert why(unit("prefill", **off), unit("decode", **off)) == (
        "restart: --enable-pd-role-switch not set on the running unit"
    )
    assert why(unit("prefill"), unit("decode", **off)) == (
        "restart: --enable-pd-role-switch changes too (True -> unset)"
    )
    assert "not its installed unit" in why(unit("prefill"), unit("decode"), as_written=False)
    nixl = {"disaggregation-transfer-backend": "nixl"}
    assert "'nixl' does not support" in why(unit("prefill", **nixl), unit("decode", **nixl))
    staged = why(unit("prefill", env="SGLANG_DISAGG_STAGING_BUFFER=1"),
                 unit("decode", env="SGLANG_DISAGG_STAGING_BUFFER=1"))  # fmt: skip
    assert "SGLANG_DISAGG_STAGING_BUFFER" in staged
    assert "decode_cuda_graph_memory_gb" in why(unit("prefill"), unit("decode"), peer=None)
    assert why(unit("prefill"), unit("decode", **{"max-running-requests": 8})) == (
        "restart: --max-running-requests changes too (unset -> 8)"
    )
    for line in (staged, why(unit("prefill"), unit("decode"), peer=None)):
        assert "\n" not in line


OTHER = st.sampled_from(
    [("tp-size", 2), ("mem-fraction-static", "0.8"), ("max-running-requests", 16), ("page-size", 16),
     ("chunked-prefill-size", 4096), ("port", 30011), ("enable-pd-role-switch", None),
     ("disaggregation-transfer-backend", "mori")]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    old_role=st.sampled_from(["prefill", "decode"]),
    others=st.lists(OTHER, max_size=3, unique_by=lambda kv: kv[0]),
    env=st.sampled_from(["", "RUST_LOG=info"]),
    new_env=st.sampled_from(["", "RUST_LOG=info"]),
    bootstrap=st.sampled_from([None, 8998, 9000]),
    new_bootstrap=st.sampled_from([None, 8998, 9000]),
    radix=st.sampled_from([None, "disable-radix-cache", "disaggregation-decode-enable-radix-cache"]),
)
def test_a_switch_only_when_nothing_but_the_role_changes(  # noqa: PLR0913
    old_role: str, others: list[tuple[str, object]], env: str, new_env: str, bootstrap: int | None,
    new_bootstrap: int | None, radix: str | None,
) -> None:  # fmt: skip
    new_role = "decode" if old_role == "prefill" else "prefill"
    cache = {radix: True} if radix else {}
    old_text = unit(old_role, None, env, **cache, **_port(bootstrap))
    new_text = unit(new_role, None, new_env, **{**cache, **_port(new_bootstrap), **dict(others)})
    got = decide(Running(old_text, True), new_text, PEER)
    # either role binds the port its unit names (SGLang's default 8998 unnamed) and keeps it on a flip
    same_port = (bootstrap or 8998) == (new_bootstrap or 8998)
    radix_lost = old_role == "decode" and radix is None
    only_role = not others and env == new_env and same_port and not radix_lost
    assert isinstance(got, Switch) == only_role, (old_text, new_text, got)
    assert isinstance(got, (Switch, Restart))


def _port(port: int | None) -> dict[str, object]:
    return {"disaggregation-bootstrap-port": port} if port else {}


def test_sglang_answers() -> None:
    ok = {
        "success": True,
        "message": "ok",
        "old_role": "prefill",
        "new_role": "decode",
        "safe_to_restore": False,
    }
    assert answer(200, ok).said is Said.SWITCHED
    same = {**ok, "message": "already in target role"}
    assert answer(200, same).said is Said.SWITCHED
    busy = {"success": False, "message": "instance is not idle; drain all requests before switching",
            "safe_to_restore": True}  # fmt: skip
    assert answer(400, busy) == answer(400, busy)
    assert answer(400, busy).said is Said.REFUSED and "not idle" in answer(400, busy).message
    broken = {"success": False, "message": "role switch failed; instance unhealthy, restart required: x",
              "safe_to_restore": False}  # fmt: skip
    assert answer(400, broken).said is Said.BROKEN
    assert answer(500, {"error": "x"}).said is Said.BROKEN
    assert answer(502, "bad gateway").said is Said.BROKEN


# ---- the router, the running unit, and the switches of one change together

ROUTER = "[Service]\nExecStart=/py -m sglang_router.launch_router --pd-disaggregation {words} --policy x\n"
P0, FLEX, D0 = "http://127.0.0.1:30010", "http://127.0.0.1:30011", "http://127.0.0.1:30020"


def router(*words: str) -> str:
    return ROUTER.format(words=" ".join(words))


def test_the_router_keeps_its_process_when_only_switched_roles_change_its_unit() -> None:
    old = router("--prefill", P0, "8998", "--prefill", FLEX, "8999", "--decode", D0)
    new = router("--prefill", P0, "8998", "--decode", D0, "--decode", FLEX)
    assert router_keeps(old, new, {FLEX: ("decode", None)})
    assert not router_keeps(old, new, {})
    assert not router_keeps(old, new.replace("--policy x", "--policy y"), {FLEX: ("decode", None)})
    back = router("--prefill", P0, "8998", "--prefill", FLEX, "9000", "--decode", D0)
    assert router_keeps(new, back, {FLEX: ("prefill", 9000)})
    assert not router_keeps(new, back, {FLEX: ("prefill", 8999)})


def facts(
    text: str, invocation: str = "inv1", started: str = "inv1", active: str = "active"
) -> dict[str, Any]:
    state = {
        "active_state": active,
        "sub_state": "running",
        "invocation_id": invocation,
        "need_daemon_reload": False,
    }
    return {"unit_text": text, "unit_sha256": unit_sha256(text), "state": state,
            "history": [{"sha256": unit_sha256(text), "invocation": started}]}  # fmt: skip


def test_the_running_unit_is_the_installed_one_only_when_deployctl_started_that_text() -> None:
    text = unit("prefill")
    assert running_of(facts(text)) == Running(text, True)
    assert running_of(facts(text, started="older")) == Running(text, False)
    assert running_of(facts(text, active="failed")) == Running(text, False)
    assert running_of({"unit_text": text}) == Running(text, False)
    assert running_of({}) == Running(None, False)


def test_one_change_settles_its_switches() -> None:
    to_decode = Switch("prefill", "decode", None, D0)
    to_prefill = Switch("decode", "prefill", 8998, None)
    same = router("--prefill", P0, "8998", "--prefill", FLEX, "8999", "--decode", D0)
    moved = router("--prefill", P0, "8998", "--decode", D0, "--decode", FLEX)
    kept = settle([None, to_decode, None], [P0, FLEX, D0], False, (same, moved))
    assert kept == Settled([None, to_decode, None], True)
    # a prefill restarts: the unit that would become a decode restarts too (sglang#13054)
    restarted = settle([None, to_decode, None], [P0, FLEX, D0], True, (same, moved))
    assert restarted.decisions[1] == Restart(SGL_13054) and not restarted.router_keeps
    # the router's unit changes besides the switch: it restarts, and so does every role change
    other = settle([None, to_decode, None], [P0, FLEX, D0], False, (same, moved + "# x\nRestartSec=5\n"))
    assert other.decisions[1] == Restart(ROUTER_RESTARTS)
    assert settle([to_prefill], [FLEX], True, (None, "")).decisions == [Restart(ROUTER_RESTARTS)]
    assert Restart(ROUTER_RESTARTS).line.startswith("restart: the router restarts")


def test_a_rendered_role_change_differs_only_in_what_the_role_implies() -> None:
    """The renderer's own comments and Description= name the role and its index: not a change."""
    old = "# for host pd.prefill1\n[Unit]\nDescription=x (prefill 1)\n" + unit("prefill").split("\n", 1)[1]
    new = "# for host pd.decode1\n[Unit]\nDescription=x (decode 1)\n" + unit("decode").split("\n", 1)[1]
    assert isinstance(decide(Running(old, True), new, PEER), Switch)


def test_every_backend_the_plan_lets_switch_is_switched() -> None:
    """The plan's refusal and the switch decision read one list: a backend whose KV manager switches
    (ascend's is Mooncake's, srt/disaggregation/ascend/conn.py:95) is switched, not restarted."""
    from agent.pd.starthook import SWITCHERS

    for backend in SWITCHERS:
        flags = {"disaggregation-transfer-backend": backend}
        got = decide(Running(unit("prefill", **flags), True), unit("decode", **flags), PEER)
        assert got == Switch("prefill", "decode", None, PEER), (backend, got)
