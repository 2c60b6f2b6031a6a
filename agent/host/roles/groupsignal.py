"""A multi-node change's signals to one node, kept as files in that node's transaction folder.

The coordinator (deployctl on the laptop) delivers "go" and the group's decision over any SSH connection
(the `signal` verb), so a dropped link loses nothing: the next connection delivers it, and the node's
transaction reads files, not a socket. The decision has one writer that wins: the coordinator's commit or
abort, or the node's own abort when no decision came in time. Both claim it by hard-linking a finished
file to one name, which succeeds once; whoever comes second reads the winner. So a node never keeps a
unit the coordinator rolled back elsewhere, nor rolls back one the coordinator was told it kept.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from agent.protocol.groupmachine import Decision, Files


@dataclass(frozen=True)
class Decided:
    decision: Decision
    reason: str
    by: str  # "deployctl" or "node": who claimed it


@dataclass(frozen=True)
class Signals:
    """The signal files of one transaction on this node."""

    folder: Path

    back: bool = False  # the rollback's barrier: every rank stopped its new server, start the old ones

    @property
    def _go(self) -> Path:
        return self.folder / ("group-go-back" if self.back else "group-go")

    @property
    def _decision(self) -> Path:
        return self.folder / "group-decision"

    def for_rollback(self) -> Signals:
        return Signals(self.folder, back=True)

    def go(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._go.touch()

    def gone(self) -> bool:
        return self._go.exists()

    def decided(self) -> Decided | None:
        try:
            text = self._decision.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        word, _, rest = text.partition("\n")
        by, _, reason = rest.partition("\n")
        return Decided(Decision(word), reason, by)

    def claim(self, decision: Decision, reason: str, by: str) -> Decided:
        """Write the decision unless one is there already; the one that stands either way."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".group-decision.{os.getpid()}.{time.monotonic_ns()}"
        with tmp.open("w", encoding="utf-8") as f:
            f.write(f"{decision.value}\n{by}\n{reason}")
            f.flush()
            os.fsync(f.fileno())  # on disk before it can win: a host that reboots keeps what was decided
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, self._decision)  # atomic and exclusive: the first claim wins
        finally:
            tmp.unlink(missing_ok=True)
        found = self.decided()
        assert found is not None
        return found


def files_of(signals: Signals) -> Files:
    """A node's signal files as the machine sees them."""
    stands = signals.decided()
    return Files(
        go=Signals(signals.folder).gone(),
        go_back=signals.for_rollback().gone(),
        decision=stands.decision if stands else None,
        by_node=stands is not None and stands.by == "node",
    )
