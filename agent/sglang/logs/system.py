"""What systemd and the kernel say of SGLang's service ending: lines with no SGLang prefix, read as events.

A journal (`journalctl -b`, or `-u sglang.service`, which adds systemd's own lines about the unit) ends a
start that SGLang did not end itself with one of these, and nothing of SGLang's after it:

- the kernel's OOM killer (mm/oom_kill.c: "Out of memory: Killed process 1234 (python3) ...", "Memory cgroup
  out of memory: ..." under the unit's MemoryMax=; older kernels' "Kill process N (comm) score ..."), and
  systemd's word for it ("<unit>: A process of this unit has been killed by the OOM killer.", "<unit>: Failed
  with result 'oom-kill'."): the host's RAM ran out, not the GPU's (HOST_OOM_KILLED, a named cause);
- systemd's "<unit>: Main process exited, code=exited, status=1/FAILURE" (or code=killed/dumped): the
  process ended; its cause, when logged, is SGLang's own earlier line (PROCESS_EXITED, a generic kind). SGLang
  ends its own shutdown with SIGKILL on itself (srt/utils/common.py:2548-2552 kill_process_tree), so after a
  stop this line is the stop's consequence (summary.py _stop_consequence);
- systemd's "Stopping <unit>...": the end was asked for (KillSignal= SIGTERM by default), also where SGLang
  had not yet installed its own SIGTERM handler (managers/tokenizer_manager.py:2455) to say so.

Whose unit or process a line speaks of is the caller's to decide (agent/sglang/logs/starts.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.sglang.logs import events as ev
from agent.sglang.logs.failures import CAUSE, HEADER

_KERNEL_OOM = re.compile(r"(?:(?:Memory cgroup )?[Oo]ut of memory: )?Kill(?:ed)? process (\d+) \(([^)]*)\)")
_UNIT_LINE = re.compile(r"([\w@:.\\-]+\.service): (.*)")
_STOPPING = re.compile(r"Stopping ([\w@:.\\-]+\.service)\b")
_EXITED = re.compile(r"Main process exited, code=(exited|killed|dumped), status=(\d+)")
_UNIT_OOM = re.compile(
    r"Failed with result 'oom-kill'|A process of this unit has been killed by the OOM killer"
)


def unit_named(text: str) -> str | None:
    """The *.service a systemd line speaks of ("<unit>: ..." or "Stopping <unit>..."), None for others."""
    m = _UNIT_LINE.match(text) or _STOPPING.match(text)
    return m[1] if m else None


def killed_process(text: str) -> tuple[str, str] | None:
    """(PID, command name) of a kernel OOM-killer line, None for any other line."""
    m = _KERNEL_OOM.match(text)
    return (m[1], m[2]) if m else None


def unit_events(text: str, ours: Callable[[str], bool]) -> list[ev.LogEvent]:
    """Events of a systemd line about a unit `ours` says is SGLang's own service."""
    unit = unit_named(text)
    if unit is None or not ours(unit):
        return []
    if text.startswith("Stopping "):
        return [ev.Stopping(None, "SIGTERM")]
    said = text[len(unit) + 2 :]
    if _UNIT_OOM.match(said):
        return [ev.Failure(None, ev.HOST_OOM_KILLED, text, CAUSE)]
    m = _EXITED.match(said)
    if m is None or (m[1] == "exited" and m[2] == "0"):
        return []
    code = int(m[2]) if m[1] == "exited" else -int(m[2])  # a signal as Python's returncode says it
    return [ev.Failure(None, ev.PROCESS_EXITED, text, HEADER, exit_code=code)]


def kernel_events(text: str) -> list[ev.LogEvent]:
    """The kernel's OOM kill of a process (the caller has checked the process is SGLang's)."""
    return [ev.Failure(None, ev.HOST_OOM_KILLED, text, CAUSE)]
