"""Free memory before the weights, without an earlier start: the card minus what a rank holds before it loads.

SGLang measures `pre` after torch.distributed, RCCL/NCCL and the custom all-reduce are set up
(distributed/bootstrap.py measure_pre_model_load_memory), as the minimum over ranks: the card's total minus
the device context and the communication buffers. Public startups that log the card (or the OOM line's
"total capacity") and "Load weight begin. avail mem" (and "Init torch distributed ends. mem usage"):

  card (GiB total)          TP  pre GiB  overhead  source
  NVIDIA
  RTX 5090-class 32 GB       1   30.77    1.07     sgl-project/sglang#7227 (21.96 + 8.81 weights)
  H100 80GB class (79.65)    1   78.81    0.84     docs.sglang.ai/start/send_request.html (2025-01-23 run)
  H100 80GB class (79.65)    1   78.59    1.06     sgl-project/sglang#4760 (63.48 + 15.11 weights, FA3)
  H100 80GB HBM3 (79.65)     1   77.17    2.48     sgl-project/sglang#8008 (Kimi-VL, a VLM; the highest)
  96 GB class (95.58)        8   92.80    2.78     the seed host ct200 (Kimi K2.6)
  H200 (140.40)              8  137.29    3.11     sgl-project/sglang#11716 (dist init 1.77-2.01 GB)
  L4 (22.49), PCIe          4   21.63    0.86     didier-durand/llms-in-clouds (dist init 0.13 GB)
  RTX 4090 (23.99), PCIe     4   23.08    0.91     ugyhybnb/sglang-performance-test (16.00 + 7.08 weights)
  AMD Instinct (ROCm)
  MI355X (287.98)            8  283.53    4.45     ajith-sirra-amd/Issues Kimi-K2.5 (rocm/sgl-dev 0.5.8.post1)
  MI355X (287.98)            8  283.48    4.50     ajith-sirra-amd/Issues GLM-5-FP8 (same image)
  MI355X (287.98)            8  284.02    3.96     ajith-sirra-amd/Issues GLM-5-FP8 (lmsysorg v0.5.8-rocm700)
  MI355X (287.98)            8  279.48    8.50     ajith-sirra-amd/Issues GLM-5-FP8 (rocm/sgl-dev 0.5.9)
  MI300X (191.98)        4, DP4 182.61    9.37     sgl-project/sglang#25118 (DeepSeek-V4 dev image)

NVIDIA: about 1.1 GiB at TP 1 on every card class (CUDA context and torch; the consumer and data-centre
figures agree), about 0.27 GiB more per extra rank (fitted at TP 8; SGLang's CUDA custom all-reduce is only
8 MiB of buffers, custom_all_reduce.py _MAX_CAR_SIZE, so this is NCCL's). Two PCIe hosts at TP 4 held
0.86-0.91 GiB in all, which the facts cannot foresee: their cold plans under-predict (docs/accuracy.md).
The 0.4 GiB margin covers the evidence (0.84-1.22 at TP 1, 2.78-3.11 at TP 8) except Kimi-VL's 2.48 GiB at
TP 1: a vision-language start may hold more before its weights, which only its first start tells.

AMD: the HIP context before torch.distributed is 0.61-0.67 GiB (total - pre - "Init torch distributed ends.
mem usage", per rank, in the three MI355X images). With TP > 1, SGLang 0.5.23 uses aiter's custom
all-reduce on ROCm (distributed/device_communicators/custom_all_reduce.py dispatch_custom_allreduce,
SGLANG_USE_AITER_AR defaults to true), which registers a 1 GiB input buffer, an uncached meta buffer of
meta_size() + 2 x 1 GiB and 8 MiB of rank data: 3.01 GiB per GPU at every TP size (ROCm/aiter
aiter/dist/device_communicators/custom_all_reduce.py, max_size=1024*1024*1024, _init_ipc). RCCL takes the
rest of the logged 3.20-3.83 GB: up to 0.82 GiB at TP 8 on the hungriest rank, which the minimum takes
(about 0.12 GiB per extra rank). With attention DP splitting TP into attention-TP groups of 2-8 ranks,
0.5.23 gives that group its own custom all-reduce too (distributed/parallel_state.py, the attention_tp
group inherits the policy), so a second 3.01 GiB. With ROCM_QUICK_REDUCE_QUANTIZATION set (FP, INT8, INT6,
INT4) each such group also opens a quick all-reduce (TP 2, 4 or 8; quick_all_reduce.py), whose uncached
buffer is 2 x its max problem size (quickreduce DeviceComms::init, data_buffer_size = 2 * kMaxProblemSize),
2 GiB unless ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB says otherwise (quick_all_reduce.py): 4 GiB, which is what
the rocm/sgl-dev 0.5.9 image took beyond the 0.5.8.post1 one (7.81 against 3.81 GB; the image's environment
is not in the log, so this is consistent, not shown): a host on AMD whose facts name 0.5.9 counts it unless
its unit sets the variable (release_quick_reduce). An MI300X DeepSeek-V4 dev image took 8.29 GB at TP 4
with attention DP. The margin covers both; the first real start replaces the estimate (a failed start's
"Load weight begin" too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

NVIDIA_BASE_GIB = 1.1
NVIDIA_PER_RANK_GIB = 0.27
NVIDIA_MARGIN_GIB = 0.4
HIP_CONTEXT_GIB = 0.62
AITER_ALLREDUCE_GIB = 3.0 + 8 / 1024  # 1 GiB input + 2 GiB meta/tmp + 8 MiB rank data
RCCL_PER_RANK_GIB = 0.12
AMD_MARGIN_GIB = 5.4
_AR_WORLD_SIZES = (2, 4, 6, 8)  # aiter/sglang CustomAllreduce._SUPPORTED_WORLD_SIZES
_QR_WORLD_SIZES = (2, 4, 8)  # QuickAllReduce._SUPPORTED_WORLD_SIZES
_AMD_WORDS = ("AMD", "Instinct", "MI300", "MI308", "MI325", "MI350", "MI355")


@dataclass(frozen=True)
class Overhead:
    gib: float
    margin_gib: float
    why: str


@dataclass(frozen=True)
class RankLayout:
    """How the ranks of one server talk: TP x PP, the attention-TP group size, and whether the custom
    all-reduce is set up (--disable-custom-all-reduce, SGLANG_USE_AITER_AR=0 turn the aiter one off)."""

    tp: int
    pp: int = 1
    attn_tp: int | None = None
    custom_all_reduce: bool = True
    quick_reduce_max_gib: float = 0.0  # ROCm quick all-reduce's max problem size; 0: not set up


def release_quick_reduce(version: tuple[int, int, int, int] | None) -> bool:
    """Whether the ROCm images of this SGLang release open quick all-reduce without the unit asking: the
    rocm/sgl-dev 0.5.9 images held 4 GiB more before the weights than the 0.5.8.post1 ones (7.83 against
    3.83 GB, a GLM-5 start on MI355X at TP 8: 2.2 % fewer tokens), the 2 x 2 GiB of a quick all-reduce. The
    0.5.9 wheel's quick_all_reduce.py and parallel_state.py open it as 0.5.8.post1's do (only with
    ROCM_QUICK_REDUCE_QUANTIZATION set), so it is the image's environment, and the rule is that release's."""
    return version is not None and version[:3] == (0, 5, 9)


def is_amd(gpu_name: str) -> bool:
    """An AMD Instinct card by its name (rocm-smi / torch: "AMD Instinct MI355X")."""
    return any(word in gpu_name for word in _AMD_WORDS)


def pre_weights_overhead(card_gib: float, tp: int, pp: int = 1) -> Overhead:
    """The NVIDIA CUDA context + communication overhead per GPU, and the margin the plan keeps for it."""
    return overhead_for("NVIDIA", card_gib, RankLayout(tp, pp))


def overhead_for(gpu_name: str, card_gib: float, layout: RankLayout) -> Overhead:
    """What a rank holds before the weights on this vendor's card under this layout."""
    if is_amd(gpu_name):
        return _amd(layout)
    ranks = max(1, layout.tp) * max(1, layout.pp)
    gib = NVIDIA_BASE_GIB + NVIDIA_PER_RANK_GIB * (ranks - 1)
    why = (
        f"{gib:.2f} GiB before the weights (NVIDIA {card_gib:.0f} GiB card: {NVIDIA_BASE_GIB:.2f} GiB + "
        f"{NVIDIA_PER_RANK_GIB:.2f} GiB per extra rank, from public startups), -{NVIDIA_MARGIN_GIB:.2f} GiB "
        "margin: the fraction is chosen for the low end"
    )
    return Overhead(gib, NVIDIA_MARGIN_GIB, why)


def _amd(layout: RankLayout) -> Overhead:
    """HIP context, aiter's custom (and quick) all-reduce per all-reduce group, RCCL per extra rank."""
    ranks = max(1, layout.tp) * max(1, layout.pp)
    sizes = [layout.tp]
    if layout.attn_tp is not None and layout.attn_tp != layout.tp:
        sizes.append(layout.attn_tp)  # the attention-TP group's own all-reduce
    groups = [n for n in sizes if layout.custom_all_reduce and n in _AR_WORLD_SIZES]
    quick = 2 * layout.quick_reduce_max_gib * sum(n in _QR_WORLD_SIZES for n in groups)
    gib = HIP_CONTEXT_GIB + AITER_ALLREDUCE_GIB * len(groups) + quick + RCCL_PER_RANK_GIB * (ranks - 1)
    why = (
        f"{gib:.2f} GiB before the weights (AMD Instinct: HIP context {HIP_CONTEXT_GIB:.2f} GiB + "
        f"{len(groups)} aiter custom all-reduce x {AITER_ALLREDUCE_GIB:.2f} GiB"
        + (f" + quick all-reduce {quick:.2f} GiB" if quick else "")
        + f" + RCCL {RCCL_PER_RANK_GIB:.2f} GiB per extra rank, from aiter's code and public MI355X "
        f"startups), -{AMD_MARGIN_GIB:.2f} GiB margin (two public ROCm images took 4-5 GiB more): the "
        "fraction is chosen for the low end"
    )
    return Overhead(gib, AMD_MARGIN_GIB, why)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a card (nvidia-smi --query-compute-apps; agent/host/watch/gpu_procs.py)."""

    pid: int
    name: str
    used_mib: float
    unit: str | None = None
    service: bool = False  # the service's own: its memory goes with the restart
    at_start_mib: float | None = None  # what it held when the last start measured its free memory


@dataclass(frozen=True)
class Neighbours:
    """What processes outside the service hold on its busiest card (SGLang sizes by the minimum free)."""

    gib: float
    why: str | None
    named: str = ""  # the processes, briefly: "pid 4242 python"
    unknown: bool = False  # some of it: what they held at the start is not known (all of it counted)
    set_aside: str | None = None  # processes no unit claims, not counted (_outside)


def _outside(cards: Sequence[Sequence[GpuProcess]]) -> tuple[list[list[GpuProcess]], str | None]:
    """The processes outside the service on each card, and a note on those set aside.

    A process the host could not place in a systemd unit (nvidia-smi names a pid the agent's /proc lacks:
    another PID namespace) may be the running server itself: it counts only when the service's own
    processes were found on the cards, so the attribution is known to work; otherwise it is named, not
    subtracted (taking the server for a neighbour would call every plan not feasible)."""
    found_own = any(p.service for procs in cards for p in procs)
    unplaced = [p for procs in cards for p in procs if not p.service and p.unit is None and not found_own]
    counted = [[p for p in procs if not p.service and (p.unit is not None or found_own)] for procs in cards]
    if not unplaced:
        return counted, None
    pids = sorted({(p.pid, p.name, p.used_mib) for p in unplaced})
    named = ", ".join(f"pid {pid} {name}: {mib / 1024:.2f} GiB" for pid, name, mib in pids)
    return counted, (
        f"{named} not subtracted: no systemd unit claims it and none of the service's own processes were "
        "found on its GPUs, so it may be the service itself"
    )


def _busiest(
    cards: Sequence[Sequence[GpuProcess]], amount: Callable[[GpuProcess], float]
) -> tuple[list[GpuProcess], float, str | None]:
    """The outside processes of the card where `amount` of them is the most, that sum in GiB, and the note
    on those set aside (_outside). SGLang measures free memory per rank and takes the minimum
    (distributed/bootstrap.py measure_pre_model_load_memory), so that card binds every rank."""
    held, set_aside = _outside(cards)
    worst = max(held, key=lambda procs: sum(amount(p) for p in procs), default=[])
    return worst, sum(amount(p) for p in worst) / 1024, set_aside


def _label(p: GpuProcess) -> str:
    return f"pid {p.pid} {p.name}" + (f" ({p.unit})" if p.unit else "") + f": {p.used_mib / 1024:.2f} GiB"


def outside_service(cards: Sequence[Sequence[GpuProcess]]) -> Neighbours:
    """The most memory processes outside the service hold on any one of its cards, naming them."""
    worst, gib, set_aside = _busiest(cards, lambda p: p.used_mib)
    if not worst:
        return Neighbours(0.0, None, set_aside=set_aside)
    named = ", ".join(_label(p) for p in worst)
    why = f"{gib:.2f} GiB held by other processes on the service's GPU ({named})"
    return Neighbours(gib, why, set_aside=set_aside)


def since_start(cards: Sequence[Sequence[GpuProcess]]) -> Neighbours:
    """What processes outside the service hold now beyond what they held at the last start, on the card where
    that is the most, naming them: a calibrated plan's start measured its free memory without it. A process
    whose memory at the start is not known counts whole, and the note says so."""

    def grown(p: GpuProcess) -> float:
        return max(0.0, p.used_mib - (p.at_start_mib or 0.0))

    worst, gib, set_aside = _busiest(cards, grown)
    worst = [p for p in worst if grown(p) > 0]  # named only where it grew
    if not worst:
        return Neighbours(0.0, None, set_aside=set_aside)
    named = ", ".join(
        _label(p) + ("" if p.at_start_mib is None else f", {p.at_start_mib / 1024:.2f} GiB at the start")
        for p in worst
    )
    unknown = [p for p in worst if p.at_start_mib is None]
    said = (
        f"; what {'they' if len(unknown) > 1 else 'it'} held at the last start is not known: all of it "
        "comes off"
        if unknown
        else ""
    )
    brief = ", ".join(f"pid {p.pid} {p.name}" for p in worst)
    why = f"{gib:.2f} GiB held since the last start by other processes on the service's GPU ({named}){said}"
    return Neighbours(gib, why, brief, bool(unknown), set_aside)
