"""The pipeline as users start it: inventory, facts, plan, render, confirm, transaction, report.

The planner, the template engine and the report (agent/apply.py, agent/report.py) load only once the
facts request is on its way: the host gathers its facts meanwhile.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from agent.cli.options import NO_TERMINAL, Change, Connection
from agent.errors import ConnectError, UsageError
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig, load_service, units_dir
from agent.output import Output, Style
from agent.progress import Progress
from agent.protocol import BackupsAnswer, Event, Request, StatusAnswer, as_facts, exit_code, new_txn_id
from agent.remote.client import AgentClient, Conversation, base_request, open_transport
from agent.remote.transport import ConnectionLost

if TYPE_CHECKING:
    from agent.sglang.flags import FlagValue


@dataclass
class Session:
    host: HostConfig
    client: AgentClient


@contextlib.contextmanager
def session(conn: Connection) -> Iterator[Session]:
    """The service's host; for a multi-node service, its node rank 0 (the one that serves HTTP)."""
    from agent.group.nodes import node_host

    host = node_host(load_service(conn.host, units_dir(conn.units)), 0)
    if conn.local:
        host = host.model_copy(update={"ssh": host.ssh.model_copy(update={"target": "local"})})
    transport = open_transport(host, conn.accept_new_host_key)
    try:
        yield Session(host, AgentClient(transport, host))
    finally:
        transport.close()


def apply(conn: Connection, change: Change, out: Output) -> int:
    host = load_service(conn.host, units_dir(conn.units))
    if host.nodes is not None:  # one service over several hosts: one coordinated change of every node
        from agent.group.apply import apply as apply_group

        return apply_group(host, conn, change, out)
    with session(conn) as s:
        ask = base_request(s.host, "facts")
        # facts and the apply planned from them go to one agent process over one channel
        with s.client.converse(ask) as talk:
            _load_planner(s.host)  # while the host gathers the facts just asked for
            if not talk.answer.get("orphan"):
                return _apply(out, s, change, talk)
        recover_orphan(out, s, talk.answer)  # rare: finish a dead agent's change, then plan afresh
        with s.client.converse(ask) as talk:
            return _apply(out, s, change, talk)


def _load_planner(host: HostConfig) -> None:
    from agent import apply as planned

    planned.preload(host)


def _apply(out: Output, s: Session, change: Change, talk: Conversation) -> int:
    from agent import apply as planned

    facts = as_facts(talk.answer)
    sent = planned.prepare(out, s.host, change, facts)
    if sent is None:
        return int(ExitCode.OK)
    confirm(out, change.yes, s.host)
    outcome = follow(out, s, sent.request, talk)
    return planned.report(out, s.host, sent, outcome, facts)


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


def backup_listing(s: Session) -> BackupsAnswer:
    """The host's backups, with the values of secret flags (api-key, token...) replaced for printing."""
    from agent.render import redact_changes
    from agent.sglang.flags import FlagChange

    listing = cast(BackupsAnswer, s.client.call(base_request(s.host, "backups")))
    for row in listing.get("backups") or []:
        changes = redact_changes(
            [FlagChange(str(name), before, after) for name, before, after in row.get("changes", [])]
        )
        row["changes"] = [[c.name, c.before, c.after] for c in changes]
    return listing


def rollback(conn: Connection, to: str | None, out: Output, *, yes: bool) -> int:
    host = load_service(conn.host, units_dir(conn.units))
    if host.nodes is not None:
        raise UsageError(
            f"{host.name} is one service over {len(host.node_targets)} nodes: a rollback of one node would "
            "leave the others on the new unit; nothing was changed",
            hint=f"roll the whole group back with an apply of the old settings: deployctl apply {host.name} "
            "--context N (its nodes' backups: deployctl backups)",
        )
    with session(conn) as s:
        rows = backup_listing(s).get("backups") or []
        # The default is the newest backup that differs from the installed unit: after an automatic
        # rollback the newest one is a copy of what is installed, and restoring it would change nothing.
        name = to or next((r["name"] for r in rows if not r.get("same_as_installed")), None)
        chosen = next((r for r in rows if r["name"] == name), None)
        if chosen is None:
            known = ", ".join(r["name"] for r in rows[:5]) or "none"
            what = name or "that differs from the installed unit"
            raise UsageError(
                f"{s.host.name}: no backup {what} of {s.host.unit.name}", hint=f"backups: {known}"
            )
        if out.style is not Style.JSON:
            out.note(f"== rollback of {s.host.name} to {name}")
            for flag, before, after in chosen.get("changes", []):
                out.note(f"   --{flag}: {after} -> {before}")
        confirm(out, yes, s.host)
        # Only a backup the person named goes on the wire: the host picks the same default itself, and
        # treats a named one as a person's own way out of a failed recovery.
        outcome = follow(out, s, base_request(s.host, "rollback", backup=to))
        result = str(outcome.data.get("outcome"))
        if out.style is not Style.JSON:
            _report_rollback(out, s, chosen.get("changes", []), outcome)
        return int(exit_code(result))


def _report_rollback(
    out: Output, s: Session, changes: Sequence[Sequence[FlagValue | None]], outcome: Event
) -> None:
    """The rollback's report, the flags it restored and the way back to the unit it replaced."""
    from agent.report import ApplyReport, render_report

    result = str(outcome.data.get("outcome"))
    data = outcome.outcome_data()
    report = ApplyReport(s.host.name, s.host.unit.name, None, None, {}, {}, result, outcome.message, data)
    out.print(render_report(report).rstrip())
    if changes and result == "applied":
        restored = (f"--{flag} {after} -> {before}" for flag, before, after in changes)
        out.print("flags restored: " + ", ".join(restored))
    backup = data.get("backup")
    if backup and result == "applied":
        out.print(f"the unit replaced by this rollback is kept as {backup}; undo with:")
        out.print(f"  deployctl rollback {s.host.name} --to {backup}")


def backups(conn: Connection, out: Output) -> int:
    from agent.report import backups_table

    with session(conn) as s:
        listing = backup_listing(s)
        if out.style is Style.JSON:
            out.print(json.dumps(listing, sort_keys=True))
        else:
            out.print(backups_table(s.host.name, listing.get("backups") or []).rstrip())
        return int(ExitCode.OK)


def status(conn: Connection, out: Output, *, follow_running: bool) -> int:
    host = load_service(conn.host, units_dir(conn.units))
    if host.nodes is not None:  # every node's state; a rank down while rank 0 still answers is said
        from agent.group.status import status as group_status

        return group_status(host, conn, out)
    with session(conn) as s:
        st = _status(s)
        if recover_orphan(out, s, st):
            st = _status(s)
        running = st.get("running")
        if follow_running and running:
            outcome = follow(out, s, base_request(s.host, "follow", txn=running["txn"]))
            st = _status(s)
            st["followed_outcome"] = outcome.data.get("outcome")
        if out.style is Style.JSON:
            out.print(json.dumps(st, sort_keys=True, default=str))
        else:
            out.print(status_text(s.host.name, s.host.unit.name, st))
        return int(ExitCode.OK)


def _status(s: Session) -> StatusAnswer:
    return cast(StatusAnswer, s.client.call(base_request(s.host, "status")))


def recover_orphan(out: Output, s: Session, answer: Mapping[str, object]) -> bool:
    """An earlier change's agent died (killed, host restarted): finish it before anything else."""
    if not answer.get("orphan"):
        return False
    out.note(f"== {s.host.name}: the agent of an earlier change died before it finished; recovering first")
    outcome = follow(out, s, base_request(s.host, "recover"))
    out.note(f"== {s.host.name}: {outcome.message}")
    return True


def status_text(host: str, unit: str, st: StatusAnswer) -> str:
    state = st.get("state")
    active, sub = (state.get("active_state", "?"), state.get("sub_state", "?")) if state else ("?", "?")
    lines = [f"{host} {unit}: {active}/{sub}"]
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
