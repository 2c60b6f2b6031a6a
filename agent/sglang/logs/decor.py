"""What a terminal, journald or a container runtime adds around SGLang's own line, taken off before parsing.

- ANSI colour codes and erase-in-line (what a terminal, `docker compose logs`, `script` or a pager leave);
- journalctl's short formats: `-o short` / `short-precise` ("Nov 04 05:27:13[.123456] host ident[pid]: "),
  `short-iso` / `short-iso-precise` ("2026-11-04T05:27:13[.123456]+00:00 host ident[pid]: "), `short-full`
  and `with-unit` ("Wed 2026-11-04 05:27:13 UTC host ident[pid]: "), `short-monotonic` / `short-delta`
  ("[  123.456789] host ident[pid]: ") and `short-unix` ("1730698033.123456 host ident[pid]: ");
- `docker logs -t` / `kubectl logs --timestamps` ("2026-11-04T05:27:13.123456789Z "), after the
  "service-1  | " that `docker compose logs` puts first or the "[pod/name/container] " of `kubectl logs
  --prefix`.

CR ends a line (journald and tqdm both end lines with it at times), so CRLF leaves no stray character.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# What terminals, pagers, `docker compose logs` and progress bars add: colours (SGR) and erase-in-line. Any
# other escape is the text's own, kept (and shown escaped: agent/output.py).
_ANSI = re.compile(r"\x1b\[[0-9;:]*[mK]")
_STAMP = (
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"  # short, short-precise
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?[+-]\d\d:?\d\d"  # short-iso(-precise): always an offset
    # short-full, with-unit: the zone is strftime's %Z, numeric ("+04") where tzdata has no letters for it
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (?:[A-Z][\w/+-]*|[+-]\d\d(?::?\d\d)?)"
    r"|\[ *\d+\.\d+(?: < *\d+\.\d+>)?\]"  # short-monotonic, short-delta
    r"|\d{9,}\.\d+)"  # short-unix
)
# The host name (letters, digits, dots, dashes: never a colon), then the syslog identifier and its PID.
_JOURNAL = re.compile(_STAMP + r" [\w.-]+ ([^\s\[:]+)(?:\[(\d+)\])?: ")
# `docker compose logs`' "service-1  | ", `kubectl logs --prefix`'s "[pod/name/container] "
_COMPOSE = re.compile(r"[\w.-]+ +\| |\[pod/[^\]\s]+\] ")
# docker and kubectl print UTC, RFC 3339 with nanoseconds: a "Z", never an offset (journald's ISO forms are
# the other way round), so a message after it is never read as a journal's host and identifier. The CRI log
# file (/var/log/pods/.../0.log) adds the stream and the partial/full tag: "stdout F ".
_DOCKER = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z (?:std(?:out|err) [PF] )?")


class Line(NamedTuple):
    """One line as SGLang (or systemd) wrote it, and who wrote it where the journal said (its syslog
    identifier: "systemd" for the unit's own start and stop lines)."""

    text: str
    ident: str | None = None
    # the process that wrote it where the prefix says (journald's PID, compose's service, kubectl's pod):
    # two servers in one log are told apart by it
    source: str | None = None


def undecorated(raw: str) -> Line:
    """The line without colour codes and the prefix journalctl or docker put before it."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw
    if text[-1:] in ("\r", "\n"):
        text = text.rstrip("\r\n")
    head = text[:1]  # each prefix starts with a letter or digit, or "[" and a number not SGLang's date
    if not head.isalnum() and (head != "[" or text[5:6] == "-"):
        return Line(text)  # most lines: SGLang's own, a traceback's
    source = None
    m = _COMPOSE.match(text)
    if m:
        text, source = text[m.end() :], m[0].strip(" |")
    m = _DOCKER.match(text)
    if m:
        return Line(text[m.end() :], None, source)
    m = _JOURNAL.match(text)
    if m is None:
        return Line(text, None, source)
    return Line(text[m.end() :], m[1], source or (f"{m[1]}[{m[2]}]" if m[2] and m[1] != "systemd" else None))


def clean(raw: str) -> str:
    """undecorated's text alone (the parser's fast path: a plain SGLang line comes back as it is)."""
    head = raw[:1]
    if "\x1b" not in raw and not head.isalnum() and (head != "[" or raw[5:6] == "-"):
        return raw
    return undecorated(raw).text


def split_lines(text: str) -> list[str]:
    """A pasted or piped log's lines: CR, LF and CRLF each end a line."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
