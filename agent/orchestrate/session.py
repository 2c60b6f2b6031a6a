"""One host's session on the laptop: its agent client, the confirmation, following a transaction to its
outcome, an orphaned change's recovery and the status text; a group's many clients. `deploy.py` (one host)
and `group/` (a group) use it; it imports neither."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from agent.errors import ConnectError, UsageError
from agent.inventory import HostConfig, load_service, units_dir
from agent.orchestrate.asked import NO_TERMINAL, Connection
from agent.output import Output
from agent.progress import Progress
from agent.protocol.answers import StatusAnswer
from agent.protocol.common import new_txn_id
from agent.protocol.events import Event
from agent.protocol.requests import Request
from agent.remote.client import AgentClient, Conversation, base_request, open_transport
from agent.remote.transport import ConnectionLost


@dataclass
class Session:
    host: HostConfig
    client: AgentClient


@contextlib.contextmanager
def session(conn: Connection, service: HostConfig | None = None) -> Iterator[Session]:
    """The service's host (`service`, where the command loaded it already); for a multi-node service, its
    node rank 0 (the one that serves HTTP)."""
    from agent.group.nodes import node_host

    host = node_host(service or load_service(conn.host, units_dir(conn.units)), 0)
    if host.pd is not None:  # its base sections are no unit of their own: nothing may reach a host
        raise UsageError(
            f"{host.name} is a prefill-decode service ([pd]): for a [pd] file only plan, render, apply, "
            "status, rollback, backups and facts are built so far, not this command; nothing was changed",
            hint="see docs/pd.md",
        )
    if conn.local:
        host = host.model_copy(update={"ssh": host.ssh.model_copy(update={"target": "local"})})
    transport = open_transport(host, conn.accept_new_host_key)
    try:
        yield Session(host, AgentClient(transport, host))
    finally:
        transport.close()


def confirm(out: Output, yes: bool, host: HostConfig) -> None:
    """Ask on a terminal unless --yes; never ask without one (cron): then --yes is required."""
    if yes:
        return
    if not out.stdin_isatty:
        raise UsageError(NO_TERMINAL)
    try:
        answer = input(f"apply to {host.name} and restart {host.unit.name}? [y/N] ")
    except EOFError:  # Ctrl-D: no
        answer = ""
        print(file=out.stderr)
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was changed")


def follow(out: Output, s: Session, req: Request, talk: Conversation | None = None) -> Event:
    """Stream the transaction's events until its outcome; a dropped link is re-attached to by itself
    (remote/follow.py, the follower the fleet uses too), and says how to when that fails.

    With `talk`, the request goes to the agent process that answered the facts it was planned from.
    """
    from agent.remote.follow import NOT_STARTED, Watch, connected
    from agent.remote.follow import follow as follow_transaction

    if req.txn is None and req.verb in ("apply", "rollback", "recover"):
        req = replace(req, txn=new_txn_id())  # chosen here: a re-attach then knows this one's outcome
    progress = Progress(out, s.host.name)

    def lost(why: str) -> None:
        progress.done()
        out.note(f"{s.host.name}: connection lost during {req.verb} ({why}); the host goes on alone: "
                 "re-attaching")  # fmt: skip

    watch = Watch(progress.show, lost, lambda: connected(s.host))
    try:
        outcome = follow_transaction(talk if talk is not None else s.client, s.host, req, watch)
    except KeyboardInterrupt:  # Ctrl-C stops this follower, not the transaction: it runs in its own unit
        progress.done()
        out.note(interrupted(s.host.name, req.verb))
        raise
    except ConnectionLost as exc:
        progress.done()
        raise ConnectError(
            f"{s.host.name}: connection lost during {req.verb} ({exc.message}); the host finishes the change "
            "on its own (commit or rollback)",
            hint=f"see it with: deployctl status {s.host.name}; re-running the same apply re-attaches",
        ) from None
    progress.done()
    if outcome.data.get("outcome") == "not_started":
        raise ConnectError(f"{s.host.name}: {NOT_STARTED}", hint=f"deployctl status {s.host.name}")
    return outcome


def interrupted(host: str, verb: str) -> str:
    """What Ctrl-C leaves: the host's change goes on (in a unit of its own), and how to follow it."""
    return (
        f"{host}: interrupted: deployctl stopped following the {verb}; the host goes on alone with what it "
        f"began and commits or rolls back by itself: follow it with `deployctl status {host} --follow`"
    )


def recover_orphan(out: Output, s: Session, answer: Mapping[str, object]) -> bool:
    """An earlier change's agent died (killed, host restarted): finish it before anything else."""
    if not answer.get("orphan"):
        return False
    out.note(f"== {s.host.name}: the agent of an earlier change died before it finished; recovering first")
    outcome = follow(out, s, base_request(s.host, "recover"))
    out.note(f"== {s.host.name}: {outcome.message}")
    return True


def pending_recovery(out: Output, name: str, answer: Mapping[str, object]) -> bool:
    """A dry run's word for what recover_orphan would do first: it sends nothing (no `recover`)."""
    if not answer.get("orphan"):
        return False
    out.note(
        f"== {name}: the agent of an earlier change died before it finished: a recovery is pending "
        "(an apply recovers it first, which restarts the unit); a dry run sends none"
    )
    return True


def status_text(host: str, unit: str, st: StatusAnswer) -> str:
    state = st.get("state")
    active, sub = (state.get("active_state", "?"), state.get("sub_state", "?")) if state else ("?", "?")
    lines = [f"{host} {unit}: {active}/{sub}"]
    daemon = st.get("daemon")
    if daemon:
        d_active = daemon.get("active_state", "?")
        lines.append(f"  weight-cache daemon {daemon.get('unit')}: {d_active}/{daemon.get('sub_state', '?')}")
        down = active not in ("active", "activating", "reloading") or sub == "auto-restart"
        if d_active == "active" and down:
            said = f"{active}/{sub}" if sub == "auto-restart" else active
            hint = "" if st.get("running") else f"; start it: systemctl start {unit}"  # not mid-change
            lines.append(
                f"  the engine is {said} while its weight-cache daemon runs: the service serves nothing{hint}"
            )
    r = st.get("running")
    if r:
        lines.append(
            f"  running: {r.get('verb')} transaction {r.get('txn')} "
            f"since {r.get('since')} (pid {r.get('pid')})"
        )
        lines.append(f"  follow it: deployctl status {host} --follow")
    last = st.get("last_outcome")
    if last:
        lines.append(
            f"  last transaction {st.get('last_txn')}: {last['data'].get('outcome')} at {last['ts']}"
        )
        lines.append(f"    {last['message']}")
    elif st.get("last_txn"):
        lines.append(f"  last transaction {st.get('last_txn')}: no outcome yet")
    if st.get("record") == "corrupt":
        lines.append(
            "  the recovery record is unreadable: every change is refused until a person compares the unit"
            " with its backups and removes the record"
        )
    elif st.get("pending"):
        lines.append(
            "  an unfinished transaction's recovery record is present: the next run restores the old unit"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def clients(hosts: Sequence[HostConfig], conn: Connection) -> Iterator[list[AgentClient]]:
    with contextlib.ExitStack() as stack:
        opened = []
        for host in hosts:
            transport = open_transport(host, conn.accept_new_host_key)
            stack.callback(transport.close)
            opened.append(AgentClient(transport, host))
        yield opened
