"""The pipeline as users start it: inventory, facts, plan, render, confirm, transaction, report.

The planner, the template engine and the report (agent/apply.py, agent/report.py) load only once the
facts request is on its way: the host gathers its facts meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from agent.errors import UsageError
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig, load_service, units_dir
from agent.orchestrate.asked import Change, Connection
from agent.orchestrate.backup_names import remember
from agent.orchestrate.session import (
    Session,
    confirm,
    follow,
    pending_recovery,
    recover_orphan,
    session,
    status_text,
)
from agent.output import Output, Style
from agent.protocol.answers import BackupsAnswer, StatusAnswer, as_facts
from agent.protocol.events import Event, exit_code
from agent.remote.client import Conversation, base_request

if TYPE_CHECKING:
    from agent.sglang.flags import FlagValue


def apply(conn: Connection, change: Change, out: Output, host: HostConfig | None = None) -> int:
    """One change of a service: `host` is its inventory entry where the command loaded it already."""
    host = host or load_service(conn.host, units_dir(conn.units))
    if host.pd is not None:  # a prefill-decode service: one group change over the units that restart
        from agent.group.pdapply import apply as apply_pd

        return apply_pd(host, conn, _pd_change(change), out)
    if host.nodes is not None:  # one service over several hosts: one coordinated change of every node
        from agent.group.apply import apply as apply_group

        return apply_group(host, conn, change, out)
    with session(conn, host) as s:
        ask = base_request(s.host, "facts")
        # facts and the apply planned from them go to one agent process over one channel
        with s.client.converse(ask) as talk:
            _load_planner(s.host)  # while the host gathers the facts just asked for
            # a dry run sends nothing but facts: it says a recovery is pending and plans from the unit as is
            said = change.dry_run and pending_recovery(out, s.host.name, talk.answer)
            if said or not talk.answer.get("orphan"):
                return _apply(out, s, change, talk, units_dir(conn.units))
        recover_orphan(out, s, talk.answer)  # rare: finish a dead agent's change, then plan afresh
        with s.client.converse(ask) as talk:
            return _apply(out, s, change, talk, units_dir(conn.units))


def _pd_change(change: Change) -> Change:
    """What a [pd] apply takes: the context; each role's flags are its [pd] unit's."""
    if change.flags or change.max_running_requests is not None or change.mem_fraction_static is not None:
        raise UsageError("--set, --max-running-requests, --mem-fraction-static: not for a [pd] service; "
                         "set each role's flags in its [pd] unit")  # fmt: skip
    return change


def _load_planner(host: HostConfig) -> None:
    from agent import apply as planned

    planned.preload(host)


def _apply(out: Output, s: Session, change: Change, talk: Conversation, units: Path) -> int:
    from agent import apply as planned
    from agent.plan.hostwire import neighbours

    facts = as_facts(talk.answer)
    sent = planned.prepare(out, s.host, change, facts, neighbours(s.host, units))
    if sent is None:
        return int(ExitCode.OK)
    confirm(out, change.yes, s.host)
    outcome = follow(out, s, sent.request, talk)
    remember(s.host.name, [outcome.outcome_data().get("backup")])  # the unit this apply replaced, kept
    return planned.report(out, s.host, sent, outcome, facts)


def backup_listing(s: Session) -> BackupsAnswer:
    """The host's backups, with the values of secret flags (api-key, token...) replaced for printing."""
    from agent.report import redact_backups

    listing = cast(BackupsAnswer, s.client.call(base_request(s.host, "backups")))
    remember(s.host.name, (str(r.get("name") or "") for r in listing.get("backups") or []), every=True)
    redact_backups(listing.get("backups") or [])
    return listing


def rollback(conn: Connection, to: str | None, out: Output, *, yes: bool) -> int:
    host = load_service(conn.host, units_dir(conn.units))
    if host.pd is not None:  # every unit with a previous unit back to it, as one group change
        from agent.group.pdrollback import rollback as pd_rollback

        return pd_rollback(host, conn, to, out, yes=yes)
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
        remember(s.host.name, [outcome.outcome_data().get("backup")])  # the unit it replaced, kept
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

    host = load_service(conn.host, units_dir(conn.units))
    if host.pd is not None:  # each role's unit and the router's, each with its own backups
        from agent.group.pdinfo import backups as pd_backups

        return pd_backups(host, conn, out)
    with session(conn, host) as s:
        listing = backup_listing(s)
        if out.style is Style.JSON:
            out.print(json.dumps(listing, sort_keys=True))
        else:
            out.print(backups_table(s.host.name, listing.get("backups") or []).rstrip())
        return int(ExitCode.OK)


def status(conn: Connection, out: Output, *, follow_running: bool) -> int:
    host = load_service(conn.host, units_dir(conn.units))
    if host.pd is not None:  # each role's units and the router, each its own unit
        from agent.group.pdstatus import status as pd_status

        if follow_running:
            raise UsageError("--follow: not for a [pd] service; its status shows each unit's running change")

        return pd_status(host, conn, out)
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
