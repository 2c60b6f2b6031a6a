"""Show a transaction's events as they come: a live line on a terminal, timestamped lines otherwise."""

from __future__ import annotations

import time

from agent.output import Output, Style, terminal_text
from agent.protocol.events import Event

PLAIN_PROGRESS_EVERY_S = 15.0  # under cron a line per phase change plus one every 15 s is plenty


class Progress:
    def __init__(self, out: Output, host: str) -> None:
        self.out = out
        self.host = host
        self.t0 = time.monotonic()
        self.phase = ""
        self.percent: float | None = None
        self._last_plain = 0.0
        self._live = False

    def show(self, event: Event) -> None:
        style = self.out.style
        if style is Style.JSON:
            self.out.print(event.to_json())
            return
        if event.kind == "progress":
            self.phase = str(event.data.get("phase", self.phase))
            pct = event.data.get("percent")
            self.percent = float(pct) if isinstance(pct, (int, float)) else self.percent
            # One line, whatever the host sent: a newline or \r in it would break the live status line.
            latest = terminal_text(str(event.data.get("line") or event.message), keep="")[:100]
            if style is Style.TTY:
                self._status(latest)
                return
            changed = event.message.startswith("phase:")
            if changed or time.monotonic() - self._last_plain >= PLAIN_PROGRESS_EVERY_S:
                self._last_plain = time.monotonic()
                pct = f" {self.percent:.0f}%" if self.percent is not None and not changed else ""
                elapsed = f"{time.monotonic() - self.t0:.0f} s"
                tail = "" if changed else f" | {latest}"
                self._line(event, f"sglang: {self.phase.replace('_', ' ')}{pct} ({elapsed}){tail}")
            return
        if event.kind == "log":
            return
        self._line(event, f"{event.stage}: {event.message}")

    def _status(self, latest: str) -> None:
        elapsed = time.monotonic() - self.t0
        pct = f" {self.percent:3.0f}%" if self.percent is not None and self.phase == "loading_weights" else ""
        text = terminal_text(f"[{elapsed:6.1f}s] {self.phase}{pct} | {latest}", keep="")
        width = 118
        self.out.stderr.write("\r\x1b[2K" + text[:width])
        self.out.stderr.flush()
        self._live = True

    def _line(self, event: Event, text: str) -> None:
        if self._live:
            self.out.stderr.write("\r\x1b[2K")
            self._live = False
        stamp = event.ts[11:23] if len(event.ts) >= 23 else event.ts
        prefix = "!! " if event.kind == "warning" else "-> "
        self.out.note(f"{stamp} {self.host} {prefix}{text}")

    def done(self) -> None:
        if self._live:
            self.out.stderr.write("\r\x1b[2K")
            self.out.stderr.flush()
            self._live = False
