"""`deployctl parse-log [FILE|-] [--start N] [--json]`: what an SGLang start-up log says (pool, memory,
failure).

The log is split into its starts first (agent/sglang/logs/starts.py): the report is one start's, the last
complete one or the one `--start N` names, and lists the others.
"""

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
    from agent.sglang.logs.starts import LoggedStart
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
    add_start_arg(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.epilog = (
        "A log holding several starts (a journal with a failed try and a restart) is split into them: the\n"
        "report is the last complete start's (ready or failed), or the one --start N names; the others are\n"
        "listed. Colour codes, CRLF and journalctl's or docker's timestamps are taken off first.\n"
        "A file with no SGLang line in it is refused (exit 2); so is one over 256 MiB.\n"
        "example: deployctl parse-log examples/ct200-start.log --json\n"
        "example: deployctl parse-log -   (journalctl -u sglang.service -b | deployctl parse-log -)"
    )


def add_start_arg(parser: argparse.ArgumentParser) -> None:
    """--start N: parse-log's and plan --from-log's choice of a start (1 = the log's first)."""
    parser.add_argument(
        "--start",
        type=_start_number,
        metavar="N",
        help="read start N of the log (1 = the first; parse-log lists them), not the last complete one",
    )


def _start_number(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a start number (1 = the log's first start)")
    return number


def run(args: argparse.Namespace, out: Output) -> int:
    """Summarise the log's evidence start; exit 0 whatever the start did (the summary is the answer, not a
    verdict), but a file in which no SGLang start can be seen is refused rather than summarised as a row
    of `?`."""
    from agent.sglang.logs.starts import split  # the parser loads only for the commands that parse

    name = "stdin" if args.file == "-" else args.file
    lines = read_log(args.file, name)
    starts = split(lines)
    if not any(said_anything(s.summary) for s in starts) and not is_sglang_log(lines):
        raise no_sglang(name)
    start = pick(starts, getattr(args, "start", None), name)
    if args.json:
        out.print(json.dumps(as_json(starts, start), sort_keys=True))
    else:
        for line in render_starts(starts, start, named=getattr(args, "start", None) is not None):
            out.print(line)
    return 0


def pick(starts: list[LoggedStart], number: int | None, name: str) -> LoggedStart | None:
    """The evidence start, or the one --start names; a number the log does not hold is refused."""
    from agent.sglang.logs.starts import NoSuchStart, chosen

    try:
        return chosen(starts, number)
    except NoSuchStart as exc:
        raise UsageError(
            f"{name}: --start {number}: {exc}", hint="deployctl parse-log FILE lists them"
        ) from None


def as_json(starts: list[LoggedStart], start: LoggedStart | None) -> dict[str, object]:
    """The evidence start's figures (StartSummary.to_dict's keys), which start it is, and every start."""
    from agent.sglang.logs.summary import SummaryBuilder

    summary = start.summary if start is not None else SummaryBuilder().summary()
    return {
        **summary.to_dict(),
        "fix": _fix(summary),
        "start": None if start is None or not said_anything(start.summary) else start.number,
        "starts": [
            {
                "number": s.number,
                "first_line": s.first_line,
                "outcome": s.outcome,
                "ready": s.summary.ready,
                "mem_fraction_static": s.summary.mem_fraction_static,
                "kv_tokens": s.summary.kv_tokens,
                "failure": None if s.summary.failure is None else s.summary.failure.failure_kind,
            }
            for s in starts
        ],
    }


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
    from agent.sglang.logs.decor import split_lines

    return split_lines(data.decode("utf-8", errors="replace"))


NO_START = (
    "no usable start in this log: it holds SGLang lines, but none of a start's figures (no server_args, "
    "weights, KV pool, ready or failure line)"
)


def render_starts(starts: list[LoggedStart], start: LoggedStart | None, *, named: bool = False) -> list[str]:
    """Which start the report is (named by --start, or the evidence), the others in one line each, then
    the report."""
    from agent.sglang.logs.starts import evidence_said
    from agent.sglang.logs.summary import SummaryBuilder

    if start is None or not said_anything(start.summary):
        return [NO_START, *render(start.summary if start else SummaryBuilder().summary())]
    if named:
        why = ", named by --start"
    elif len(starts) == 1:
        why = ""
    else:
        why = f", {evidence_said(starts, start)}"
    head = [f"start:         {start.number} of {len(starts)} ({_outcome(start)}{why})"]
    if len(starts) > 1:
        head += [f"  {'*' if s is start else ' '} start {s.number}: {_one_line(s)}" for s in starts]
    return head + render(start.summary)


def _outcome(s: LoggedStart) -> str:
    failure = s.summary.failure
    if failure is None:
        return s.outcome
    return f"{'ready, then ' if s.summary.ready else ''}failed: {failure.failure_kind}"


def _one_line(s: LoggedStart) -> str:
    fraction = s.summary.mem_fraction_static
    return (
        f"line {s.first_line}, {_outcome(s)}, mem fraction {fraction if fraction is not None else '?'}, "
        f"pool {_tokens(s.summary.kv_tokens)}"
    )


def render(s: StartSummary) -> list[str]:
    """A short report for a person: one fact per line, `?` where the log does not say. SGLang's "GB" are
    GiB (get_available_gpu_memory divides by 1 << 30): they are printed as GiB."""
    return [
        f"pool:          {_tokens(s.kv_tokens)}"
        + ("" if s.kv_size_gb is None else f" ({s.kv_size_gb:.2f} GiB)"),
        f"draft pool:    {_tokens(s.draft_kv_tokens) if s.draft_kv_tokens is not None else 'none'}",
        *_host_pool(s),
        f"context:       {_tokens(s.context_len)}",
        f"free memory:   before weights {_gb(s.avail_mem_before_weights_gb)}, "
        f"after weights {_gb(s.avail_mem_after_weights_gb)}, before pool {_gb(s.avail_mem_before_pool_gb)}, "
        f"after start {_gb(s.available_gpu_mem_gb)}",
        f"mem fraction:  {s.mem_fraction_static if s.mem_fraction_static is not None else '?'}",
        f"ready:         {'yes' if s.ready else 'no'}",
        f"failure:       {'none' if s.failure is None else s.failure.failure_kind}",
        *([f"  {s.failure.line}"] if s.failure is not None else []),
        *([f"what to do:    {fixed}"] if (fixed := _fix(s)) else []),
        *(["stopped:       yes (SIGTERM)"] if s.stopped else []),
    ]


def _host_pool(s: StartSummary) -> list[str]:
    """HiCache's host pool the start pinned (its smallest rank's `Allocating ... host pool` line) and the
    auto size's ratio; nothing where the log has neither (HiCache off)."""
    if s.host_pool is None and s.host_pool_auto is None:
        return []
    pool = "?" if s.host_pool is None else f"{s.host_pool.tokens:,} tokens per rank ({s.host_pool.gb:.2f} GB)"
    auto = s.host_pool_auto
    ratio = "" if auto is None else f", auto-sized: ratio {auto.requested_ratio:.3f} -> {auto.ratio:.3f}"
    return [f"host pool:     {pool}{ratio}"]


def _fix(s: StartSummary) -> str | None:
    from agent.sglang.logs.fixes import fix_for

    return (
        None
        if s.failure is None
        else fix_for(s.failure.failure_kind, s.failure.line, s.host_ranks, s.hicache_size)
    )


def _tokens(n: int | None) -> str:
    return "?" if n is None else f"{n:,} tokens"


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} GiB"
