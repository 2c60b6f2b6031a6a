"""Turn one SGLang log line (journal MESSAGE or pasted text) into typed events; stateless and fast.

Every pattern is anchored at the message position: right after SGLang's logger prefix (srt/utils/common.py
configure_logger: `[%(asctime)s{.msecs}{prefix}] %(message)s`, prefix " DP0 PP0 ... TP0 EP0" from
managers/scheduler.py, none in the main process), after what a terminal, journalctl or docker put before
it (taken off by agent/sglang/logs/decor.py), or at the start of an unprefixed line (tracebacks, tqdm bars).
SGLang's request log (srt/utils/request_logger.py, `--log-requests`) writes a user's prompt inside a message
that starts "Receive: obj=" or "Finish: obj=", so no prompt is read as a start-up line.
"""

from __future__ import annotations

import re

from agent.sglang.logs import events as ev
from agent.sglang.logs import hicache
from agent.sglang.logs.decor import clean
from agent.sglang.logs.failures import classify

_NUM = r"(-?\d+(?:\.\d+)?)"
_TAGS = r"((?: [A-Z][A-Z_]*\d+)*| encode_server| encode_dp_worker\[\d+\])"  # " DP0 ... TP0 EP0"; encoders
_PREFIX = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{3})?" + _TAGS + r"\] ?")
_OLD_PREFIX = re.compile(r"\[((?:gpu|gpu_id|tp_rank|rank)=\d+)\] ?")  # 2024 builds: "[gpu_id=0] ..."
# A tqdm bar ends without a newline, so the next logger line is glued to it; only there is a prefix inside
# a piece the start of a new line (anywhere else it is text inside a message, e.g. a logged prompt).
_GLUED = re.compile(
    r"(?<=it/s\]|s/it\])(?=\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{3})?(?: [A-Z][A-Z_]*\d+)*\] )"
)

_AVAIL = re.compile(r"avail mem=" + _NUM + r" ?GB")
_USAGE = re.compile(r"mem usage=" + _NUM + r" ?GB")
_DRAINING = re.compile(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)\.")
_TYPE = re.compile(r"\btype=([\w.]+)")
_DRAFT_TYPE = re.compile(r"Draft|Eagle|EAGLE|NextN|MTP|Medusa")
_PROGRESS = re.compile(r"[\w .-]*shards:\s*(\d+)% Completed \| (\d+)/(\d+)")

# An optional pool label ("SWA", "Full", MiniMax's "MiniMax MSA index") before "KV Cache".
_KV = re.compile(r"(?:[\w-]+ ){0,3}?(?:(\w+) )?KV Cache (is allocated|VA upper bound|skipped)[. ]")
_SKIPPED = re.compile(r"KV Cache skipped \(no-op pool\)\. Logical #tokens: (-?\d+)")
_POSTCAP = re.compile(r"Post-capture KV sizing: KV cache allocated\.")
_TOKENS = re.compile(r"#tokens: (-?\d+)")
_KV_SIZE = re.compile(r"\bKV size: " + _NUM + r" ?GB")
_K_SIZE = re.compile(r"\bK size: " + _NUM + r" ?GB")
_V_SIZE = re.compile(r"\bV size: " + _NUM + r" ?GB")
_DTYPE = re.compile(r"\bdtype: ([\w.]+)")
_SWA_FULL = re.compile(r"full(?:_layer_tokens=| size: )(\d+)")
_SWA_SWA = re.compile(r"swa(?:_layer_tokens=| size: )(\d+)")

_PAIR = re.compile(r"(\w+)=(-?\d+(?:\.\d+)?|None)")
_ARG_MFS = re.compile(r"[(,{]\s*'?mem_fraction_static'?\s*[=:]\s*" + _NUM)
_ARG_CTX = re.compile(r"[(,{]\s*'?context_length'?\s*[=:]\s*(\d+)")
_ARG_MRR = re.compile(r"[(,{]\s*'?max_running_requests'?\s*[=:]\s*(\d+)")
_ARG_TP = re.compile(r"[(,{]\s*'?tp_size'?\s*[=:]\s*(\d+)")
_ARG_PP = re.compile(r"[(,{]\s*'?pp_size'?\s*[=:]\s*(\d+)")
_ARG_DP = re.compile(r"[(,{]\s*'?dp_size'?\s*[=:]\s*(\d+)")
_ARG_NODES = re.compile(r"[(,{]\s*'?nnodes'?\s*[=:]\s*(\d+)")
_ARG_HICACHE_SIZE = re.compile(r"[(,{]\s*'?hicache_size'?\s*[=:]\s*(\d+)")
_ARG_DPA = re.compile(r"[(,{]\s*'?enable_dp_attention'?\s*[=:]\s*True")
_FLAG_MFS = re.compile(r"--mem[-_]fraction[-_]static[= ]+" + _NUM)
_FLAG_CTX = re.compile(r"--context[-_]length[= ]+(\d+)")
_FLAG_MRR = re.compile(r"--max[-_]running[-_]requests[= ]+(\d+)")
_ERR_MFS = re.compile(r"mem[-_]fraction[-_]static=" + _NUM)
_AUTO_MFS = re.compile(r"reduce --mem-fraction-static to " + _NUM)
_TIMINGS = re.compile(
    r"Engine startup timings \(s\): load_weight="
    + _NUM
    + r", kv_cache_allocation="
    + _NUM
    + r", scheduler_e2e="
    + _NUM
    + r", cuda_graph=\{([^}]*)\}, tokenizer_e2e="
    + _NUM
)
_EXIT_CODE = re.compile(r"exit code:? (-?\d+)")
_UVICORN = re.compile(r"(?:INFO:\s+)?Uvicorn running on (\S+)")
# A pasted launch command: an optional shell prompt or "command=", environment assignments, then the entry.
_COMMAND = re.compile(
    r"(?:\$ |command=)?(?:[A-Z_][A-Z0-9_]*=\S* )*"
    r"(?:\S*python[\d.]* +-m +sglang\.launch_server|\S*sglang serve)\b"
)


def may_have_events(text: str) -> bool:
    """The prefilter: False only for text that no guard or pattern below can turn into an event.

    Most journal lines (access logs, batch statistics, progress bars, warnings) give no event, yet the
    guards below cost some 40 substring checks each; this costs 17, most of them memchr-fast one-letter
    checks (a letter rare in noise but shared by many guards). Safe because every guard or pattern that
    can yield an event contains one of these keys, and a key found anywhere in the whole MESSAGE covers
    every piece cut from it (tests/pure/test_log_prefilter.py checks both). A chain of `in`, not a loop
    or one alternation regex: both cost more than the checks themselves.
    """
    return (
        "shards:" in text  # tqdm checkpoint-shard progress (first: half the lines of a start)
        or "avail mem" in text  # weights begin/end, memory pool end, CUDA graph begin/end
        or "x" in text  # max_total_num_tokens=, context, max_running_request(s), Exception, exit code, Exit
        or "y" in text  # memory/Memory (OutOfMemory, Not enough ...), already in use, ready to roll, dtype
        or "z" in text  # died during initialization, Initialization failed
        or "V" in text  # KV Cache, KV cache allocated, KV size, SWAKVPool, SGLANG_ALLOW_OVERWRITE_...
        or "U" in text  # Uvicorn running on
        or "R" in text  # OutOfResources, Received sigquit
        or "Q" in text  # SIGQUIT received
        or "rr" in text  # Error, error, [Errno 98]
        or "Traceback" in text
        or "failed" in text  # graph failed, Graph failed, Health check failed
        or "atchdog" in text  # Watchdog timeout
        or "fraction" in text  # mem_fraction_static in errors, flags and the auto-reduce hint
        or "erve" in text  # ServerArgs(, server_args={, launch_server, sglang serve
        or "File " in text  # traceback frames
        or "Segmentation" in text
    )


def parse_line(text: str) -> list[ev.LogEvent]:
    """Events of one MESSAGE: split on CR/LF (tqdm redraws) and before each glued `[date time]` prefix."""
    return parse_line_unfiltered(text) if may_have_events(text) else []


def parse_line_unfiltered(text: str) -> list[ev.LogEvent]:
    """parse_line without the prefilter (the reference the prefilter tests compare against)."""
    pieces = text.splitlines() if ("\n" in text or "\r" in text) else (text,)
    events: list[ev.LogEvent] = []
    for piece in pieces:
        piece = clean(piece)  # colour codes, journalctl's or docker's prefix (agent/sglang/logs/decor.py)
        if piece[:1] == "[" or piece.find("[20", 1) == -1:  # a logger line ends with its own newline
            _parse_piece(piece, events)
        else:
            for part in _GLUED.split(piece):
                if part:
                    _parse_piece(part, events)
    return events


def _parse_piece(piece: str, out: list[ev.LogEvent]) -> None:
    """Strip the prefix (rank tags kept), then try each known line shape, failures last."""
    rank: str | None = None
    msg = piece
    head = piece[:1]
    if head == "[":
        m = _PREFIX.match(piece)
        if m:
            rank = m[1].strip() or None
            msg = piece[m.end() :]
        else:
            m = _OLD_PREFIX.match(piece)
            if m:
                rank, msg = m[1], piece[m.end() :]
    if not msg or msg.isspace():
        return
    if msg.startswith(("server_args=", "ServerArgs(")):  # first: the repr holds every other keyword
        out.append(_server_args(msg, "server_args", _ARG_MFS, _ARG_CTX, _ARG_MRR))
    elif not _parse_progress_lines(msg, rank, out):
        _parse_other(piece.rstrip(), msg, rank, out)


def _parse_progress_lines(msg: str, rank: str | None, out: list[ev.LogEvent]) -> bool:
    """The start-up milestones: KV pool, weights, memory pool, CUDA graphs, tqdm shards, HiCache host pool."""
    if msg.startswith(("Allocating ", "HiCache ")) and (host := hicache.parse(msg, rank)):
        out.append(host)
        return True
    if ("KV Cache" in msg or msg.startswith("Post-capture KV sizing")) and _parse_kv(msg, rank, out):
        return True
    if "avail mem" in msg:
        return _parse_avail(msg, rank, out)
    if "shards:" in msg:
        m = _PROGRESS.match(msg)
        if m:
            out.append(ev.WeightsProgress(rank, int(m[1]), int(m[2]), int(m[3])))
            return True
    return False


def _parse_avail(msg: str, rank: str | None, out: list[ev.LogEvent]) -> bool:
    """Lines that report free GPU memory: weights begin/end, memory pool end, graph begin/end."""
    m = _AVAIL.search(msg)
    avail = float(m[1]) if m else None
    if avail is not None and msg.startswith("Load weight begin"):
        out.append(ev.WeightsBegin(rank, avail))
    elif avail is not None and msg.startswith("Load weight end"):
        t = _TYPE.search(msg)
        model_type = t[1] if t else None
        is_draft = bool(model_type and _DRAFT_TYPE.search(model_type))
        out.append(ev.WeightsEnd(rank, avail, _float(_USAGE, msg), model_type, is_draft))
    elif avail is not None and msg.startswith("Memory pool end"):
        out.append(ev.MemoryPoolEnd(rank, avail))
    elif msg.startswith("Capture ") and "raph begin" in msg:
        out.append(ev.GraphBegin(rank, avail))
    elif msg.startswith("Capture ") and "raph end" in msg:
        out.append(ev.GraphEnd(rank, avail, _float(_USAGE, msg)))
    else:
        return False
    return True


def _parse_kv(msg: str, rank: str | None, out: list[ev.LogEvent]) -> bool:
    """`KV Cache is allocated` (all versions, optional SWA/Full label), VA upper bound, post-capture."""
    label: str | None
    m = _KV.match(msg)
    if m and m[2] == "skipped":  # 0.5.23 no-op pool (prefill-only embedding): logical tokens, no memory
        t = _SKIPPED.search(msg)
        if not t:
            return False
        out.append(ev.KvPool(rank, int(t[1]), 0.0, None, None, None, "skipped", False))
        return True
    if m:
        label = "va_upper_bound" if m[2] == "VA upper bound" else m[1]
        if label == "index":  # MiniMax's "MiniMax MSA index KV Cache": the sparse index pool, not a draft
            pass
        elif label is not None and label not in ("SWA", "Full", "va_upper_bound"):
            label = None  # a word before "KV Cache" that is not a pool label, e.g. "Hybrid"
    elif _POSTCAP.match(msg):
        label = "post_capture"
    else:
        return False
    t = _TOKENS.search(msg, m.end() if m else 0)
    if not t:
        return False
    tokens = int(t[1])
    k_gb, v_gb = _float(_K_SIZE, msg), _float(_V_SIZE, msg)
    size = _float(_KV_SIZE, msg)
    if size is None and k_gb is not None and v_gb is not None:
        size = round(k_gb + v_gb, 2)
    d = _DTYPE.search(msg)
    out.append(ev.KvPool(rank, tokens, size, k_gb, v_gb, d[1] if d else None, label, False))
    if tokens <= 0:
        out.append(ev.Failure(rank, ev.NEGATIVE_POOL, msg, 2))
    return True


def _parse_other(line: str, msg: str, rank: str | None, out: list[ev.LogEvent]) -> None:
    """Scheduler summary, settings, HTTP server, readiness; else maybe a failure line."""
    uvicorn = _UVICORN.match(msg) if "Uvicorn" in msg else None
    if msg.startswith("max_total_num_tokens="):
        out.append(_scheduler(msg, rank))
    elif msg.startswith(("Use sliding window memory pool", "SWAKVPool")):
        out.append(ev.SwaPool(rank, _int(_SWA_FULL, msg), _int(_SWA_SWA, msg)))
    elif uvicorn:
        out.append(ev.UvicornRunning(rank, uvicorn[1]))
    elif msg.startswith("The server is fired up and ready to roll"):
        out.append(ev.Ready(rank))
    elif "tokenizer_e2e=" in msg and (timings := _TIMINGS.match(msg)):
        out.append(_timings(timings, rank))
    elif msg.startswith("SIGTERM received"):  # also "SIGTERM received on node_rank N" (entrypoints/engine.py)
        out.append(ev.Stopping(rank, "SIGTERM"))
    elif msg.startswith("Gracefully exiting... Remaining number of requests ") and (
        drained := _DRAINING.match(msg)
    ):
        out.append(ev.Draining(rank, int(drained[1])))
    elif msg.startswith("Automatically reduce --mem-fraction-static") and _AUTO_MFS.search(msg):
        out.append(ev.ServerArgs(rank, _float(_AUTO_MFS, msg), None, None, "auto_reduce"))
    elif not _parse_command(msg, out):
        _parse_failure(line, msg, rank, out)


def _parse_command(msg: str, out: list[ev.LogEvent]) -> bool:
    """A pasted launch command: its flags are the weakest source of settings."""
    if " --" not in msg or not _COMMAND.match(msg):
        return False
    args = _server_args(msg, "command", _FLAG_MFS, _FLAG_CTX, _FLAG_MRR)
    if args.mem_fraction_static is None and args.context_length is None and args.max_running_requests is None:
        return False
    out.append(args)
    return True


def _parse_failure(line: str, msg: str, rank: str | None, out: list[ev.LogEvent]) -> None:
    found = classify(msg)
    if found is None:
        return
    kind, weight, fraction = found
    code = _int(_EXIT_CODE, msg) if kind == ev.RANK_DIED else None
    out.append(ev.Failure(rank, kind, line, weight, fraction, code))
    if kind in (ev.NOT_ENOUGH_MEMORY, ev.WEIGHTS_LEAVE_NO_MEMORY):
        mfs = _float(_ERR_MFS, msg)  # the value in force, quoted by the error itself
        if mfs is not None:
            out.append(ev.ServerArgs(None, mfs, None, None, "error"))


def _scheduler(msg: str, rank: str | None) -> ev.Scheduler:
    """Key=value pairs read one by one: some builds drop the middle keys."""
    pairs = dict(_PAIR.findall(msg))

    def num(key: str) -> int | None:
        value = pairs.get(key)
        return int(float(value)) if value and value != "None" else None

    gpu = pairs.get("available_gpu_mem") or pairs.get("available_cpu_mem")  # --device cpu: free RAM
    return ev.Scheduler(
        rank,
        num("max_total_num_tokens"),
        num("context_len"),
        num("max_running_requests"),
        num("chunked_prefill_size"),
        float(gpu) if gpu and gpu != "None" else None,
    )


def _timings(m: re.Match[str], rank: str | None) -> ev.EngineTimings:
    graphs = tuple((name, float(value)) for name, value in _PAIR.findall(m[4]) if value != "None")
    return ev.EngineTimings(rank, float(m[1]), float(m[2]), float(m[3]), graphs, float(m[5]))


def _server_args(
    msg: str, source: str, mfs: re.Pattern[str], ctx: re.Pattern[str], mrr: re.Pattern[str]
) -> ev.ServerArgs:
    ranks = _host_ranks(msg) if source == "server_args" else None
    size = (_int(_ARG_HICACHE_SIZE, msg) or None) if source == "server_args" else None
    return ev.ServerArgs(None, _float(mfs, msg), _int(ctx, msg), _int(mrr, msg), source, ranks, size)


def _host_ranks(msg: str) -> tuple[int, int] | None:
    """SGLang's ranks per host, TP x PP over the nodes (srt/mem_cache/pool_host/base.py:68-81), and the host
    pools pinned there: one per rank of every DP replica (attention DP: the DP ranks are the TP ranks)."""
    tp = _int(_ARG_TP, msg)
    if tp is None:
        return None
    pp, dp, nodes = (_int(p, msg) or 1 for p in (_ARG_PP, _ARG_DP, _ARG_NODES))
    ranks = max(tp * pp // max(nodes, 1), 1)
    replicas = 1 if _ARG_DPA.search(msg) else dp
    return ranks, max(ranks, tp * pp * replicas // max(nodes, 1))


def _float(pattern: re.Pattern[str], msg: str) -> float | None:
    m = pattern.search(msg)
    return float(m[1]) if m else None


def _int(pattern: re.Pattern[str], msg: str) -> int | None:
    m = pattern.search(msg)
    return int(m[1]) if m else None
