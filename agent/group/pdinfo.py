"""`deployctl backups` and `deployctl facts` of a [pd] service: each unit asked as its own unit (prefills,
decodes, then the router), over one connection per host.

backups: each unit's backups, newest first, with their flag differences, as the one-host command prints
them. facts: each prefill's and decode's facts document, as the one-host command prints it, with the transfer
facts its agent read for the unit's Python (host/roles/pdfacts.py); the router serves no model and has none.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import TypedDict, cast

from agent.exitcodes import ExitCode
from agent.group.pdstatus import parts
from agent.inventory import HostConfig
from agent.orchestrate.asked import Connection
from agent.orchestrate.session import clients
from agent.output import Output, Style
from agent.protocol.answers import BackupsAnswer, FactsDoc, HostFacts, PdFactsData
from agent.remote.client import AgentClient, base_request

Unit = tuple[str, HostConfig]  # its label (prefill[0], decode[0], router) and the unit as a service


class UnitFacts(TypedDict):
    """One role's facts as `facts --json` prints them: its facts document (None: its agent read no model
    folder) and its transfer facts (None: no installed prefill or decode unit)."""

    label: str
    target: str
    unit: str
    facts: FactsDoc | None
    pd: PdFactsData | None


@contextlib.contextmanager
def per_host(units: Sequence[Unit], conn: Connection) -> Iterator[dict[str, AgentClient]]:
    """One agent per host: several units of one host are asked over its one connection."""
    first = {u.ssh.target: u for _, u in units}  # one HostConfig per target: its [ssh] settings
    with clients(list(first.values()), conn) as agents:
        yield dict(zip(first, agents, strict=True))


def backups(host: HostConfig, conn: Connection, out: Output) -> int:
    from agent.report import backups_table, redact_backups

    units = parts(host)
    listings: list[BackupsAnswer] = []
    with per_host(units, conn) as agent_of:
        for _, unit in units:
            listing = cast(BackupsAnswer, agent_of[unit.ssh.target].call(base_request(unit, "backups")))
            redact_backups(listing.get("backups") or [])
            listings.append(listing)
    if out.style is Style.JSON:
        doc = [{**_named(label, u), **listing} for (label, u), listing in zip(units, listings, strict=True)]
        out.print(json.dumps({"service": host.name, "units": doc}, sort_keys=True, default=str))
        return int(ExitCode.OK)
    for (label, unit), listing in zip(units, listings, strict=True):
        table = backups_table(f"{label} {unit.ssh.target} {unit.unit.name}", listing.get("backups") or [])
        out.print(table.rstrip())
    return int(ExitCode.OK)


def _named(label: str, unit: HostConfig) -> dict[str, str]:
    return {"label": label, "target": unit.ssh.target, "unit": unit.unit.name}


def facts(host: HostConfig, conn: Connection, out: Output) -> int:
    from agent.plan.factsdoc import filled

    units = [(label, u) for label, u in parts(host) if label != "router"]  # the router has no model
    answers: list[HostFacts] = []
    with per_host(units, conn) as agent_of:
        answers = [cast(HostFacts, agent_of[u.ssh.target].call(base_request(u, "facts"))) for _, u in units]
    docs: list[UnitFacts] = []
    for (label, unit), answer in zip(units, answers, strict=True):
        model = answer.get("model_facts")
        docs.append(UnitFacts(
            label=label, target=unit.ssh.target, unit=unit.unit.name,
            facts=filled(model, unit) if isinstance(model, dict) else None, pd=answer.get("pd"),
        ))  # fmt: skip
    if out.style is Style.JSON:
        out.print(json.dumps({"service": host.name, "units": docs}, indent=2, sort_keys=True, default=str))
    else:
        out.print("\n".join(line for doc in docs for line in _text(doc)))
    return int(ExitCode.OK)


def _text(doc: UnitFacts) -> list[str]:
    from agent.plan.factsdoc import facts_lines, transfer_lines

    name = f"{doc['label']} {doc['target']} {doc['unit']}"
    if doc["facts"] is None:
        lines = [f"facts for {name}: no installed unit with a local model folder (a config.json) to read"]
    else:
        lines = facts_lines(name, doc["facts"])
    return [*lines, *transfer_lines(doc["pd"])]
