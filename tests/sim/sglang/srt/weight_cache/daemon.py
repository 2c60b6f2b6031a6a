"""`python -m sglang.srt.weight_cache.daemon` on the simulated host: load the weights once (really reading
the weight files, LOAD_SECONDS in all), publish the fingerprint and the ready files, hold them until
SIGTERM (srt/weight_cache/daemon.py: one daemon per local GPU of its TP group)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from ... import weightcache as wc
from ...startup import read_files, weight_files


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="sglang.srt.weight_cache.daemon")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--quantization")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--timeout", type=int, default=1800)
    args, _ = p.parse_known_args(argv)
    env = dict(os.environ)
    refused = wc.quant_refusal(args.quantization or "")
    if refused:
        print(refused, file=sys.stderr, flush=True)
        raise SystemExit(1)
    print(
        f"[WeightCacheDaemon] loading {args.model_path} for {args.tp_size} GPU(s)",
        file=sys.stderr,
        flush=True,
    )
    start = time.monotonic()
    read_files(weight_files(args.model_path))
    time.sleep(max(0.0, float(env.get("SGLANG_SIM_LOAD_SECONDS", "2.0")) - (time.monotonic() - start)))
    written = wc.publish(args, args.tp_size, env)
    print(
        f"[WeightCacheDaemon] weights resident, serving {len(written) // 2} GPU(s)",
        file=sys.stderr,
        flush=True,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        for f in written:
            Path(f).unlink(missing_ok=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1:])
