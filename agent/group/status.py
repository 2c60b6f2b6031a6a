"""`deployctl status` of a multi-node service: every node's state, and a word when a rank is down.

SGLang has no cross-node heartbeat (issues #3099, #4780): with node rank 1 dead, node 0 goes on answering
/health while every request that needs the dead rank hangs. So the group's health is every node's unit,
not node 0's /health.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

from agent.exitcodes import ExitCode
from agent.group.nodes import node_hosts
from agent.inventory import HostConfig
from agent.orchestrate.asked import Connection
from agent.orchestrate.session import clients
from agent.output import Output, Style
from agent.protocol.answers import StatusAnswer, UnitStateData
from agent.remote.client import base_request


def running(state: UnitStateData | None) -> bool:
    return state is not None and (state["active_state"], state["sub_state"]) == ("active", "running")


def down_ranks(states: Sequence[UnitStateData | None]) -> list[int]:
    """The ranks whose unit is not running, when node 0's is (else the whole service is just down)."""
    if not states or not running(states[0]):
        return []
    return [rank for rank, state in enumerate(states) if not running(state)]


def warning(host: HostConfig, states: Sequence[UnitStateData | None]) -> str | None:
    down = down_ranks(states)
    if not down:
        return None
    names = ", ".join(f"rank {r} ({host.node_targets[r]})" for r in down)
    return (
        f"{names} not running while rank 0 runs: rank 0 may still answer /health, but requests that need "
        f"every rank hang; restart the group (deployctl apply {host.name} ...)"
    )


def statuses(hosts: Sequence[HostConfig], conn: Connection, out: Output) -> list[StatusAnswer]:
    """Each unit's status, a dead agent's change on it recovered first (the one-host rule)."""
    from agent.orchestrate.session import Session, recover_orphan

    answers: list[StatusAnswer] = []
    with clients(list(hosts), conn) as agents:
        for node, agent in zip(hosts, agents, strict=True):
            answer = cast(StatusAnswer, agent.call(base_request(node, "status")))
            if recover_orphan(out, Session(node, agent), answer):
                answer = cast(StatusAnswer, agent.call(base_request(node, "status")))
            answers.append(answer)
    return answers


def status(host: HostConfig, conn: Connection, out: Output) -> int:
    from agent.orchestrate.session import status_text

    hosts = node_hosts(host)
    answers = statuses(hosts, conn, out)
    said = warning(host, [a.get("state") for a in answers])
    if out.style is Style.JSON:
        out.print(json.dumps({"ranks": answers, "warning": said}, sort_keys=True, default=str))
        return int(ExitCode.OK)
    for rank, (node, answer) in enumerate(zip(hosts, answers, strict=True)):
        out.print(f"rank {rank}: " + status_text(node.ssh.target, node.unit.name, answer))
    if said:
        out.print(f"WARNING: {said}")
    return int(ExitCode.OK)
