"""Where a command writes: the report to stdout, progress and errors to stderr; style chosen once.

Everything printed through Output passes terminal_text: much of it comes from the host (SGLang's log
lines, failure reasons, event messages, backup names, status), and a control character in it must not
reach the terminal, where an escape sequence can retitle the window, clear the screen or rewrite lines.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import TextIO

from agent.protocol.common import UNPRINTABLE


def terminal_text(text: str, keep: str = "\n\t") -> str:
    """Text fit for a terminal: each control character but those in `keep` shown as its escape (\\x1b).

    JSON from json.dumps (ensure_ascii, the default) passes unchanged: it escapes them all itself.
    """
    return UNPRINTABLE.sub(lambda m: m.group() if m.group() in keep else ascii(m.group())[1:-1], text)


# What a stream that cannot encode them (PYTHONIOENCODING=ascii, latin-1, a C locale) gets instead: the
# chart's marks and the notes' signs in plain ASCII, as a pipe gets them.
_ASCII_FALLBACK = str.maketrans(
    {
        "÷": "/", "×": "x", "−": "-", "–": "-", "—": "-", "…": "...", "≈": "~", "≤": "<=", "≥": ">=",
        "→": "->", "←": "<-", "✓": "ok", "✗": "x", "•": "*", "─": "-", "═": "=", "┊": ":", "◆": "O",
        "○": "C", "│": "|", "└": "+", "‘": "'", "’": "'", "“": '"', "”": '"', "±": "+/-", "·": ".",
        "\u00a0": " ",
    }
)  # fmt: skip


def encodable(text: str, stream: TextIO) -> str:
    """`text` as `stream` can write it: unchanged where its encoding has every character, else the ASCII
    fallbacks above, and `?` for what has none."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str):
        return text
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.translate(_ASCII_FALLBACK)
        return text.encode(encoding, errors="replace").decode(encoding)
    except LookupError:
        return text
    return text


class Style(str, Enum):
    TTY = "tty"  # a person at a terminal: live status line, colour
    PLAIN = "plain"  # cron, pipes, CI: plain timestamped lines
    JSON = "json"  # machine output: JSON lines


@dataclass
class Output:
    """The streams and style of one CLI run; tests build one around io.StringIO."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    isatty: bool = False
    stdin_isatty: bool = False
    json: bool = False
    quiet: bool = False
    # Why stdout could not be written (a full disk, an I/O error), once it could not: the command goes on
    # and main() says so in one line and in its exit code.
    lost: str | None = None

    @classmethod
    def from_process(cls) -> Output:
        return cls(isatty=_isatty(sys.stdout), stdin_isatty=_isatty(sys.stdin))

    @property
    def style(self) -> Style:
        if self.json:
            return Style.JSON
        if self.isatty and "NO_COLOR" not in os.environ:
            return Style.TTY
        return Style.PLAIN

    def print(self, text: str = "") -> None:
        self.write(terminal_text(text) + "\n")

    def write(self, text: str) -> None:
        """Text to stdout as it is. A reader that went away (`| head -1`) is not an error: the rest of the
        text is dropped and the command goes on, so its exit code still says what happened. A stdout that
        cannot be written (`> /dev/full`) drops the rest too, and is remembered in `lost`."""
        if self.stdout is None:  # started with fd 1 closed (`>&-`): Python sets sys.stdout to None
            self.lost = self.lost or "stdout is closed"
            self.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as the process
        try:
            self.stdout.write(encodable(text, self.stdout))
            self.stdout.flush()
        except BrokenPipeError:
            self.stdout = closed_pipe(self.stdout)
        except OSError as exc:  # ENOSPC, EIO...: the rest is dropped as for a closed pipe, but not silently
            self.lost = self.lost or str(exc.strerror or exc)
            self.stdout = closed_pipe(self.stdout)

    def note(self, text: str) -> None:
        """Progress and remarks: stderr, so a piped or mailed report stays clean."""
        if not self.quiet:
            try:
                print(encodable(terminal_text(text), self.stderr), file=self.stderr, flush=True)
            except BrokenPipeError:
                self.stderr = closed_pipe(self.stderr)


def closed_pipe(stream: TextIO) -> TextIO:
    """A sink for a stream whose reader is gone. Its descriptor is pointed at /dev/null as well, so the
    interpreter's own flush at exit does not fail on what is still buffered."""
    sink = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    with contextlib.suppress(OSError, ValueError):  # no descriptor (a StringIO): nothing buffered outside
        os.dup2(sink.fileno(), stream.fileno())
    return sink


def _isatty(stream: TextIO | None) -> bool:
    """A closed stream (cron may start us with fd 0 closed: Python then sets it to None) is no terminal."""
    return stream is not None and stream.isatty()
