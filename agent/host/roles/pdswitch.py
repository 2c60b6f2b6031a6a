"""A [pd] group member whose role alone changes, switched in place (SGLang's `POST /pd_role_switch`) instead
of restarted; the laptop chose it (agent/pd/switch.py) for a running unit started with
--enable-pd-role-switch. It runs inside the member's transaction, after its new unit was backed up and
written (host/change/write.py) and while it is out of the router (host/roles/routerstep.py):

1. its requests drained (SGLang refuses a switch while it has any: role_switch.py:73);
2. the recovery record loses its invocation first: a run killed from here on is recovered by restoring the
   old unit and restarting it (the server may serve the new role while the file says the old one);
3. the switch, with the decode peer's measured graph memory for a switch to decode. SGLang's answer:
   - refused (safe_to_restore): the server serves its old role as before; the member restarts on its new
     unit as any member does (the choice made here: a refused switch costs a restart, never the change);
   - broken (not safe to restore: "instance unhealthy, restart required"): the member fails, the group
     rolls back, and this unit restarts on its old unit;
   - switched: the member votes "stopped" (it serves nothing, out of the router) and, at its wave's "go",
     is checked as a started member: its logged pool (or /server_info's max_total_num_tokens when the
     journal lost that line; neither: it fails) against its new role's need, /health and
     /server_info, back in the router with its new role, the routed check; then it votes and does what
     the group decides (an abort restores its old unit and restarts it).
"""

from __future__ import annotations

from dataclasses import replace

from agent.host.change.decide import Action, Failure, Verdict, fail
from agent.host.change.ports import Change, Ports, Result, Run
from agent.host.change.restore import roll_back
from agent.host.change.verify import verify
from agent.host.roles import groupstep
from agent.host.roles.groupsignal import Signals
from agent.host.roles.pdrouter import pool_said
from agent.host.watch.poll import wait_until
from agent.host.watch.roleswitch import RoleSwitchError
from agent.host.watch.start import WatchResult
from agent.protocol.events import Outcome, Stage
from agent.protocol.groupmachine import Decision
from agent.sglang.logs.summary import summarize
from agent.sglang.roleswitch import Answer, Said, answer, request_body


def switch_and_decide(p: Ports, run: Run, change: Change) -> Result:
    assert p.req.group is not None and p.req.pd_switch_role is not None
    role, signals = p.req.pd_switch_role, Signals(p.state.txn_dir(p.txn))
    drained(p, run)
    untouched_no_more(p)
    said = switch(p, role)
    if said.said is Said.REFUSED:
        p.log.emit(Stage.SWITCH, "warning", f"SGLang refused the switch to {role} ({said.message}): the "
                   "server serves its old role; restarting it on its new unit instead")  # fmt: skip
        return groupstep.start_and_decide(p, run, change)
    started = running(p)
    if said.said is Said.BROKEN:
        return failed(p, run, change, f"SGLang's switch to {role} failed: {said.message}", started)
    rank = p.req.group.rank
    p.log.emit(Stage.SWITCH, "step", f"switched to {role} without a restart ({said.message}): rank {rank} "
               "waits for its wave", vote="stopped", role=role)  # fmt: skip
    aborted = wait_for_go(p, signals)
    if aborted is not None:
        return roll_back(p, run, change, aborted, started)
    started = pool_known(p, started)
    why = short_of_need(started, p.req.target_context) or verify(p, run, started, change)
    if why is not None:
        return failed(p, run, change, why, started)
    pool = started.summary.get("kv_tokens")
    p.log.emit(Stage.GROUP, "step", f"rank {rank} ready as {role} ({pool_said(dict(started.summary))}): "
               "waiting for the group's decision", vote="ready", kv_tokens=pool)  # fmt: skip
    result = groupstep.decided(p, run, signals, started, change)
    if result.outcome is Outcome.APPLIED:
        result.message = f"{p.unit} switched to {role} without a restart: {pool_said(dict(started.summary))}"
    return result


def drained(p: Ports, run: Run) -> None:
    from agent.host.watch.drainer import wait_for_requests

    done = wait_for_requests(p.req, p.secrets.api_key(), p.log)
    run.drains.append(done)
    p.log.emit(Stage.DRAIN, "step", done.describe(), **done.to_dict())


def untouched_no_more(p: Ports) -> None:
    """The record without its invocation: whatever happens next, a recovery restarts the restored unit
    (restore.py `touched`), as after any start of the new unit."""
    record = p.state.load_record(p.unit)
    if record is not None:
        p.state.save_record(replace(record, invocation=""))


def switch(p: Ports, role: str) -> Answer:
    """The request; a decode peer that does not say its graph memory leaves the field out (SGLang then
    refuses a flip that must capture graphs, safely); no answer at all is a broken server."""
    port = p.role_switch(p.req.http_host, p.req.port, p.secrets.api_key(), p.secrets.admin_api_key())
    graph = port.graph_gb(p.req.pd_switch_graph_url) if p.req.pd_switch_graph_url else None
    body = request_body(role, graph)
    p.log.emit(Stage.SWITCH, "step", f"POST /pd_role_switch {body}")
    try:
        code, reply = port.switch(body)
    except RoleSwitchError as exc:
        return Answer(Said.BROKEN, str(exc))
    return answer(code, reply)


def running(p: Ports) -> WatchResult:
    """The running start as a start watched to ready: its figures from its own log lines."""
    state = p.systemd.unit_state(p.unit)
    summary = summarize(p.journal.last_invocation_lines(p.unit, 20000)).to_dict()
    return WatchResult(Verdict(Action.READY), summary, 0.0, state.invocation_id)  # type: ignore[arg-type]


def pool_known(p: Ports, started: WatchResult) -> WatchResult:
    """The pool its start logged; when that line is gone from the journal (rotated, vacuumed), SGLang's
    own: /server_info carries the scheduler's max_total_num_tokens of its start (utils/common.py:3584-3593,
    managers/scheduler.py:1943-1948), which a switch keeps (it rebuilds no KV pool: role_switch.py)."""
    from agent.host.watch.probe import ProbeError  # requests: only once a start is ready

    if _tokens(started.summary.get("kv_tokens")) is not None:
        return started
    try:
        pool = _tokens(p.http().server_info().get("max_total_num_tokens"))
    except ProbeError as exc:
        p.log.emit(Stage.GATE, "warning", f"no pool line in its start's journal, and {exc}")
        return started
    if pool is None:
        return started
    p.log.emit(Stage.GATE, "step", f"no pool line in its start's journal: /server_info says "
               f"max_total_num_tokens={pool:,}")  # fmt: skip
    return replace(started, summary={**started.summary, "kv_tokens": pool})


def _tokens(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def short_of_need(started: WatchResult, need: int | None) -> str | None:
    """The pool the switch kept against the new role's need (the gate of a started member); a pool not
    known (neither its journal nor /server_info says it) does not pass a need it cannot be held to."""
    pool = _tokens(started.summary.get("kv_tokens"))
    if need is None:
        return None
    if pool is None:
        return (f"its KV pool is unknown (no pool line in its start's journal, no max_total_num_tokens in "
                f"/server_info): it cannot be checked against its new role's need of {need:,}")  # fmt: skip
    if pool >= need:
        return None
    return f"its KV pool of {pool:,} tokens is short of its new role's need of {need:,}"


def wait_for_go(p: Ports, signals: Signals) -> str | None:
    """Its wave's "go", or why the group rolled back first (no word within wait_s: it aborts itself)."""
    assert p.req.group is not None
    rank, wait_s = p.req.group.rank, p.req.group.wait_s
    if not wait_until(lambda: signals.gone() or signals.decided() is not None, wait_s):
        signals.claim(Decision.ABORT, f"rank {rank} got no start signal within {wait_s:.0f} s", "node")
    stands = signals.decided()
    if stands is not None and stands.decision is Decision.ABORT:
        return f"the group rolled back before its wave ({stands.reason})"
    return None


def failed(p: Ports, run: Run, change: Change, reason: str, started: WatchResult) -> Result:
    """Its vote failed: the group aborts, and this unit goes back to its old unit with a restart."""
    assert p.req.group is not None
    rank = p.req.group.rank
    stands = Signals(p.state.txn_dir(p.txn)).claim(Decision.ABORT, f"rank {rank}: {reason}", "node")
    p.log.emit(Stage.GROUP, "warning", f"rank {rank} failed: {reason}", vote="failed")
    p.log.emit(Stage.GROUP, "step", f"the group rolled back: {stands.reason}", decision="abort")
    broken = replace(started, verdict=fail(reason, Failure.SERVICE_FAILED))
    return roll_back(p, run, change, reason, broken)


def router_written(p: Ports, run: Run, change: Change) -> Result:
    """The router's member when its unit changes by switched roles alone: the running router was told
    through its API (each switched member went back in with its new role), so its unit is written for a
    later start and not restarted. At its wave it checks the whole with a routed completion, as a
    restarted router does. An abort restores its old unit and restarts it (it registers every unit from
    its command line again); so does a recovery (the record loses its invocation)."""
    assert p.req.group is not None
    untouched_no_more(p)
    started = running(p)
    p.log.emit(Stage.SWITCH, "step", "its unit changes by the switched roles alone: written, no restart; "
               f"rank {p.req.group.rank} waits for its wave", vote="stopped")  # fmt: skip
    aborted = wait_for_go(p, Signals(p.state.txn_dir(p.txn)))
    if aborted is not None:
        return roll_back(p, run, change, aborted, started)
    why = verify(p, run, started, change)
    if why is not None:
        return failed(p, run, change, why, started)
    p.log.emit(Stage.GROUP, "step", f"rank {p.req.group.rank} ready: waiting for the group's decision",
               vote="ready")  # fmt: skip
    result = groupstep.decided(p, run, Signals(p.state.txn_dir(p.txn)), started, change)
    if result.outcome is Outcome.APPLIED:
        result.message = f"{p.unit}: its unit written, no restart (the router was told through its API)"
    return result
