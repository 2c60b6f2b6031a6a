"""Recalibration from the canary: which measured starts of other hosts may plan this one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from agent.inventory import HostConfig
from agent.plan.model import Flags, parallelism
from agent.sglang.logs.summary import StartFigures


class MeasuredFact(TypedDict):
    """A canary's measurement as an Ansible fact (Measured.to_fact)."""

    host: str
    key: list[str]
    start: StartFigures


@dataclass(frozen=True)
class Measured:
    """One host's measured start after its change, keyed by what makes two starts comparable."""

    host: str
    key: tuple[str, ...]
    start: StartFigures

    def to_fact(self) -> MeasuredFact:
        return {"host": self.host, "key": list(self.key), "start": self.start.copy()}

    @classmethod
    def from_fact(cls, fact: Mapping[str, Any]) -> Measured | None:
        try:
            return cls(
                str(fact["host"]), tuple(str(k) for k in fact["key"]), cast(StartFigures, dict(fact["start"]))
            )
        except (KeyError, TypeError, ValueError):
            return None


def peer_key(host: HostConfig, flags: Flags) -> tuple[str, ...]:
    """Same GPU model and count, model, SGLang version and parallelism: the same pool arithmetic."""
    tp, dp = parallelism(host, flags)
    return (host.gpus.name, str(host.gpus.count), host.model.path, host.sglang.version, f"tp{tp}", f"dp{dp}")


def peers_for(host: HostConfig, flags: Flags, facts: Iterable[Mapping[str, Any]]) -> list[Measured]:
    """The comparable measurements of other hosts (the canaries), in host-name order."""
    key = peer_key(host, flags)
    found = [m for m in (Measured.from_fact(f) for f in facts) if m is not None]
    return sorted((m for m in found if m.host != host.name and m.key == key), key=lambda m: m.host)
