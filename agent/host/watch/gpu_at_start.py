"""On the GPU host: what each GPU process held when a start of the service logged its pool, and the facts'
`at_start_mib` read back from it.

A calibrated plan takes its memory from the service's last start, so what processes outside the service
hold NOW counts only beyond what they held THEN (agent/plan/overhead.py since_start). The transaction
records nvidia-smi's processes once the start it watches logs its pool (host/change/restart.py), keyed by the
unit's InvocationID; the facts use the record only when the unit still runs that same invocation, the one
whose log the facts' last_start is from. Stdlib only; nothing here raises into a change or the facts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.host.state import write_json_atomic
from agent.protocol.answers import GpuCard, GpuProcess

FORMAT = "deployctl-gpu-at-start/1"
FILE_NAME = "gpu_at_start.json"
FINISH_S = 60.0  # nvidia-smi's two calls are bounded at 20 s each (host/watch/gpu_procs.py)
MAX_BYTES = 1 << 20  # a few hundred processes at most; anything bigger was not written by the agent

Held = Mapping[int, Sequence[GpuProcess]]  # nvidia-smi's index -> the processes on that card


@dataclass(frozen=True)
class AtStart:
    """What each (card, pid) held at one start, with the process's name then (a reused pid is another
    process: nvidia-smi names it anew, and all of what it holds now came after that start)."""

    invocation: str
    held: Mapping[tuple[int, int], tuple[str, float]]  # (card index, pid) -> (name, MiB)

    def mib(self, card: int, pid: int, name: str) -> float:
        """What the process held then; 0 for one that was not there (it started after: all of it counts)."""
        then = self.held.get((card, pid))
        return then[1] if then is not None and then[0] == name else 0.0


def snapshot_doc(invocation: str, held: Held) -> dict[str, object]:
    """The record written for one start: its invocation and each card's processes (the service's own too:
    harmless, they are never subtracted)."""
    cards = {
        str(index): [{"pid": p["pid"], "name": p["name"], "used_mib": p["used_mib"]} for p in procs]
        for index, procs in sorted(held.items())
    }
    return {"format": FORMAT, "invocation": invocation, "cards": cards}


def parse_snapshot(doc: object, invocation: str) -> AtStart | None:
    """The record as AtStart when it is of `invocation` (the unit's current one); None for another
    invocation, no invocation, or anything the agent never writes."""
    if not invocation or not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    if doc.get("invocation") != invocation or not isinstance(doc.get("cards"), dict):
        return None
    held: dict[tuple[int, int], tuple[str, float]] = {}
    for index, procs in doc["cards"].items():
        if not (isinstance(index, str) and index.isdigit() and isinstance(procs, list)):
            return None
        for p in procs:
            pid, name, used = (
                (p.get(k) for k in ("pid", "name", "used_mib")) if isinstance(p, dict) else ("",) * 3
            )
            mib = _mib(used)
            if type(pid) is not int or not isinstance(name, str) or mib is None:
                return None
            held[(int(index), pid)] = (name, mib)
    return AtStart(invocation, held)


def _mib(value: object) -> float | None:
    """A figure the agent writes: a number of MiB, not negative, not NaN (a bool is not one); else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e9:
        return None
    return float(value)


def fill(cards: Sequence[GpuCard], at: AtStart | None) -> None:
    """Set each card's processes' at_start_mib from the start's record; with none, leave it absent (the
    plan then takes off all of what they hold and says it does not know what they held then)."""
    if at is None:
        return
    for card in cards:
        index = card.get("index")
        for proc in card.get("processes", []):
            if index is not None:
                proc["at_start_mib"] = at.mib(index, proc["pid"], proc["name"])


def record(folder: Path, invocation: str, held: Held | None) -> bool:
    """Write the start's record (atomically) into the unit's state folder; nothing without nvidia-smi's
    word or an invocation. Whether it was written; OSError for the caller to report, never to fail on."""
    if held is None or not invocation:
        return False
    write_json_atomic(folder / FILE_NAME, snapshot_doc(invocation, held))
    return True


def load(folder: Path, invocation: str) -> AtStart | None:
    """The unit's record, when it is of `invocation`; None when there is none or it cannot be read."""
    try:
        with open(folder / FILE_NAME, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        doc = json.loads(data) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return parse_snapshot(doc, invocation)


class Recorder:
    """Records a start's GPU processes beside its watch: `begin` (the watch's on_pool) runs nvidia-smi in a
    thread, so the gate's clock never waits on it (its calls may take 20 s each); `finish`, once the watch
    is over, waits for it (bounded) and reports a failure as a warning, never as a failed change."""

    def __init__(self, folder: Path, invocation: str, read: Callable[[], Held | None]) -> None:
        self.folder, self.invocation, self.read = folder, invocation, read
        self.failed: str | None = None
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        self._thread = threading.Thread(target=self._record, name="gpu-at-start", daemon=True)
        self._thread.start()

    def _record(self) -> None:
        try:
            record(self.folder, self.invocation, self.read())
        except Exception as exc:  # a full disk or a bug: only the next plan knows less, never a failed change
            self.failed = f"{type(exc).__name__}: {exc}"

    def finish(self, warn: Callable[[str], object], timeout_s: float = FINISH_S) -> None:
        if self._thread is None:
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.failed = f"nvidia-smi still had not answered after {timeout_s:.0f} s"
        if self.failed:
            warn(f"what the GPU processes held at this start was not recorded: {self.failed}")
