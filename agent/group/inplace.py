"""Whether a multi-node service has nothing to do: each node's agent decides, under its lock, with the
check the one-host apply makes (agent/host/runner.py `compare`: the unit, the secrets' content, a
daemon-reload pending, the running process started from that file, the pool against the target). The
laptop only asks; it never decides from the unit's hash, which cannot see a rotated secret."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from agent.protocol.requests import Request


class Asks(Protocol):
    def call(self, req: Request) -> dict[str, object]: ...


def every_node_in_place(agents: Sequence[Asks | None], requests: Sequence[Request]) -> bool:
    """True when every node's agent answers that an apply of its request would find nothing to do; the
    first node that does not (or cannot say) stops the asking: then every node takes part in the change."""
    for agent, req in zip(agents, requests, strict=True):
        if agent is None:
            return False
        answer = agent.call(replace(req, verb="compare", group=None, txn=None))
        if answer.get("up_to_date") is not True:
            return False
    return True
