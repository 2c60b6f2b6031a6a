"""`deployctl parse-log [FILE|-] [--json]`: what an SGLang start-up log says (pool, memory, failure)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import UsageError
from agent.output import Output

if TYPE_CHECKING:
    from agent.sglang.logs.summary import StartSummary


# A start log is megabytes; a longer file (or /dev/zero) is not one: refused before it fills memory.
MAX_LOG_BYTES = 256 * 2**20

# A line only SGLang writes (docs of the formats: /work's FACTS.md 4; sglang/srt/model_executor/
# model_runner.py, managers/scheduler.py, entrypoints/http_server.py): any one makes the text an SGLang log,
# even an excerpt with no start in it (a CUDA-graph capture, a traceback through sglang/srt/).
SGLANG_LINE = re.compile(
    r"sglang/srt/|sglang\.srt\.|sglang\.launch_server|\bserver_args=|Load weight (?:begin|end)\b"
    r"|KV Cache is allocated|Memory pool end|Capture .*graph|Capturing batches|max_total_num_tokens="
    r"|The server is fired up|Scheduler hit an exception|Init (?:parallel|torch distributed)"
    r"|Received sigquit from a child|scheduler died during initialization|sglang serve: error"
    r"|Not enough memory\. Please try to increase --mem-fraction-static",
    re.IGNORECASE,
)


def is_sglang_log(lines: list[str]) -> bool:
    """Whether any line of the text is one SGLang writes."""
    return any(SGLANG_LINE.search(line) for line in lines)


def no_sglang(name: str) -> UsageError:
    """The one refusal of a text with no SGLang line in it: parse-log's and plan --from-log's."""
    return UsageError(
        f"{name}: no SGLang line in it (no server_args, Load weight, KV Cache, CUDA graph, ready, failure "
        "or sglang/srt/ traceback line): not an SGLang log",
        hint="journalctl -u sglang.service -b | deployctl parse-log -",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", help="log file, or - for stdin (default)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.epilog = (
        "A file with no SGLang line in it is refused (exit 2); so is one over 256 MiB.\n"
        "example: deployctl parse-log examples/ct200-start.log --json\n"
        "example: deployctl parse-log -   (journalctl -u sglang.service -b | deployctl parse-log -)"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    """Summarise the log; exit 0 whatever the start did (the summary is the answer, not a verdict), but a
    file in which no SGLang start can be seen is refused rather than summarised as a row of `?`."""
    from agent.sglang.logs.summary import summarize  # the parser loads only for the commands that parse

    name = "stdin" if args.file == "-" else args.file
    lines = read_log(args.file, name)
    summary = summarize(lines)
    if not said_anything(summary) and not is_sglang_log(lines):
        raise no_sglang(name)
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


_STDIN_HINT = "journalctl -u sglang.service -b | deployctl parse-log -"


def read_log(path: str | Path, name: str) -> list[str]:
    """The lines of a log ("-": stdin), bytes decoded leniently: a log with broken UTF-8 (cut multibyte,
    binary junk) still parses. At most MAX_LOG_BYTES are read; a longer file is refused. journald and tqdm
    both end lines with \\r at times: it ends a line too."""
    try:
        if str(path) == "-":
            if sys.stdin is None:  # started with fd 0 closed (`<&-`, some cron and CI runners)
                raise UsageError(
                    f"cannot read {name}: stdin is closed", hint=f"pipe the log in: {_STDIN_HINT}"
                )
            data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > MAX_LOG_BYTES:
        raise UsageError(
            f"{name}: more than {MAX_LOG_BYTES // 2**20} MiB: not a start-up log",
            hint=f"give the start's part: {_STDIN_HINT}",
        )
    return data.decode("utf-8", errors="replace").replace("\r", "\n").split("\n")


def render(s: StartSummary) -> list[str]:
    """A short report for a person: one fact per line, `?` where the log does not say. SGLang's "GB" are
    GiB (get_available_gpu_memory divides by 1 << 30): they are printed as GiB."""
    return [
        f"pool:          {_tokens(s.kv_tokens)}"
        + ("" if s.kv_size_gb is None else f" ({s.kv_size_gb:.2f} GiB)"),
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
    return "?" if value is None else f"{value:.2f} GiB"
