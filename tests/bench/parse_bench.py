"""Throughput of the SGLang log parser on a synthetic 8-rank journal; prints lines/s (median of 5 runs).

Run: .venv/bin/python tests/bench/parse_bench.py [--lines 500000]
"""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator

from agent.sglang.logs.summary import SummaryBuilder, parse_line, summarize

RANKS = [f"TP{i}" for i in range(8)]


def _prefix(second: int, rank: str | None) -> str:
    tags = f" {rank}" if rank else ""
    return f"[2026-10-30 12:{second // 60 % 60:02d}:{second % 60:02d}{tags}]"


def _startup() -> Iterator[str]:
    """One start: distributed init, weights with tqdm, pools, graphs, scheduler line, uvicorn, ready."""
    yield (
        "[2026-10-30 12:00:00] server_args=ServerArgs(model_path='/models/k2', tp_size=8, "
        "mem_fraction_static=0.86, context_length=200000, max_running_requests=64, chunked_prefill_size=8192)"
    )
    for r in RANKS:
        yield f"{_prefix(1, r)} Init torch distributed ends. elapsed=3.20 s, mem usage=2.01 GB"
        yield f"{_prefix(2, r)} Load weight begin. avail mem=93.47 GB"
    for shard in range(1, 65):
        pct = shard * 100 // 64
        yield f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {shard}/64 [00:{shard:02d}<00:10,  2.10it/s]"
    for i, r in enumerate(RANKS):
        yield (
            f"{_prefix(70, r)} Load weight end. elapsed=68.10 s, type=KimiK25ForConditionalGeneration, "
            f"quant=int4, avail mem={19.9 - i * 0.01:.2f} GB, mem usage=73.58 GB."
        )
        yield f"{_prefix(71, r)} KV Cache is allocated. #tokens: 210000, KV size: 13.75 GB"
        yield f"{_prefix(71, r)} Memory pool end. avail mem=5.10 GB"
        yield f"{_prefix(72, r)} Capture cuda graph begin. This can take up to several minutes. avail mem=5.05 GB"
        yield f"{_prefix(80, r)} Capture cuda graph end. Time elapsed: 8.00 s. mem usage=0.90 GB. avail mem=4.15 GB."
    yield (
        f"{_prefix(81, 'TP0')} max_total_num_tokens=210000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=64, context_len=200000, available_gpu_mem=4.12 GB"
    )
    yield "[2026-10-30 12:01:22] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)"
    yield "[2026-10-30 12:01:30] The server is fired up and ready to roll!"


def _serving(n: int) -> Iterator[str]:
    """Traffic after the start: access logs and batch statistics, the bulk of a long journal."""
    for i in range(n):
        second = 100 + i
        if i % 3 == 0:
            yield f'{_prefix(second, None)} INFO:     127.0.0.1:{40000 + i % 1000} - "GET /health HTTP/1.1" 200 OK'
        elif i % 3 == 1:
            yield (
                f"{_prefix(second, 'TP0')} Prefill batch. #new-seq: 1, #new-token: {i % 8192}, "
                "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0"
            )
        else:
            yield (
                f"{_prefix(second, 'TP0')} Decode batch. #running-req: 3, #token: {i % 200000}, "
                "token usage: 0.05, gen throughput (token/s): 112.40, #queue-req: 0"
            )


def journal(total: int) -> list[str]:
    """Starts repeated every 20,000 lines, filled with serving traffic, `total` lines in all."""
    lines: list[str] = []
    while len(lines) < total:
        lines.extend(_startup())
        lines.extend(_serving(20_000))
    return lines[:total]


def _run(lines: list[str], builder: bool) -> float:
    start = time.perf_counter()
    if builder:
        b = SummaryBuilder()
        for line in lines:
            b.feed(line)
        b.summary()
    else:
        for line in lines:
            parse_line(line)
    return len(lines) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    lines = journal(args.lines)
    s = summarize(_startup())  # the synthetic lines must be real formats, or the rate means nothing
    assert (s.kv_tokens, s.avail_mem_after_weights_gb, s.ready, s.failure) == (210000, 19.83, True, None), s
    startup = list(_startup()) * max(1, args.lines // 200)
    for name, data, builder in (
        ("parse_line, journal", lines, False),
        ("SummaryBuilder.feed, journal", lines, True),
        ("parse_line, start-up lines only", startup, False),
    ):
        rates = [_run(data, builder) for _ in range(args.runs)]
        print(f"{name}: {statistics.median(rates):,.0f} lines/s (median of {args.runs}, {len(data):,} lines)")


if __name__ == "__main__":
    main()
