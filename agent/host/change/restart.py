"""The restart step of the host transaction: drain the running server, restart (a group's node: stop, wait
for every rank's stop, then start), and watch the start to the gate's verdict (host/watch/start.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from agent.host.change import settle
from agent.host.change.decide import Failure, Gate, fail
from agent.host.change.jobs import Job
from agent.host.change.ports import Ports, Run, node_rank
from agent.host.events import utc_now
from agent.host.roles.groupnode import NodeWaits
from agent.host.roles.groupsignal import Signals, files_of
from agent.host.roles.pdrouter import is_router, watch_router
from agent.host.watch import gpu_at_start
from agent.host.watch.poll import wait_until
from agent.host.watch.start import WatchedStart, WatchResult, watch_start
from agent.protocol.common import unit_sha256
from agent.protocol.events import Stage
from agent.protocol.groupmachine import Decision, Phase, Saw, node_step
from agent.protocol.groupmachine import Node as GroupNode
from agent.protocol.grouprecord import start_bound_s
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, stop_timeout_s

if TYPE_CHECKING:
    from agent.host.systemd import JobResult


def restart_and_watch(
    p: Ports, run: Run, gate: Gate, stage: Stage, barrier: Signals | None = None
) -> WatchResult:
    cursor = p.journal.cursor()
    before = p.systemd.unit_state(p.unit)
    gate = replace(gate, follower=node_rank(p.files.read(p.unit) or "") >= 1)
    if p.req.group is not None:  # a rank waits at the rendezvous for its peers, silently
        t, more = gate.timeouts, p.req.group.wait_s
        waits = replace(t, weights_s=t.weights_s + more, no_progress_s=t.no_progress_s + more)
        gate = replace(gate, timeouts=waits)
    job = drained_restart(p, run, before.invocation_id, barrier)
    if barrier is not None and not barrier.back and run.barrier:  # never started: not every rank stopped
        return WatchResult(fail(run.barrier, Failure.TIMEOUT), {}, 0.0)
    if barrier is not None and barrier.back and run.in_doubt:  # stopped, and stays so
        return WatchResult(fail(run.in_doubt, Failure.TIMEOUT), {}, 0.0)
    if p.daemon.failed is not None:  # [weight_cache]: the engine was not started onto a dead daemon
        return WatchResult(fail(p.daemon.failed, Failure.SERVICE_FAILED), {}, 0.0)
    after = p.systemd.unit_state(p.unit)
    p.log.emit(
        Stage.RESTART,
        "step",
        f"restart job {job.result}",
        invocation=after.invocation_id,
        job=job.result,
        stopping_at=run.stopping_at,
    )
    n0 = after.n_restarts
    if after.invocation_id == before.invocation_id and not job.ok:
        n0 = -1  # the job failed before a new invocation: decide() sees a crash at once
    if is_router(p):  # a [pd] service's router: no pool to gate, its /health is its readiness
        return watch_router(p, after.invocation_id)
    abandon_if = abandon(p, barrier) if barrier is not None and not barrier.back else None
    held, on_pool = gpu_recorder(p, after.invocation_id)
    start = WatchedStart(
        p.unit, p.journal, p.systemd, gate, cursor, after.invocation_id, max(n0, 0), abandon_if, on_pool
    )
    watched = watch_start(start, p.log, stage)
    held.finish(lambda why: p.log.emit(stage, "warning", why))
    return watched


def after_check(p: Ports, started: WatchResult, gate: Gate, cursor: str | None) -> WatchResult | str | None:
    """[weight_cache], before the commit (host/change/settle.py): None when the verified start still runs;
    the engine's new start, watched, when its daemon's crash restarted it under the checks; why not, when
    the daemon or the engine stayed down. One look at both units when nothing happened."""
    if not p.daemon.client_of(p.files.read(p.unit)):  # a client of OUR daemon (not only the flag)
        return None

    def look() -> settle.Seen:
        d, e = p.systemd.unit_state(p.daemon.name), p.systemd.unit_state(p.unit)
        return settle.Seen(d.active_state, d.sub_state, e.active_state, e.invocation_id)

    found = settle.settle(look, started.invocation_id, p.daemon.ready_s)
    if found is settle.Settled.KEPT:
        return None
    if found is settle.Settled.DAEMON_DOWN:
        return f"the weight-cache daemon {p.daemon.name} went down while the start was checked"
    if found is settle.Settled.ENGINE_DOWN:
        return f"{p.unit} was stopped with its weight-cache daemon and not started again"
    state = p.systemd.unit_state(p.unit)
    why = "its weight-cache daemon came back from a crash"
    p.log.emit(Stage.WATCH, "warning", f"{p.unit} was restarted under the checks ({why}): watching and "
               "checking its new start", invocation=state.invocation_id)  # fmt: skip
    start = WatchedStart(p.unit, p.journal, p.systemd, gate, cursor, state.invocation_id, state.n_restarts)
    return watch_start(start, p.log, Stage.WATCH)


def gpu_recorder(p: Ports, invocation: str) -> tuple[gpu_at_start.Recorder, Callable[[], None]]:
    """What the GPU processes hold once the start logs its pool: the facts' at_start_mib
    (host/watch/gpu_at_start.py), under the start that logged it (the watch may follow a newer one)."""
    held = gpu_at_start.Recorder(p.state.unit_dir(p.unit), invocation, lambda: p.gpu_procs(p.unit))

    def on_pool() -> None:
        held.invocation = p.systemd.unit_state(p.unit).invocation_id or held.invocation
        held.begin()

    return held, on_pool


def abandon(p: Ports, barrier: Signals) -> Callable[[], str | None]:
    """While a group's node starts: the group's abort ends its watch (the group machine's step), so it
    stops at once instead of waiting out a start that cannot complete without its stopping peers."""
    assert p.req.group is not None
    rank = p.req.group.rank

    def why() -> str | None:
        node, _ = node_step(GroupNode(rank, Phase.STARTING, files_of(barrier)), Saw.SIGNAL)
        stands = barrier.decided()
        if node.phase is not Phase.BACK or stands is None:
            return None
        return f"the group rolled back while rank {rank} started ({stands.reason})"

    return why


def drained_restart(p: Ports, run: Run, old_invocation: str, barrier: Signals | None = None) -> JobResult:
    """Let the running server finish what it has (bounded by [drain] timeout_s), then restart; a node
    of a group stops, waits for the coordinator's "go" and only then starts."""
    from agent.host.watch.drainer import restart_drained

    # The job covers SGLang's own drain (up to TimeoutStopSec) before the new process starts.
    timeout = stop_timeout_s(p.req.drain_timeout_s, p.req.drain_stop_allowance_s)

    def restart() -> JobResult:
        run.stopping_at = utc_now()  # the old server stops answering from here: the downtime begins
        if barrier is not None:
            return stop_then_start(p, run, barrier, timeout + RESTART_JOB_TIMEOUT_S)
        t = timeout + RESTART_JOB_TIMEOUT_S  # [weight_cache]: the daemon's (re)start or stop comes first
        job: JobResult = p.daemon.restart_engine(lambda: p.systemd.restart(p.unit, t), t)
        return job

    def old_log() -> list[str]:  # the old server's last words: SGLang's own drain lines
        return p.journal.invocation_tail(p.unit, old_invocation, 50) if old_invocation else []

    job, drained = restart_drained(p.req, p.secrets.api_key(), restart, p.log, old_log)
    run.drains.append(drained)
    p.log.emit(Stage.DRAIN, "step", drained.describe(), **drained.to_dict())
    return job


def waits(p: Ports, run: Run, signals: Signals) -> NodeWaits:
    """A group node's waits for its group's word (host/roles/groupnode.py), bounded by rank 0's start."""
    assert p.req.group is not None
    stop_s = stop_timeout_s(p.req.drain_timeout_s, p.req.drain_stop_allowance_s)
    bound = run.group_start_bound_s or start_bound_s(p.req, stop_s + RESTART_JOB_TIMEOUT_S)
    return NodeWaits(signals, p.req.group.rank, p.req.group.wait_s, bound)


def stop_then_start(p: Ports, run: Run, barrier: Signals, timeout: float) -> JobResult:
    """A group's node: stop, tell the coordinator, start once every rank has stopped. A rank that
    started early would join the other ranks' old servers (their rendezvous port is the same)."""
    assert p.req.group is not None
    if barrier.back:
        return stop_then_start_old(p, run, barrier, timeout)
    stopped = stop_node(p, timeout)
    rank, wait_s = p.req.group.rank, p.req.group.wait_s
    p.log.emit(Stage.GROUP, "step", f"rank {rank} stopped ({stopped.result}): waiting for every rank "
               "to stop", vote="stopped", job=stopped.result)  # fmt: skip
    if not wait_until(lambda: barrier.gone() or barrier.decided() is not None, wait_s):
        barrier.claim(Decision.ABORT, f"rank {rank} got no start signal within {wait_s:.0f} s", "node")
    stands = barrier.decided()
    if stands is not None and stands.decision is Decision.ABORT:  # by the coordinator, or on its own
        run.barrier = f"the group rolled back before the start ({stands.reason})"
        run.no_go = waits(p, run, barrier).step(Phase.STOPPED, Saw.SIGNAL, "")[0].phase is Phase.ROLLED_BACK
        return stopped
    p.log.emit(Stage.GROUP, "step", f"every rank stopped: starting rank {rank}")
    job: JobResult = p.systemd.start(p.unit, RESTART_JOB_TIMEOUT_S)
    p.daemon.jobs.finished(2)
    return job


def stop_node(p: Ports, timeout: float) -> JobResult:
    """A group node's first job: its jobs recorded (host/change/jobs.py: stop, then, on the group's word,
    start its unit), then the stop, recorded done."""
    sha = unit_sha256(p.files.read(p.unit) or "")
    p.daemon.jobs.plan([Job(p.unit, "stop", None), Job(p.unit, "start", sha)])
    stopped = stop_clean(p, timeout)
    p.daemon.jobs.finished(1)
    return stopped


def stop_clean(p: Ports, timeout: float) -> JobResult:
    """Stop, and see that no process of the unit is left: on the real two-node server a stop once
    logged "Failed to kill control group ...: Input/output error" and the next start failed with
    219/CGROUP; on a GPU host a leftover scheduler would also hold memory the next pool counts on."""
    stopped = p.systemd.stop(p.unit, timeout)
    left = p.systemd.leftovers(p.unit)
    if left:
        p.log.emit(Stage.GROUP, "warning", f"{len(left)} process(es) left after the stop "
                   f"({', '.join(map(str, left[:5]))}): killing them")  # fmt: skip
        p.systemd.kill(p.unit, 9)
        wait_until(lambda: not p.systemd.leftovers(p.unit), 30.0)
    return stopped


def stop_then_start_old(p: Ports, run: Run, barrier: Signals, timeout: float) -> JobResult:
    """The rollback of a group's node: stop the new server, and start the old one once every rank
    has stopped its new one (an old rank must not meet a new one at the rendezvous); with no word
    from the coordinator within wait_s, start it anyway: the others do the same."""
    assert p.req.group is not None
    stopped = stop_node(p, timeout)
    rank, wait_s = p.req.group.rank, p.req.group.wait_s
    p.log.emit(Stage.GROUP, "step", f"rank {rank} stopped ({stopped.result}) to roll back: waiting "
               "for every rank to stop", vote="stopped_back", job=stopped.result)  # fmt: skip
    node = waits(p, run, Signals(barrier.folder)).back(run.no_go)
    if node.phase is Phase.IN_DOUBT:  # a peer's new server may run, or come back under Restart=
        run.in_doubt = (
            f"no go-back from deployctl within {wait_s:.0f} s: rank {rank} stays stopped (an old start "
            "could meet a peer's new server); deployctl apply again brings the group back together"
        )
        p.log.emit(Stage.GROUP, "warning", run.in_doubt)
        return stopped
    why = "no rank took go" if run.no_go else "every rank stopped"
    p.log.emit(Stage.GROUP, "step", f"{why}: starting rank {rank}'s old unit")
    job: JobResult = p.systemd.start(p.unit, RESTART_JOB_TIMEOUT_S)
    p.daemon.jobs.finished(2)
    return job
