"""Secret values out of text that leaves the host or reaches a terminal: unit files, diffs, flags, logs.

Stdlib only: the host agent redacts what it sends (facts, inspect), the laptop what it prints. One rule for
secret-looking names: SECRET_ENV for environment variables, SECRET_FLAG for SGLang flags.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

from agent.sglang.flags import FlagChange, FlagValue

# TOKENIZERS_PARALLELISM (the tokenizers package's switch, set by every SGLang unit on CPU) is not a token.
SECRET_ENV = re.compile(r"TOKEN(?!IZER)|KEY|SECRET|PASSWORD|PASS", re.IGNORECASE)
SECRET_FLAG = re.compile(r"(^|-)(key|api-key|token|secret|password|passwd)$")
REDACTED = "***"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- redaction -------------------------------------------------------------------------------------------
#
# systemd reads a unit in logical lines: a line ending in an odd number of backslashes goes on with the
# next one (the backslash read as a space), comment lines between are skipped, and `Key = value` may have
# blanks around the `=`. Redaction finds secrets in those logical lines, then blanks them out in the
# physical lines they came from: the printed text keeps its layout (a diff stays a diff, line for line),
# and a secret cut by a continuation loses each of its pieces. In a unified diff, the old and the new side
# of each hunk are read separately, as systemd would read either file.

# A word as systemd splits Environment= and ExecStart=: quoted parts and escapes are part of it; an
# unterminated quote runs to the end (systemd refuses that line, which is no reason to print it).
_WORD = r"""(?:"(?:\\.|[^"\\])*"?|'(?:\\.|[^'\\])*'?|\\.?|[^\s"'\\])+"""
_ENV_WORD = re.compile(_WORD)
# A --flag and its value, after "=" or blanks (or both, as a continuation right after "=" leaves them).
# The value is looked at, not consumed: `--trust-remote-code --api-key K` must still see --api-key.
_FLAG_VALUE = re.compile(rf"--(?P<name>[A-Za-z0-9][A-Za-z0-9_-]*)(?=(?:=|=?[ \t]+(?!--))(?P<value>{_WORD}))")
# A directive's name as systemd spells them (ExecStart, LimitNOFILE); API_TOKEN or HFTOKEN is none.
_DIRECTIVE = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")
_CREDENTIALS = ("SetCredential", "SetCredentialEncrypted")  # ID:DATA, the data given inline
_HUNK = re.compile(r"@@ -\d+(?:,(?P<old>\d+))? \+\d+(?:,(?P<new>\d+))? @@")
_TRAILING_BACKSLASHES = re.compile(r"\\+$")
# What a line that begins a directive, a section or a comment looks like (or an empty one).
_CLEAN_START = re.compile(r"[A-Za-z][A-Za-z0-9-]*[ \t]*=|\[|[ \t]*[#;]|[ \t]*$")

_Piece = tuple[int, int, str]  # a physical line's index, the column its text starts at, the text
_Span = tuple[int, int]


def is_secret_env(name: str, secret_names: Sequence[str] = ()) -> bool:
    """An environment variable whose value must not be printed."""
    return name in secret_names or bool(SECRET_ENV.search(name))


def redact(text: str, secret_names: Sequence[str] = ()) -> str:
    """Unit text or a unified diff of units, with secret values replaced by ***.

    Secret: the value of an Environment= assignment whose name is secret (TOKEN, KEY... or one of
    secret_names), the value of a secret --flag (api-key, token...), SetCredential= data.
    """
    lines = text.split("\n")
    spans: dict[int, list[_Span]] = {}
    for stream, hunk in _streams(lines):
        for first, pieces in _logical_lines(lines, stream):
            joined = " ".join(p[2] for p in pieces)  # systemd reads the backslash as a space
            found = list(_secret_spans(joined, secret_names, first))
            if hunk and first and not _CLEAN_START.match(joined):
                found += _tail_spans(joined, secret_names)
            for start, end in found:
                _map_back(pieces, start, end, spans)
    for index, found in spans.items():
        lines[index] = _blank_out(lines[index], found)
    return "\n".join(lines)


def _streams(lines: Sequence[str]) -> Iterator[tuple[list[tuple[int, int]], bool]]:
    """The runs of physical lines that systemd would read in a row, as (index, prefix length) each,
    and whether the run is a diff hunk's side (which may begin inside a directive).

    Plain text is one run. A unified diff gives each hunk's old side and new side (context lines in
    both), and each line outside the hunks on its own.
    """
    if not (len(lines) > 1 and lines[0].startswith("--- ") and lines[1].startswith("+++ ")):
        yield ([(i, 0) for i in range(len(lines))], False)
        return
    old_left = new_left = 0
    old: list[tuple[int, int]] = []
    new: list[tuple[int, int]] = []
    for i, line in enumerate(lines):
        mark = line[:1]
        if (old_left or new_left) and mark in (" ", "-", "+", ""):
            if mark != "+":
                old.append((i, len(mark)))
                old_left = max(0, old_left - 1)
            if mark != "-":
                new.append((i, len(mark)))
                new_left = max(0, new_left - 1)
            continue
        yield from ((s, True) for s in (old, new) if s)
        old, new = [], []
        hunk = _HUNK.match(line)
        if hunk:
            old_left = int(hunk["old"] or 1)
            new_left = int(hunk["new"] or 1)
        else:  # a file header, "\ No newline at end of file": read alone
            yield ([(i, 0)], False)
    yield from ((s, True) for s in (old, new) if s)


def _logical_lines(
    lines: Sequence[str], stream: Sequence[tuple[int, int]]
) -> Iterator[tuple[bool, list[_Piece]]]:
    """The logical lines of a run: (whether it is the run's first, its pieces without the backslashes).

    The first may be the tail of a directive that began before the run (a diff hunk cut into it).
    Comment lines are logical lines of their own, also inside a continuation, which goes on after them.
    """
    pending: list[_Piece] = []
    first = True
    for index, col in stream:
        text = lines[index][col:]
        if text.lstrip(" \t")[:1] in ("#", ";"):
            yield (True, [(index, col, text)])  # read with the most care; the next line may still be a tail
            continue
        backslashes = _TRAILING_BACKSLASHES.search(text)
        if backslashes and len(backslashes.group()) % 2:
            pending.append((index, col, text[:-1]))
            continue
        yield (first, [*pending, (index, col, text)])
        pending, first = [], False
    if pending:
        yield (first, pending)


def _secret_spans(line: str, secret_names: Sequence[str], first: bool) -> Iterator[_Span]:
    """Where the secret values are in one logical line."""
    key, eq, value = line.partition("=")
    key = key.strip().lstrip("+-")  # "+Environment=": a diff line given alone
    if eq and key == "Environment":
        yield from _env_spans(value, len(line) - len(value), secret_names, dashed_names=True)
    elif eq and key in _CREDENTIALS:
        data = value.partition(":")[2] or value
        yield (len(line) - len(data), len(line))
    elif first or not (eq and _DIRECTIVE.fullmatch(key)):
        # Maybe the tail of an Environment= (or no unit text at all): NAME=VALUE words count, but not
        # --flag=value ones, left to the flag rule so --max-total-tokens=8 stays readable.
        yield from _env_spans(line, 0, secret_names, dashed_names=False)
    for m in _FLAG_VALUE.finditer(line):
        if SECRET_FLAG.search(m["name"].lower().replace("_", "-")):
            yield m.span("value")


def _tail_spans(line: str, secret_names: Sequence[str]) -> Iterator[_Span]:
    """A hunk's first line may end a directive begun above the hunk, whose name is not in sight.

    It may end a quoted value (up to its closing quote) or be a secret flag's value (its first word):
    both are taken for secrets, unless that word is a NAME=VALUE assignment with a name not secret.
    """
    for quote in "\"'":
        end = _closing_quote(line, quote)
        if end is not None:
            yield (0, end)
            yield from _env_spans(line[end + 1 :], end + 1, secret_names, dashed_names=False)
    word = _ENV_WORD.search(line)
    if word and not word.group().startswith("-"):
        name, eq, _ = word.group().partition("=")
        if not (eq and ENV_NAME.fullmatch(name.strip("\"'"))):
            yield word.span()


def _closing_quote(line: str, quote: str) -> int | None:
    """Where the first unescaped `quote` is, or None."""
    i = 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
        elif line[i] == quote:
            return i
        else:
            i += 1
    return None


def _env_spans(text: str, offset: int, secret_names: Sequence[str], *, dashed_names: bool) -> Iterator[_Span]:
    """The values of secret NAME=VALUE words; a bare word right after `SECRET=` too (its author's value)."""
    after_empty_secret = False
    for m in _ENV_WORD.finditer(text):
        word = m.group()
        raw_name, eq, raw_value = word.partition("=")
        if not eq:
            if after_empty_secret:
                yield (offset + m.start(), offset + m.end())
            after_empty_secret = False
            continue
        name = raw_name.replace('"', "").replace("'", "").replace("\\", "")
        after_empty_secret = False
        if not is_secret_env(name, secret_names) or (not dashed_names and name.startswith("-")):
            continue
        closing = 1 if word[0] in "\"'" and len(raw_value) and word[-1] == word[0] else 0
        start, end = offset + m.start() + len(raw_name) + 1, offset + m.end() - closing
        if start < end:
            yield (start, end)
        else:
            after_empty_secret = True


def _map_back(pieces: Sequence[_Piece], start: int, end: int, spans: dict[int, list[_Span]]) -> None:
    """A span of a logical line -> the columns it covers on each physical line."""
    at = 0
    for index, col, text in pieces:
        lo, hi = max(start, at), min(end, at + len(text))
        if lo < hi:
            spans.setdefault(index, []).append((col + lo - at, col + hi - at))
        at += len(text) + 1  # the space that stands for the backslash


def _blank_out(line: str, spans: list[_Span]) -> str:
    """Each span's text -> ***, the blanks around it kept; spans that touch or overlap count as one."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in reversed(merged):
        piece = line[start:end]
        core = piece.strip()
        if core:
            lead = len(piece) - len(piece.lstrip())
            line = line[:start] + piece[:lead] + REDACTED + piece[lead + len(core) :] + line[end:]
    return line


def redact_flags(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """Flags fit to print: the values of secret flags (api-key, token...) replaced with ***."""
    return {k: REDACTED if SECRET_FLAG.search(k) and v is not True else v for k, v in flags.items()}


def redact_changes(changes: Sequence[FlagChange]) -> list[FlagChange]:
    """Flag changes fit to print: values of secret flags (api-key, token...) replaced with ***."""
    return [
        FlagChange(
            c.name,
            REDACTED if SECRET_FLAG.search(c.name) and c.before is not None else c.before,
            REDACTED if SECRET_FLAG.search(c.name) and c.after is not None else c.after,
        )
        for c in changes
    ]


# SGLang logs its resolved arguments once per start, secrets included (srt/entrypoints/engine.py:
# `logger.info(f"server_args={_server_args_for_logging(server_args)}")`, which hides only the watermark
# keys): a dataclass repr `api_key='k'` up to 0.5.16, a dict `'api_key': 'k'` from 0.5.20 (FACTS.md 4.2).
_ARG_NAME = re.compile(
    r"(?:(?<=[(,{\s])|^)"  # a field begins a line, or follows `(`, `{`, `,` or a blank
    r"(?:'(?P<quoted>[A-Za-z_][A-Za-z0-9_]*)'[ \t]*:[ \t]*|(?P<bare>[A-Za-z_][A-Za-z0-9_]*)=)"
)
_PY_VALUE = re.compile(r"""'(?:\\.|[^'\\])*'?|"(?:\\.|[^"\\])*"?|[^,)}\]]*""")


def redact_log_line(line: str) -> str:
    """A log line fit to leave the host: the values of secret fields (api_key, admin_api_key,
    ssl_keyfile_password...: the flag rule) in a server_args= line, and of secret --flags, replaced by ***.
    A None stays: it says that no key is set."""
    spans = [m.span("value") for m in _FLAG_VALUE.finditer(line) if _secret_flag_name(m["name"])]
    for m in _ARG_NAME.finditer(line):
        if _secret_flag_name(m["quoted"] or m["bare"]):
            value = _PY_VALUE.match(line, m.end())
            if value is not None and value.group().strip() not in ("", "None"):
                spans.append(value.span())
    return _blank_out(line, spans) if spans else line


def _secret_flag_name(name: str) -> bool:
    """A flag or ServerArgs field name (api_key, --api-key) that SECRET_FLAG calls secret."""
    return bool(SECRET_FLAG.search(name.lower().replace("_", "-")))
