"""Pure: does the running server run the unit that was rendered? Its own `/server_info` says.

SGLang 0.5.23's `/server_info` (srt/entrypoints/http_server.py server_info, srt/utils/common.py
build_server_info) is `ServerArgs.resolved_dict()` -- every server argument under its field name, as the
server resolved it -- plus the scheduler's `max_total_num_tokens` and `max_req_input_len`. A wrapper
script, a `--config` file whose values lose to the command line, or a second copy of the unit can leave the
server running something other than what deployctl wrote; the gate then compares the values it rendered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from agent.sglang.flags import FlagValue

# flag in the unit -> field of /server_info (server_args.py: the flag's name with '_' for '-')
CHECKED = ("context-length", "mem-fraction-static", "max-running-requests")
_SUFFIX = {
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_HUMAN = re.compile(r"(\d+)(k|M|G|T|Ki|Mi|Gi|Ti)?")


@dataclass(frozen=True)
class Mismatch:
    flag: str
    rendered: str
    running: object  # what /server_info says; None when the field is missing

    def describe(self) -> str:
        field = self.flag.replace("-", "_")
        seen = "missing" if self.running is None else repr(self.running)
        return f"--{self.flag} {self.rendered} in the unit, /server_info {field}={seen}"


def _number(value: object) -> float | None:
    """A flag's text or a JSON value as a number; SGLang takes 200k for --context-length (>= 0.5.10)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    text = str(value).strip()
    m = _HUMAN.fullmatch(text)
    if m:
        return float(int(m[1]) * _SUFFIX.get(m[2] or "", 1))
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def mismatches(flags: Mapping[str, FlagValue], info: Mapping[str, object]) -> list[Mismatch]:
    """The checked flags the unit sets whose value the running server does not report."""
    found = []
    for flag in CHECKED:
        if flag not in flags or isinstance(flags[flag], (bool, tuple)):
            continue
        rendered = str(flags[flag])
        want, running = _number(rendered), info.get(flag.replace("-", "_"))
        have = _number(running)
        if want is None or have is None or not math.isclose(want, have, rel_tol=1e-9, abs_tol=1e-9):
            found.append(Mismatch(flag, rendered, running))
    return found


def verdict(flags: Mapping[str, FlagValue], info: Mapping[str, object]) -> str | None:
    """None when the server runs what was rendered, else the gate's reason with both values."""
    found = mismatches(flags, info)
    if not found:
        return None
    return "the server does not run the rendered unit: " + "; ".join(m.describe() for m in found)
