"""`python -m sglang.launch_server`: the simulated start-up, failures and serving loop."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import sys

from . import sizing as sz
from .disagg import add_flags as add_disagg
from .hicache import add_flags as add_hicache
from .startup import Launch
from .weightcache import SPECULATIVE_REFUSAL

V = tuple[int, int, int]


def human_readable_int(text: str) -> int:
    """200k -> 200000, 256Ki -> 262144 (case-sensitive SI and IEC suffixes)."""
    m = re.fullmatch(r"(\d+)(k|M|G|T|Ki|Mi|Gi|Ti)?", text.strip())
    if not m:
        raise ValueError(text)
    scale = {
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }
    return int(m.group(1)) * scale.get(m.group(2) or "", 1)


def build_parser(v: V) -> argparse.ArgumentParser:
    """SGLang's flags that matter here, as the chosen version spells them."""
    p = argparse.ArgumentParser(prog="sglang serve" if v >= (0, 5, 20) else "launch_server.py")
    add = p.add_argument
    add("--model-path", required=True)
    add("--tokenizer-path")
    add("--served-model-name")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    add_nodes(p)
    add_disagg(p)
    add_hicache(p)
    add("--context-length", type=human_readable_int if v >= (0, 5, 10) else int)
    add("--mem-fraction-static", type=float)
    add("--max-running-requests", type=int)
    add("--max-total-tokens", type=int)
    add("--chunked-prefill-size", type=int)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"])
    add("--page-size", type=int)
    add("--attention-backend")
    add("--trust-remote-code", action="store_true")
    algos = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] + (["DFLASH"] if v >= (0, 5, 11) else [])
    add("--speculative-algorithm", choices=algos)
    add("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    add("--speculative-num-steps", type=int)
    add("--speculative-eagle-topk", type=int)
    add("--speculative-num-draft-tokens", type=int)
    if v >= (0, 5, 14):
        add("--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs", type=int)
        add("--cuda-graph-max-bs-prefill", type=int)
        if v < (0, 5, 20):  # the deprecated alias; from 0.5.20 it is an ambiguous prefix
            add("--cuda-graph-max-bs", dest="cuda_graph_max_bs", type=int)
    else:
        add("--cuda-graph-max-bs", type=int)
    add("--disable-cuda-graph", action="store_true")
    add("--enable-metrics", action="store_true")
    add("--tool-call-parser")
    add("--reasoning-parser")
    add("--allow-auto-truncate", action="store_true")
    add("--log-level", default="info")
    add("--api-key")
    add("--admin-api-key")
    add("--quantization")
    add("--dtype", default="auto")
    if v >= (0, 5, 23):  # srt/arg_groups/fields/model.py
        add("--weight-cache-mode", default="off", choices=["off", "daemon", "client"])
        add("--weight-cache-socket")
        add("--weight-cache-timeout", type=int, default=1800)
    return p


def add_nodes(p: argparse.ArgumentParser) -> None:
    """Multi-node flags (arg_groups/fields/parallel.py); absent, they stay out of server_args as the sim has
    always printed it."""
    p.add_argument("--nnodes", type=int, default=argparse.SUPPRESS)
    p.add_argument("--node-rank", type=int, default=argparse.SUPPRESS)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=argparse.SUPPRESS)


def with_config(argv: list[str]) -> list[str]:
    """SGLang's --config FILE.yaml: its `key: value` lines become flags placed before the command line's
    (so the command line wins). The simulator reads the subset deployctl writes: a JSON scalar per key."""
    if "--config" not in argv:
        return argv
    i = argv.index("--config")
    path, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
    extra: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.partition(":")
            if sep and not key.startswith("#"):
                extra += [f"--{key.strip()}", str(json.loads(value.strip()))]
    return extra + rest


def fault_applies(args: argparse.Namespace, env: dict[str, str]) -> bool:
    """FAULT_WHEN_CONTEXT / FAULT_WHEN_FRACTION limit the fault to starts with exactly these flags."""
    context = env.get("SGLANG_SIM_FAULT_WHEN_CONTEXT")
    fraction = env.get("SGLANG_SIM_FAULT_WHEN_FRACTION")
    if context is not None and args.context_length != human_readable_int(context):
        return False
    return fraction is None or args.mem_fraction_static == float(fraction)


def check_nodes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """SGLang's multi-node checks (arg_groups/validation_hook.py); it fails an assert with exit 1."""
    nnodes, rank = getattr(args, "nnodes", 1), getattr(args, "node_rank", 0)
    if nnodes < 1 or not 0 <= rank < nnodes:
        parser.error(f"argument --node-rank: {rank} is not below --nnodes {nnodes}")
    if args.tp_size % nnodes:
        print("AssertionError: tp_size must be divisible by number of nodes", file=sys.stderr)
        raise SystemExit(1)
    if nnodes > 1 and args.dp_size > 1:
        print("AssertionError: multi-node data-parallel replicas are not supported; use attention DP "
              "(--attn-dp-size) across nodes", file=sys.stderr)  # fmt: skip
        raise SystemExit(1)
    if nnodes > 1 and not getattr(args, "dist_init_addr", None):
        parser.error("--nnodes > 1 requires --dist-init-addr HOST:PORT")


def main(argv: list[str] | None = None) -> None:
    env = dict(os.environ)
    hw = sz.hardware_from_env(env)
    parser = build_parser(sz.version_tuple(hw.log_format))
    args = parser.parse_args(with_config(list(sys.argv[1:] if argv is None else argv)))
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static < 1:
        parser.error(f"argument --mem-fraction-static: {args.mem_fraction_static} is not between 0 and 1")
    if args.speculative_algorithm == "DFLASH" and not args.speculative_draft_model_path:
        parser.error("--speculative-algorithm DFLASH requires --speculative-draft-model-path")
    check_nodes(parser, args)
    fraction = args.hicache_host_memory_fraction
    if args.enable_hierarchical_cache and fraction is not None and not 0 < fraction <= 1:
        print("ValueError: --hicache-host-memory-fraction must be in (0, 1].", file=sys.stderr)
        raise SystemExit(1)  # hicache_hook.py:116, at resolution
    if getattr(args, "weight_cache_mode", "off") != "off" and args.speculative_algorithm:
        print(SPECULATIVE_REFUSAL, file=sys.stderr, flush=True)  # model_path_hook.py, before any load
        raise SystemExit(1)
    if env.get("SGLANG_SIM_DIE_AFTER_S") and not hw.fault:  # the knob alone: a rank that dies later
        hw = dataclasses.replace(hw, fault="die_after_ready")
    if not fault_applies(args, env):
        hw = dataclasses.replace(hw, fault="")
    if hw.fault == "exit_at_start":  # a process that dies before its first line (a broken environment)
        raise SystemExit(1)
    launch = Launch(args, hw, env)
    signal.signal(signal.SIGTERM, launch.on_sigterm)
    launch.run()


if __name__ == "__main__":
    main(sys.argv[1:])
