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
                         slow_start | exit_at_start (exit 1 before any line) | garbage |
                         odd_reply_{not_json,no_choices,error,list} (a 200
                         chat reply no healthy server gives)
    FAULT_WHEN_CONTEXT   apply FAULT only to a start with this --context-length (e.g. the new unit's, so
                         the restored old unit starts cleanly)
    FAULT_WHEN_FRACTION  likewise for --mem-fraction-static; both given: both must match
    SLOW_FACTOR          delay multiplier for slow_start (10)
    DIE_AFTER_S          seconds of serving before die_after_ready dies (5); set alone, it is that fault
                         (a rank that dies later; a node >= 1 counts from node 0's warmup)
    MEMINFO              HiCache: a simulated /proc/meminfo (a test host binds it over its own): MemAvailable
                         is read from it and the host pools pinned leave it until the process ends
    MEMORY_MAX           HiCache: the unit's MemoryMax= in bytes (default: systemd's, for the sim's own unit)
    HOST_PROCESS_GIB     HiCache: what the unit holds besides its pools, taken off MemoryMax= (0)
    ORACLE               "auto" (default: SGLang's own sizing where the oracle is available) or "require"
    RENDEZVOUS_TIMEOUT_S multi-node: how long the rendezvous at --dist-init-addr waits (300); then torch's
                         DistStoreError (node 0) or DistNetworkError (a node >= 1) and the scheduler's death
    PEER_TIMEOUT_S       multi-node: how long node 0's request waits for a node that is gone before it fails
                         with HTTP 500 and NCCL's watchdog line (5)

Multi-node (--nnodes N --node-rank K --dist-init-addr HOST:PORT, see multinode.py): node 0 listens at
HOST:PORT before it loads weights; the others connect and start-up goes in lockstep (the pool is the minimum
over the nodes). Each node logs its own ranks' lines (TP K*tp/N ...); only node 0 logs max_total_num_tokens,
serves the HTTP API and fires up. A node >= 1 serves a placeholder /health, /health_generate and /ping (200;
anything else 404) with no access log, only logs on SIGTERM (it waits for node 0's ShutdownReq broadcast,
sent when node 0 stops gracefully) and dies with gloo's "Connection closed by peer" when node 0 goes away
otherwise, unless it is in that SIGTERM wait (then it exits 0). Node 0 has no heartbeat: with a node gone its
/health stays 200 and requests fail. Each node reads its own SGLANG_SIM_* environment, so a fault can be set
on one node only.
"""

import os

__version__ = os.environ.get("SGLANG_SIM_LOG_FORMAT", "0.5.23")
