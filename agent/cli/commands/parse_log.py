"""`deployctl parse-log [FILE|-] [--json]`: what an SGLang start-up log says (pool, memory, failure)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from agent.errors import UsageError
from agent.output import Output

if TYPE_CHECKING:
    from agent.sglang.logs.summary import StartSummary


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", help="log file, or - for stdin (default)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.epilog = (
        "A file with no SGLang start in it is refused (exit 2).\n"
        "example: deployctl parse-log ct200-start.log --json\n"
        "example: deployctl parse-log -   (journalctl -u sglang.service -b | deployctl parse-log -)"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    """Summarise the log; exit 0 whatever the start did (the summary is the answer, not a verdict), but a
    file in which no SGLang start can be seen is refused rather than summarised as a row of `?`."""
    from agent.sglang.logs.summary import summarize  # the parser loads only for the commands that parse

    summary = summarize(_read(args.file).split("\n"))
    if not said_anything(summary):
        name = "stdin" if args.file == "-" else args.file
        raise UsageError(
            f"{name}: no SGLang start in it (no server_args, Load weight, KV Cache, ready or failure line)",
            hint="journalctl -u sglang.service -b | deployctl parse-log -",
        )
    if args.json:
        out.print(json.dumps(summary.to_dict(), sort_keys=True))
    else:
        for line in render(summary):
            out.print(line)
    return 0


def said_anything(s: StartSummary) -> bool:
    """Whether the log showed any part of a start: a figure, the ready line, a failure or a stop."""
    flags = ("ready", "failure", "stopped")
    figures = dataclasses.asdict(s)
    return (
        s.ready
        or s.stopped
        or s.failure is not None
        or any(v is not None for k, v in figures.items() if k not in flags)
    )


def _read(path: str) -> str:
    """Bytes decoded leniently: a log with broken UTF-8 (cut multibyte, binary junk) still parses."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


def render(s: StartSummary) -> list[str]:
    """A short report for a person: one fact per line, `?` where the log does not say."""
    return [
        f"pool:          {_tokens(s.kv_tokens)}"
        + ("" if s.kv_size_gb is None else f" ({s.kv_size_gb:.2f} GB)"),
        f"draft pool:    {_tokens(s.draft_kv_tokens) if s.draft_kv_tokens is not None else 'none'}",
        f"context:       {_tokens(s.context_len)}",
        f"free memory:   before weights {_gb(s.avail_mem_before_weights_gb)}, "
        f"after weights {_gb(s.avail_mem_after_weights_gb)}, before pool {_gb(s.avail_mem_before_pool_gb)}, "
        f"after start {_gb(s.available_gpu_mem_gb)}",
        f"mem fraction:  {s.mem_fraction_static if s.mem_fraction_static is not None else '?'}",
        f"ready:         {'yes' if s.ready else 'no'}",
        f"failure:       {'none' if s.failure is None else s.failure.failure_kind}",
        *([f"  {s.failure.line}"] if s.failure is not None else []),
        *(["stopped:       yes (SIGTERM)"] if s.stopped else []),
    ]


def _tokens(n: int | None) -> str:
    return "?" if n is None else f"{n:,} tokens"


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} GB"
