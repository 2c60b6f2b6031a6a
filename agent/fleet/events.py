"""Progress and results of a rollout as JSON lines in one file that the front end follows."""

from __future__ import annotations

import json
import os

from agent.fleet.results import FleetEvent
from agent.fleet.steps import Emit

ENV = "DEPLOYCTL_FLEET_EVENTS"


def write(event: FleetEvent) -> None:
    """Append one line; O_APPEND and a single write keep lines from parallel workers whole."""
    path = os.environ.get(ENV)
    if not path:
        return
    data = (json.dumps(event, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def emitter(host: str) -> Emit:
    def emit(phase: str, message: str) -> None:
        write({"kind": "phase", "host": host, "phase": phase, "message": message})

    return emit
