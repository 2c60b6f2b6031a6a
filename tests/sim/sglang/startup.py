"""One simulated SGLang start: the log sequence of the chosen version, its failures, then serving."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from . import disagg, oracle
from . import hicache as hc
from . import sizing as sz
from . import weightcache as wc
from .multinode import Follower, Leader, PeerLost, RendezvousFailed, gloo_error, parse_addr
from .output import Out, traceback_lines
from .serve import State, make_placeholder, make_server

GIVEN = (
    "chunked_prefill_size", "attention_backend", "page_size", "max_running_requests", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens",
)  # fmt: skip
SPEC_WITH_DRAFT = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "DFLASH"}
MLA_PAGE64 = {"flashmla", "trtllm_mla", "cutedsl_mla"}
SITE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
HEADER = "Traceback (most recent call last):"
Frame = tuple[str, int, str, str]
SCHEDULER: list[Frame] = [
    ("managers/scheduler.py", 3301, "run_scheduler_process", "scheduler = Scheduler("),
    ("managers/scheduler.py", 412, "__init__", "self.init_model_worker()"),
]
DIST_INIT: list[Frame] = [
    ("managers/scheduler.py", 640, "init_model_worker", "self.tp_worker = TpModelWorker("),
    ("model_executor/model_runner.py", 702, "init_torch_distributed", "init_distributed_environment("),
    (
        "distributed/parallel_state.py",
        1502,
        "init_distributed_environment",
        "torch.distributed.init_process_group(",
    ),
]
EVENT_LOOP: list[Frame] = [
    ("managers/scheduler.py", 3310, "run_scheduler_process", "scheduler.run_event_loop()"),
    ("managers/scheduler.py", 1120, "event_loop_overlap", "recv_reqs = self.recv_requests()"),
]
# a collective over the CPU (gloo) group: the scheduler's request broadcast, or the min-reduce at start-up
GLOO_FRAMES: list[Frame] = [
    ("managers/scheduler.py", 1391, "recv_requests", "recv_reqs = broadcast_pyobj("),
    ("utils/common.py", 1288, "broadcast_pyobj", "dist.broadcast(tensor_size, src=src, group=dist_group)"),
]


def read_config(path: str | None) -> dict[str, Any]:
    """The HF config.json next to the weights, or nothing."""
    try:
        data = json.loads((Path(path or "/nonexistent") / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def weight_files(folder: str | None) -> list[Path]:
    """The checkpoint's shards: *.safetensors at the top of the model folder, in name order."""
    try:
        return sorted(Path(folder).glob("*.safetensors")) if folder else []
    except OSError:
        return []


def read_files(paths: list[Path]) -> None:
    """Read each file through, as a checkpoint loader does: from disk when cold, from memory when cached."""
    buf = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def clock(seconds: float) -> str:
    """tqdm's mm:ss."""
    return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


@dataclass(frozen=True)
class Checkpoint:
    """Weights to load: the model, GiB per GPU, the shards the progress bar counts, the least time the whole
    load takes, and the folder whose weight files are really read (None: none)."""

    arch: sz.Arch
    weights_gib: float
    shards: int
    seconds: float
    folder: str | None


def idle() -> None:
    """Wait for a signal in short naps. A process-directed SIGTERM may land on any thread; Python runs its
    handler in the main thread only once that thread wakes, so a one-hour sleep would hold the drain (and
    the stop) until systemd's TimeoutStopSec ran out."""
    while True:
        time.sleep(0.2)


class Launch:
    """One simulated server start, from flags to 'fired up', and then serving."""

    def __init__(self, args: argparse.Namespace, hw: sz.Hardware, env: dict[str, str]) -> None:
        self.a, self.hw, self.env = args, hw, env
        self.v = sz.version_tuple(hw.log_format)
        self.ranks = args.tp_size * args.dp_size
        self.out = Out(args.tp_size, args.dp_size, hw.fault == "garbage")
        self.slow = hw.slow_factor if hw.fault == "slow_start" else 1.0
        self.config = read_config(args.model_path)
        self.target = sz.arch_from_config(self.config, sz.KIMI_K26)
        self.spec: str | None = args.speculative_algorithm
        self.has_draft = self.spec in SPEC_WITH_DRAFT
        t = self.target
        mtp = sz.Arch(t.architecture + "NextN", 1, t.kv_lora_rank, t.qk_rope_head_dim, t.kv_heads, t.head_dim)
        default_draft = sz.DFLASH_DRAFT if self.spec == "DFLASH" else mtp
        self.draft_config = read_config(args.speculative_draft_model_path)
        self.draft = sz.arch_from_config(self.draft_config, default_draft)
        self.answer: dict[str, Any] | None = None  # SGLang 0.5.23's own sizing (tests/oracle)
        self.spreads = sz.rank_spreads(hw, self.ranks)
        self.elem = sz.kv_elem(args.kv_cache_dtype, t.dtype)
        fp8 = {"fp8_e5m2": "float8_e5m2", "fp8_e4m3": "float8_e4m3fn"}
        self.kv_dtype = fp8.get(args.kv_cache_dtype, "bfloat16" if self.elem == 2 else t.dtype)
        self.serving = False
        self.stopping = False  # the main process ends its scheduler itself
        # --nnodes: this node runs TP ranks first .. first + per_node - 1 (absent flags: one node)
        self.nnodes: int = getattr(args, "nnodes", 1)
        self.node_rank: int = getattr(args, "node_rank", 0)
        self.per_node = self.ranks // self.nnodes
        self.first = self.node_rank * self.per_node
        self.group: Leader | Follower | None = None
        self.sigterm_wait = False  # a node >= 1 got SIGTERM and waits for node 0's ShutdownReq
        self.pinned = 0  # HiCache host pools pinned, bytes (given back to the simulated host at exit)

    def pause(self, seconds: float) -> None:
        time.sleep(seconds * self.slow)

    def order(self) -> list[int]:
        """Ranks in the jumbled order parallel processes print in."""
        local = range(self.first, self.first + self.per_node)
        return sorted(local, key=lambda r: (r * 5 + 3) % (self.ranks + 1))

    def resolve(self) -> None:
        """Fill in the defaults SGLang resolves before it prints server_args."""
        a, hw = self.a, self.hw
        if hw.fault == "wrapper_context":  # a wrapper script that pins its own context length
            a.context_length = 32768
        self.fraction_given = a.mem_fraction_static is not None
        self.given = {name: getattr(a, name) for name in GIVEN}
        a.served_model_name = a.served_model_name or a.model_path
        a.tokenizer_path = a.tokenizer_path or a.model_path
        a.chunked_prefill_size = a.chunked_prefill_size or (8192 if hw.gpu_mem_gib > 60 else 4096)
        a.attention_backend = a.attention_backend or hw.attention_backend
        a.page_size = a.page_size or (64 if self.target.mla and a.attention_backend in MLA_PAGE64 else 1)
        if self.has_draft and a.max_running_requests is None:
            a.max_running_requests = 48
            self.out.log(
                "Max running requests is reset to 48 for speculative decoding. You can override this "
                "by explicitly setting --max-running-requests."
            )
        if self.spec == "DFLASH":
            a.speculative_num_steps, a.speculative_eagle_topk = 1, 1
            a.speculative_num_draft_tokens = a.speculative_num_draft_tokens or 16
        elif self.spec:
            a.speculative_num_steps = a.speculative_num_steps or 3
            a.speculative_eagle_topk = a.speculative_eagle_topk or 1
            a.speculative_num_draft_tokens = a.speculative_num_draft_tokens or 4
        a.cuda_graph_max_bs = a.cuda_graph_max_bs or (512 if a.tp_size >= 4 else 256)
        if a.max_running_requests is not None:
            a.cuda_graph_max_bs = min(a.cuda_graph_max_bs, a.max_running_requests)
        if a.mem_fraction_static is None:
            given = sz.FractionArgs(a.tp_size, self.spec, a.chunked_prefill_size, a.cuda_graph_max_bs)
            a.mem_fraction_static = sz.default_fraction(self.v, hw, self.target, given)
        env_context = int(self.env.get("SGLANG_SIM_MAX_CONTEXT") or 0)
        self.derived = env_context or (self.target.max_context if self.config else hw.max_context)
        self.context = a.context_length or self.derived
        # a context above the model's is refused before any sizing (check_context), so SGLang is not asked
        allowed = self.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true")
        if self.v >= (0, 5, 23) and (self.context <= self.derived or allowed):
            self.ask_oracle()

    def ask_oracle(self) -> None:
        """Let SGLang 0.5.23's own code resolve the defaults and size the pool for this start."""
        a, hw = self.a, self.hw
        fraction = a.mem_fraction_static if self.fraction_given else None
        given = argparse.Namespace(**{**vars(a), "mem_fraction_static": fraction})
        for name in GIVEN:  # SGLang resolves what the unit left unset, not the sim's own defaults
            setattr(given, name, self.given.get(name))
        used = hw.weights_gib * hw.gpus / a.tp_size + (hw.draft_weights_gib if self.has_draft else 0.0)
        req = oracle.request(given, hw, self.env, oracle.Configs(self.config, self.draft_config), used)
        self.answer = oracle.ask(req)
        if not self.answer or not self.answer.get("ok"):
            return
        ans = self.answer
        a.mem_fraction_static = ans["mem_fraction_static"]
        a.page_size, a.chunked_prefill_size = ans["page_size"], ans["chunked_prefill_size"]
        a.attention_backend = ans["attention_backend"]
        # with no config.json beside the weights the sim's host profile keeps its own derived context
        self.context = ans["context_len"] if a.context_length or self.config else self.context

    def server_args_line(self) -> str:
        fields = dict(vars(self.a))
        if self.v >= (0, 5, 20):
            return f"server_args={fields!r}"
        return "server_args=ServerArgs(" + ", ".join(f"{k}={val!r}" for k, val in fields.items()) + ")"

    def check_context(self) -> None:
        """A context above the model's derived one is refused from 0.5.3 (0.4.x only warns)."""
        if self.context <= self.derived:
            return
        msg = (
            f"Warning: User-specified context_length ({self.context}) is greater than the derived "
            f"context_length ({self.derived}). This may lead to incorrect model outputs or CUDA errors. "
            "Note that the derived context_length may differ from max_position_embeddings in the model's "
            "config."
        )
        allowed = self.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true")
        if self.v < (0, 5, 3) or allowed:
            self.out.log(msg)
            return
        frames: list[Frame] = [
            ("entrypoints/engine.py", 812, "_launch_subprocesses", "tokenizer_manager = TokenizerManager("),
            ("configs/model_config.py", 241, "__init__", "raise ValueError("),
        ]
        error = f"ValueError: {msg} To allow overriding this maximum, set the env var "
        for line in [
            HEADER,
            *traceback_lines(SITE, frames, error + "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"),
        ]:
            self.out.raw(line)
        os._exit(1)

    def die(self, body: list[str], serving: bool = False) -> NoReturn:
        """SGLang's way down: the scheduler traceback, SIGQUIT to the parent, kill_process_tree. A node >= 1
        has no tokenizer manager, so its main process answers SIGQUIT with the launch-phase handler."""
        self.out.log("Scheduler hit an exception: " + HEADER, self.first)
        for line in body:
            self.out.raw(line)
        self.pause(0.05)
        if serving and self.node_rank == 0 and self.v >= (0, 5, 3):
            self.out.log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        else:
            self.out.log("Received sigquit from a child process. It usually means the child failed.")
        hc.charge(self.env, -self.pinned)  # the killed process's pinned pages go back to the host
        os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(137)

    def dist_init(self) -> None:
        begin = "Init parallel begin." if self.v >= (0, 5, 21) else "Init torch distributed begin."
        if self.nnodes > 1:  # every rank waits in torch's rendezvous
            for r in self.order():
                self.out.log(begin, r)
            self.join()
        for r in self.order():
            used = self.hw.gpu_mem_gib - self.pre(r)
            if self.nnodes == 1:
                self.out.log(begin, r)
            if self.v >= (0, 5, 21):
                self.out.log("Init parallel ends. elapsed=0.84 s", r)
                self.out.log(f"Memory baseline taken. mem usage={used:.2f} GB", r)
            else:
                elapsed = "elapsed=0.84 s, " if self.v >= (0, 5, 9) else ""
                self.out.log(f"Init torch distributed ends. {elapsed}mem usage={used:.2f} GB", r)

    def join(self) -> None:
        """The rendezvous at --dist-init-addr, bounded by SGLANG_SIM_RENDEZVOUS_TIMEOUT_S."""
        addr = parse_addr(self.a.dist_init_addr)
        timeout = float(self.env.get("SGLANG_SIM_RENDEZVOUS_TIMEOUT_S") or 300)
        try:
            if self.node_rank == 0:
                leader = self.group = Leader(addr, self.nnodes, timeout)
                leader.gather(self.per_node)
            else:
                self.group = Follower(addr, self.node_rank, timeout)
        except RendezvousFailed as exc:
            self.die(traceback_lines(SITE, SCHEDULER + DIST_INIT, str(exc)))

    def sync(self, name: str, value: int = 0) -> int:
        """A collective over all nodes at start-up (the minimum of `value`); a node gone is gloo's closed
        connection."""
        if self.group is None:
            return value
        try:
            return self.group.barrier(name, value)
        except PeerLost as exc:
            self.die(traceback_lines(SITE, SCHEDULER + GLOO_FRAMES, gloo_error(exc.peer)))

    def pre(self, r: int) -> float:
        return self.hw.pre_gib + self.spreads[r]

    def load(self, ckpt: Checkpoint, before: list[float]) -> None:
        """The weights: mapped from a weight-cache daemon (client mode), else read from the checkpoint."""
        if not self.mapped_from_daemon(ckpt):
            self.read_checkpoint(ckpt, before)
            return
        for r in self.order():  # the weights stay the daemon's: the same memory is in use (PR#34053)
            self.out.log(self.load_end(ckpt.arch, before[r] - ckpt.weights_gib, ckpt.weights_gib, 0.05), r)

    def read_checkpoint(self, ckpt: Checkpoint, before: list[float]) -> None:
        """Per-rank begin/end lines around a progress bar on global rank 0 (\\r-redrawn from 0.5).

        Each shard really reads its share of the weight files in the model folder (so the page cache matters,
        as it does for SGLang), and takes at least its share of `seconds` in all.
        """
        arch, weights, shards, seconds = ckpt.arch, ckpt.weights_gib, ckpt.shards, ckpt.seconds
        files = weight_files(ckpt.folder)
        for r in self.order():
            self.out.log(f"Load weight begin. avail mem={before[r]:.2f} GB", r)
        cr, eol = ("", "\n") if self.v < (0, 5, 0) else ("\r", "")
        bar = "Loading safetensors checkpoint shards: {:3.0f}% Completed | {}/{} [{}<{}, {}]"
        start = time.monotonic()
        shown = self.node_rank == 0  # tqdm is enabled on global rank 0 only (weight_utils.py)
        if shown:
            self.out.raw(cr + bar.format(0, 0, shards, "00:00", "?", "?it/s"), end=eol)
        for n in range(1, shards + 1):
            began = time.monotonic()
            read_files(files[(n - 1) * len(files) // shards : n * len(files) // shards])
            # the rest of the shard's share of `seconds`: the work besides the read (unpacking, copying to
            # the GPU) that a page cache does not save
            self.pause(max(0.0, seconds / shards - (time.monotonic() - began) / self.slow))
            if self.hw.fault == "crash_loading" and n > shards // 2:
                if shown:
                    self.out.raw("")
                self.crash_loading()
            elapsed = time.monotonic() - start
            rate = n / max(elapsed, 1e-6)
            speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
            line = bar.format(100 * n / shards, n, shards, clock(elapsed), clock((shards - n) / rate), speed)
            if shown:
                self.out.raw(cr + line, end=eol)
        if shown:
            self.out.raw("", end="\n" if cr else "")
        for r in self.order():
            self.out.log(self.load_end(arch, before[r] - weights, weights, time.monotonic() - start), r)

    def mapped_from_daemon(self, ckpt: Checkpoint) -> bool:
        """--weight-cache-mode client (ipc_loader.py): wait for a ready daemon (--weight-cache-timeout),
        map its weights when the fingerprint matches, else load from disk as SGLang falls back."""
        if getattr(self.a, "weight_cache_mode", "off") != "client" or ckpt.folder != self.a.model_path:
            return False
        deadline = time.monotonic() + self.a.weight_cache_timeout
        found = wc.lookup(self.a, self.env)
        while found == "absent" and time.monotonic() < deadline:
            time.sleep(0.1)
            found = wc.lookup(self.a, self.env)
        if found == "absent":
            self.die([f"TimeoutError: weight cache daemon not ready within {self.a.weight_cache_timeout} s"])
        if found == "mismatch":
            self.out.log("[IpcModelLoader] daemon CacheConfig mismatch; falling back to disk loading", 0)
            return False
        self.pause(0.05)
        self.out.log("[IpcModelLoader] Loaded model via IPC (mode=client)", 0)
        return True

    def draft_checkpoint(self, weights: float) -> Checkpoint:
        """The draft: one shard, loaded in an eighth of the target's time."""
        return Checkpoint(
            self.draft, weights, 1, self.hw.load_seconds / 8, self.a.speculative_draft_model_path
        )

    def crash_loading(self) -> NoReturn:
        frames: list[Frame] = [
            ("model_loader/loader.py", 689, "load_weights_and_postprocess", "model.load_weights(weights)"),
            (
                "model_loader/weight_utils.py",
                512,
                "safetensors_weights_iterator",
                "with safe_open(st_file) as f:",
            ),
        ]
        error = "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"
        self.die(traceback_lines(SITE, SCHEDULER + frames, error))

    def load_end(self, arch: sz.Arch, avail: float, usage: float, elapsed: float) -> str:
        mem = f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB."
        if self.v < (0, 5, 9):
            return f"Load weight end. type={arch.architecture}, dtype=torch.{arch.dtype}, {mem}"
        quant = f"quant={arch.quant}, " if arch.quant else ""
        middle = f"dtype=torch.{arch.dtype}, " if self.v < (0, 5, 10) else quant
        return f"Load weight end. elapsed={elapsed:.2f} s, type={arch.architecture}, {middle}{mem}"

    def kv_line(self, arch: sz.Arch, tokens: int, cell: int) -> str:
        size = (tokens + self.a.page_size) * cell / sz.GIB
        dtype = f"dtype: torch.{self.kv_dtype}, " if self.v >= (0, 5, 13) else ""
        sizes = (
            f"KV size: {size:.2f} GB" if arch.mla else f"K size: {size / 2:.2f} GB, V size: {size / 2:.2f} GB"
        )
        return f"KV Cache is allocated. {dtype}#tokens: {tokens}, {sizes}"

    def no_memory(self, exc: sz.NoKvMemory) -> NoReturn:
        f, m = self.a.mem_fraction_static, exc.min_fraction
        if self.v >= (0, 5, 14):
            error = (
                "ValueError: Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={f}. Raise --mem-fraction-static above {m:.3f} (minimum viable = "
                f"1 - available/pre = {m:.4f}). If using speculative decoding, draft weights are now counted."
            )
            where = (
                "mem_cache/kv_cache_configurator.py",
                214,
                "_profile_available_bytes",
                "raise ValueError(",
            )
        else:
            owner = "self.server_args." if self.v < (0, 5, 10) else ""
            current = f" Current value: {owner}mem_fraction_static={f}" if self.v >= (0, 5, 3) else ""
            error = f"RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.{current}"
            where = ("model_executor/model_runner.py", 1290, "init_memory_pool", "raise RuntimeError(")
        frames: list[Frame] = [
            ("managers/scheduler.py", 640, "init_model_worker", "self.init_memory_pools()"),
            where,
        ]
        self.die(traceback_lines(SITE, SCHEDULER + frames, error))

    def oom(self, free: float, want: float) -> NoReturn:
        """torch's OOM inside graph capture, re-raised by SGLang with its hint (a chained traceback)."""
        # the failing allocation is always larger than what is left (fragmentation in the fault case)
        total, free = self.hw.gpu_mem_gib, min(max(free, 0.02), 0.45)
        want = max(want, free + 0.25)
        torch_err = (
            f"CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a total "
            f"capacity of {total:.2f} GiB of which {free * 1024:.2f} MiB is free. Including non-PyTorch "
            f"memory, this process has {total - free:.2f} GiB memory in use. If reserved but unallocated "
            "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )
        flag = "--cuda-graph-max-bs-decode" if self.v >= (0, 5, 14) else "--cuda-graph-max-bs"
        hint = (
            "\nPossible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            f"2. set {flag} to a smaller value (e.g., 16)\n"
            "3. disable torch compile by not using --enable-torch-compile\n"
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
        )
        inner: list[Frame] = [("model_executor/cuda_graph_runner.py", 388, "__init__", "self.capture()")]
        outer: list[Frame] = [
            (
                "model_executor/model_runner.py",
                2104,
                "init_device_graphs",
                "self.graph_runner = CudaGraphRunner(self)",
            ),
            ("model_executor/cuda_graph_runner.py", 390, "__init__", "raise Exception("),
        ]
        body = traceback_lines(SITE, inner, "torch.OutOfMemoryError: " + torch_err)
        body += ["", "During handling of the above exception, another exception occurred:", "", HEADER]
        body += traceback_lines(
            SITE, SCHEDULER + outer, f"Exception: Capture cuda graph failed: {torch_err}{hint}"
        )
        self.die(body)

    def capture(self, role: str, avail: list[float], graph: float, bs: int) -> list[float]:
        """Graph capture lines per rank; returns the free memory after it."""
        sizes = sz.capture_sizes(bs)
        for r in self.order():
            if self.v >= (0, 5, 14):
                k = self.a.speculative_num_draft_tokens if role == "target verify" else 1
                head = f"Capture {role} CUDA graph begin. backend=full, num_tokens_per_req={k}, bs={sizes}, "
            else:
                head = "Capture cuda graph begin. This can take up to several minutes. "
            self.out.log(f"{head}avail mem={avail[r]:.2f} GB", r)
        if self.v < (0, 5, 14):
            self.out.log(f"Capture cuda graph bs {sizes}", self.first)
        headroom = max(0.25, 0.5 * self.a.chunked_prefill_size / 8192)
        if self.hw.fault == "oom_graph" or min(avail) - graph < headroom:
            self.pause(self.hw.step_seconds)
            self.oom(min(avail) - graph, headroom)
        self.pause(self.hw.step_seconds)
        for r in self.order():
            left, mem = avail[r] - graph, f"mem usage={graph:.2f} GB"
            if self.v >= (0, 5, 14):
                self.out.log(
                    f"Capture {role} CUDA graph end. elapsed=1.42 s, {mem}, avail mem={left:.2f} GB.", r
                )
            else:
                self.out.log(
                    f"Capture cuda graph end. Time elapsed: 1.42 s. {mem}. avail mem={left:.2f} GB.", r
                )
        return [x - graph for x in avail]

    def pools(self, arch: sz.Arch, tokens: int, cell: int, avail: list[float]) -> None:
        for r in self.order():
            self.out.log(self.kv_line(arch, tokens, cell), r)
        for r in self.order():
            self.out.log(f"Memory pool end. avail mem={avail[r]:.2f} GB", r)

    def host_pool(self, tokens: int, cell: int) -> None:
        """HiCache's host pool per local rank (hicache.py: SGLang 0.5.23's sizing and check), pinned out of
        the simulated host's MemAvailable; SGLang's refusal kills the start as its scheduler's error does."""
        held = int(float(self.env.get("SGLANG_SIM_HOST_PROCESS_GIB") or 0) * sz.GIB)
        ranks = max(self.a.tp_size // self.nnodes, 1)  # launch world size per host (base.py:68-81)
        host = hc.host_now(self.env, held)
        pool = hc.size_pool(tokens, cell, self.a.page_size, hc.resolve(self.a), host, ranks, self.per_node)
        local = list(range(self.first, self.first + self.per_node))
        for r, line in pool.lines:
            self.out.log(line, local[r])
        if pool.error is not None:
            frames: list[Frame] = [
                ("mem_cache/pool_host/base.py", 252, "_allocate_host_buffer", "raise ValueError(")
            ]
            self.die(traceback_lines(SITE, SCHEDULER + frames, pool.error))
        self.pinned = pool.bytes * self.per_node
        hc.charge(self.env, self.pinned)

    def size(self, used: float) -> int:
        """The pool, as the version sizes it; dies as SGLang does when nothing is left."""
        a, spec = self.a, self.spec if self.has_draft else None
        if self.answer is not None:
            return self.size_from_oracle()
        speculation = sz.Speculation(spec, self.draft) if spec is not None else None
        cell = sz.sizing_cell(self.v, self.target, speculation, a.tp_size, self.elem)
        try:
            paging = sz.Paging(a.page_size, a.max_total_tokens)
            pool = sz.pool_tokens(
                self.hw.pre_gib, self.hw.pre_gib - used, a.mem_fraction_static, cell, paging
            )
        except sz.NoKvMemory as exc:
            self.no_memory(exc)
        if pool.cap_ignored:
            self.out.log(
                f"max_total_tokens={a.max_total_tokens} is larger than the profiled value {pool.profiled}. "
                "Use the profiled value instead.",
                self.first,
            )
        if spec and self.v < (0, 5, 8):  # before 0.5.8 the draft's headroom inflates the count
            per_req = a.speculative_num_steps * a.speculative_eagle_topk + a.speculative_num_draft_tokens
            return int(pool.tokens + a.max_running_requests * per_req + 100)
        return pool.tokens

    def size_from_oracle(self) -> int:
        """SGLang 0.5.23's answer: its pool, or its refusal when the weights leave nothing."""
        ans = self.answer or {}
        if not ans.get("ok"):
            message = str(ans.get("message", ""))
            found = re.search(r"minimum viable = 1 - available/pre = ([0-9.]+)", message)
            if found:
                self.no_memory(sz.NoKvMemory(self.a.mem_fraction_static, float(found.group(1))))
            error = f"{ans.get('error_type')}: {message}"
            self.die(traceback_lines(SITE, SCHEDULER, error))
        for line in ans.get("logs", []):
            if "is larger than the profiled value" in line:
                self.out.log(line, self.first)
        return int(ans["max_total_num_tokens"])

    def run(self) -> None:
        a, hw = self.a, self.hw
        self.resolve()
        self.out.log(self.server_args_line())
        self.check_context()
        self.pause(hw.step_seconds)
        if self.per_node > hw.gpus:
            frames: list[Frame] = [
                ("distributed/parallel_state.py", 1210, "init", "torch.cuda.set_device(rank)")
            ]
            error = "RuntimeError: CUDA error: invalid device ordinal"
            self.die(traceback_lines(SITE, SCHEDULER + frames, error))
        self.dist_init()
        self.pause(hw.step_seconds)
        weights = hw.weights_gib * hw.gpus / a.tp_size
        draft_w = hw.draft_weights_gib if self.has_draft else 0.0
        self.early = self.has_draft and self.v >= (0, 5, 14)  # from 0.5.14 the draft loads before sizing
        target = Checkpoint(self.target, weights, 64, hw.load_seconds, a.model_path)
        self.load(target, [self.pre(r) for r in range(self.ranks)])
        used = weights + (draft_w if self.early else 0.0)
        if self.early:
            before = [self.pre(r) - weights for r in range(self.ranks)]
            self.load(self.draft_checkpoint(draft_w), before)
        if hw.fault == "hang_before_pool":
            while True:
                idle()
        # SGLang min-reduces the free memory over all ranks, so every node sizes the same pool
        tokens = self.sync("pool", self.size(used))
        if (0, 5, 3) <= self.v < (0, 5, 13):
            self.out.log(f"Using KV cache dtype: torch.{self.kv_dtype}", self.first)
        running = sz.resolve_max_running(a.max_running_requests, self.spec, tokens, self.context)
        if self.answer and self.answer.get("ok"):
            running = int(self.answer["max_running_requests"])
        free, kv, graph = self.allocate(tokens, running, used, draft_w)
        self.schedulers_ready(tokens, running, free)
        self.memory = {"weight": round(weights + draft_w, 2), "kvcache": round(kv, 2)}
        self.memory |= {"token_capacity": tokens, "graph": round(graph, 2)}
        self.serve(tokens, running)

    def schedulers_ready(self, tokens: int, running: int, free: float) -> None:
        """TP rank 0 alone logs the scheduler's line; every node reports ready, and a node >= 1 goes on to
        follow node 0."""
        if self.node_rank >= 1:
            self.sync("ready")
            self.follow()
        self.scheduler_lines(tokens, running, free)
        self.sync("ready")

    def allocate(self, tokens: int, running: int, used: float, draft_w: float) -> tuple[float, float, float]:
        """Pools, graphs and (before 0.5.14) the draft; returns TP0's free memory, KV and graph GiB."""
        a, early = self.a, self.early
        r2t = (running + 1) * (self.context + 4 + (a.speculative_num_draft_tokens or 0)) * 4 / sz.GIB
        cell_t = sz.cell_bytes(self.target, a.tp_size, self.elem)
        cell_d = sz.cell_bytes(self.draft, a.tp_size, self.elem) if self.has_draft else 0
        kv_t, kv_d = ((tokens + a.page_size) * c / sz.GIB for c in (cell_t, cell_d))
        avail = [self.pre(r) - used - kv_t - r2t for r in range(self.ranks)]
        self.pools(self.target, tokens, cell_t, avail)
        if a.enable_hierarchical_cache:
            self.host_pool(tokens, cell_t)
        if early:
            avail = [x - kv_d for x in avail]
            self.pools(self.draft, tokens, cell_d, avail)
        bs = min(a.cuda_graph_max_bs, running)
        graph = sz.graph_gib(self.hw, bs, a.disable_cuda_graph)
        if not a.disable_cuda_graph and early:
            avail = self.capture("target verify", avail, graph * 0.8, bs)
            avail = self.capture("draft decode", avail, graph * 0.2, bs)
        elif not a.disable_cuda_graph:
            avail = self.capture("target decode", avail, graph, bs)
        if self.has_draft and not early:  # older versions take the whole draft out of the slack
            self.load(self.draft_checkpoint(draft_w), avail)
            avail = [x - draft_w - kv_d for x in avail]
            self.pools(self.draft, tokens, cell_d, avail)
            if not a.disable_cuda_graph:
                avail = self.capture("draft decode", avail, graph * 0.3, bs)
                graph *= 1.3
        return avail[0], kv_t + kv_d, graph

    def scheduler_lines(self, tokens: int, running: int, free: float) -> None:
        a, v = self.a, self.v
        line = (
            f"max_total_num_tokens={tokens}, chunked_prefill_size={a.chunked_prefill_size}, "
            f"max_prefill_tokens={a.max_prefill_tokens}, max_running_requests={running}, "
            f"context_len={self.context}"
        )
        self.out.log(line + (f", available_gpu_mem={free:.2f} GB" if v >= (0, 4, 10) else ""), 0)
        if v >= (0, 5, 16) and a.max_running_requests is not None and running < a.max_running_requests:
            self.out.log(
                f"max_running_requests was reduced from the requested {a.max_running_requests} to {running} "
                "(per dp worker) due to the available KV cache capacity.",
                0,
            )
        if v >= (0, 5, 21) and tokens < self.context:
            self.out.log(
                f"KV pool holds {tokens} tokens, fewer than --context-length {self.context}. One full-length "
                "request cannot fit, so long requests will be refused or truncated at serving time. Lower "
                "--context-length, raise --mem-fraction-static, or free memory taken before the pool is "
                "sized.",
                0,
            )

    def serve(self, tokens: int, running: int) -> NoReturn:
        """Bind as uvicorn does (after the pool and graphs), warm up through the socket, report ready."""
        a, out = self.a, self.out
        states = [{"memory_usage": self.memory, "effective_max_running_requests_per_dp": running}]
        info = {**vars(a), "max_total_num_tokens": tokens, "version": self.hw.log_format}
        info["internal_states"] = [{**states[0], "last_gen_throughput": 0.0}]
        model_info = {"model_path": a.model_path, "tokenizer_path": a.tokenizer_path, "is_generation": True}
        model_info |= {"served_model_name": a.served_model_name, "architectures": [self.target.architecture]}
        state = State(
            self.v, a.served_model_name, self.context, tokens, self.hw.prefill_tokens_per_s,
            a.allow_auto_truncate, a.enable_metrics, info, model_info, lambda m: out.uvicorn(m, access=True),
        )  # fmt: skip
        state.odd_reply = (
            self.hw.fault.removeprefix("odd_reply_") if self.hw.fault.startswith("odd_reply_") else ""
        )
        state.api_key = a.api_key
        state.max_running = running
        state.decode_seconds_per_token = float(self.env.get("SGLANG_SIM_DECODE_SECONDS_PER_TOKEN") or 0)
        state.oom_over_tokens = int(self.env.get("SGLANG_SIM_OOM_OVER_TOKENS") or 0)
        self.state = state
        self.wire_peers(state)
        self.disaggregate(state)
        info["max_req_input_len"] = state.max_req_input_len
        for msg in (f"Started server process [{os.getpid()}]", "Waiting for application startup."):
            out.uvicorn(msg)
        out.uvicorn("Application startup complete.")
        try:
            if self.hw.fault == "port_taken":
                raise OSError(98, "address already in use")
            httpd = make_server(a.host, a.port, state)
        except OSError as exc:
            where = f"('{a.host}', {a.port})"
            out.uvicorn(f"[Errno {exc.errno}] error while attempting to bind on address {where}: "
                        "address already in use", level="ERROR")  # fmt: skip
            out.uvicorn("Waiting for application shutdown.")
            out.uvicorn("Application shutdown complete.")
            hc.charge(self.env, -self.pinned)
            os._exit(1)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.start_scheduler()
        self.serving = True
        out.uvicorn(f"Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)")
        self.warmup(state)
        self.arm_die_after()
        while True:
            idle()

    def disaggregate(self, state: State) -> None:
        """A prefill serves its bootstrap server (with --enable-pd-role-switch every PD role does); a decode
        checks each routed request against it; `POST /pd_role_switch` flips the role (disagg.Roles)."""
        mode = getattr(self.a, "disaggregation_mode", "null")
        switches = getattr(self.a, "enable_pd_role_switch", False)
        if mode == "prefill" or (switches and mode == "decode"):
            disagg.start_bootstrap(self.a, self.out.log)
        roles = disagg.Roles(self.a, self.out.log, lambda: bool(state.in_flight), state.server_info)
        state.routed, state.role_switch = roles.routed, roles.switch

    def wire_peers(self, state: State) -> None:
        """Node 0 of several: a node whose connection closes is seen by the next request's collective only."""
        state.peer_timeout_s = float(self.env.get("SGLANG_SIM_PEER_TIMEOUT_S") or 5)
        state.error_log = self.c10d_error
        if isinstance(self.group, Leader):
            state.peer_lost = self.group.lost

    def c10d_error(self, message: str) -> None:
        """An error line as torch's C++ side prints it (glog style, not through SGLang's logger)."""
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}000"
        self.out.raw(f"[rank0]:[E{stamp} {os.getpid()} ProcessGroupNCCL.cpp:632] {message}")

    def follow(self) -> NoReturn:
        """A node >= 1 once its schedulers are ready (engine.py _launch_subprocesses): no tokenizer, a
        placeholder HTTP server, then the schedulers run until node 0's ShutdownReq broadcast stops them."""
        group = self.group
        assert isinstance(group, Follower)
        self.placeholder()
        self.serving = True
        if group.follow(self.arm_die_after) or self.sigterm_wait:
            os._exit(0)
        self.die(traceback_lines(SITE, EVENT_LOOP + GLOO_FRAMES, gloo_error(group.leader.peer)), serving=True)

    def placeholder(self) -> None:
        """launch_dummy_health_check_server: uvicorn at log_level=warning in a thread; a failed bind is its
        error line, and the node goes on without it."""
        a = self.a
        where = f"[{a.host}]:{a.port}" if ":" in a.host else f"{a.host}:{a.port}"
        try:
            if self.hw.fault == "port_taken":
                raise OSError(98, "address already in use")
            httpd = make_placeholder(a.host, a.port)
        except OSError as exc:
            self.out.log(f"Dummy health check server started in background thread at {where}")
            self.out.uvicorn(f"[Errno {exc.errno}] error while attempting to bind on address ('{a.host}', "
                             f"{a.port}): address already in use", level="ERROR")  # fmt: skip
            self.out.log(f"Dummy health check server stopped at {where}")
            return
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.out.log(f"Dummy health check server started in background thread at {where}")

    def warmup(self, state: State) -> None:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.a.host, self.a.host)
        base = f"http://[{host}]:{self.a.port}" if ":" in host else f"http://{host}:{self.a.port}"
        info_path = "/model_info" if self.v >= (0, 5, 10) else "/get_model_info"
        urllib.request.urlopen(base + info_path, timeout=30).read()
        self.pause(self.hw.warmup_seconds)
        body = {
            "text": "The capital city of France is",
            "sampling_params": {"temperature": 0, "max_new_tokens": 8},
        }
        request = urllib.request.Request(base + "/generate", json.dumps(body).encode())
        request.add_header("content-type", "application/json")
        try:
            urllib.request.urlopen(request, timeout=30).read()
        except urllib.error.HTTPError as exc:  # http_server.py _execute_server_warmup
            self.out.log("Initialization failed. warmup error: " + HEADER)
            frame: Frame = (
                "entrypoints/http_server.py",
                2508,
                "_execute_server_warmup",
                "assert res.status_code",
            )
            for line in traceback_lines(SITE, [frame], f"AssertionError: {exc.read().decode()}"):
                self.out.raw(line)
            os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree(os.getpid())
        state.ready.set()
        self.out.log("The server is fired up and ready to roll!")
        if isinstance(self.group, Leader):
            self.group.warmed_up()

    def arm_die_after(self) -> None:
        """die_after_ready (or DIE_AFTER_S alone): die that long after the server is ready; a node >= 1
        counts from the warmup's forward pass, which runs on every node."""
        if self.hw.fault == "die_after_ready":
            threading.Timer(self.hw.die_after_s, self.die_serving).start()

    def die_serving(self) -> None:
        frames: list[Frame] = [("managers/scheduler.py", 1120, "event_loop_overlap", "self.run_batch(batch)")]
        error = "RuntimeError: CUDA error: an illegal memory access was encountered"
        self.die(traceback_lines(SITE, frames, error), serving=True)

    def start_scheduler(self) -> None:
        """A child process for scheduler_0, with SGLang's default SIGTERM (it has no handler): a signal to
        the whole control group kills it, and the main process then ends as SGLang's does."""
        code = "import os,time\np=os.getppid()\nwhile os.getppid()==p: time.sleep(0.5)\n"
        self.scheduler = subprocess.Popen([sys.executable, "-c", code])
        threading.Thread(target=self.watch_scheduler, daemon=True).start()

    def watch_scheduler(self) -> None:
        """SGLang's SubprocessWatchdog, then the main process' SIGQUIT handler: all in flight is cut."""
        code = self.scheduler.wait()
        if self.stopping:
            return
        pid = self.scheduler.pid
        self.out.log(
            f"Subprocess scheduler_0 (pid={pid}) crashed with exit code {code}. "
            "Triggering SIGQUIT for cleanup..."
        )
        self.out.log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree SIGKILLs itself (FACTS.md: 9/KILL)

    def on_sigterm(self, signum: int, frame: object) -> None:
        """Not yet serving: stop at once. Serving: drain as SGLang 0.5.23 does (tokenizer_manager.py
        sigterm_watchdog): keep serving, /health 503, a line every 5 s, exit when nothing is left. A serving
        node >= 1 only logs (engine.py): its schedulers stop on node 0's ShutdownReq broadcast."""
        if self.serving and self.node_rank >= 1:
            self.out.log(
                f"SIGTERM received on node_rank {self.node_rank}; waiting for the rank-0 ShutdownReq "
                "broadcast to stop the schedulers."
            )
            self.sigterm_wait = True
            return
        if self.serving:
            self.drain()
        hc.charge(self.env, -self.pinned)
        os._exit(0)

    def drain(self) -> None:
        state = self.state
        state.draining.set()
        self.out.log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        every = float(self.env.get("SGLANG_SIM_DRAIN_CHECK_SECONDS") or 5)
        while True:
            with state.lock:
                rids = list(state.in_flight)
            self.out.log(
                f"Gracefully exiting... Remaining number of requests {len(rids)}. Remaining requests {rids=}."
            )
            if not rids:
                break
            time.sleep(every)
        if isinstance(self.group, Leader):
            self.group.shutdown()
        self.stopping = True
        self.scheduler.kill()
        if self.serving:
            for msg in (
                "Shutting down",
                "Waiting for application shutdown.",
                "Application shutdown complete.",
            ):
                self.out.uvicorn(msg)
            self.out.uvicorn(f"Finished server process [{os.getpid()}]")
