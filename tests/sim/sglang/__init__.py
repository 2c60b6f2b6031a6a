"""A simulated SGLang server for tests: `python -m sglang.launch_server` on simulated GPUs.

It prints SGLang's real start-up lines (server_args, weight loading, the KV pool, CUDA graphs, the
scheduler line, uvicorn, "fired up"), fails the way SGLang fails, and then serves SGLang's HTTP endpoints
on --host/--port. Only the stdlib is used. For 0.5.23 starts the pool, the resolved defaults and
max_running_requests come from SGLang 0.5.23's own sizing code (tests/oracle, see oracle.py); older log
formats, and a machine without the oracle venv, use the formulas in sizing.py.

Environment knobs (a systemd drop-in can set them), all prefixed SGLANG_SIM_:
    PROFILE              simulated host: "ct200" (default; 8 x 96 GB, Kimi K2.6 + DFLASH draft) or "h100"
    GPUS                 number of GPUs (8)
    GPU_MEM_GIB          card memory as the driver reports it (95.6)
    PRE_GIB              free memory before weights, minimum over ranks (92.7951, logged as 92.80)
    RANK_SPREAD_GIB      how much more the other ranks have free (0.3), so the minimum matters
    WEIGHTS_GIB          target weights per GPU when sharded over all GPUS (70.1783)
    DRAFT_WEIGHTS_GIB    draft weights per GPU (1.5)
    GRAPH_GIB            CUDA-graph memory base (1.16) ...
    GRAPH_PER_BS_GIB     ... plus this per captured batch size (0.03; an eighth of it above 64)
    MAX_CONTEXT          the model's derived context length (262144; else config.json's)
    ATTENTION_BACKEND    default attention backend ("triton": page size 1)
    LOG_FORMAT           the SGLang version to imitate: "0.5.23" (default), "0.5.10", "0.4.6", ...
    LOAD_SECONDS         weight-load duration (2.0)
    STEP_SECONDS         delay between start-up phases (0.2)
    WARMUP_SECONDS       time the warmup request takes; /health is 503 meanwhile (0.5)
    PREFILL_TOKENS_PER_S prefill speed of a request (100000; the real ct200 is about 1300)
    FAULT                crash_loading | oom_graph | hang_before_pool | die_after_ready | port_taken |
                         slow_start | garbage | odd_reply_{not_json,no_choices,error,list} (a 200
                         chat reply no healthy server gives)
    FAULT_WHEN_CONTEXT   apply FAULT only to a start with this --context-length (e.g. the new unit's, so
                         the restored old unit starts cleanly)
    FAULT_WHEN_FRACTION  likewise for --mem-fraction-static; both given: both must match
    SLOW_FACTOR          delay multiplier for slow_start (10)
    DIE_AFTER_S          seconds of serving before die_after_ready dies (5)
    ORACLE               "auto" (default: SGLang's own sizing where the oracle is available) or "require"
"""

import os

__version__ = os.environ.get("SGLANG_SIM_LOG_FORMAT", "0.5.23")
