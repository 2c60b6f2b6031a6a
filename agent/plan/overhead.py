"""Free memory before the weights, without an earlier start: the card minus the CUDA context and NCCL.

SGLang measures `pre` after torch.distributed / NCCL / custom all-reduce init (distributed/bootstrap.py
measure_pre_model_load_memory), as the minimum over ranks. It is the card's total minus a context that
depends on the card class and grows with the TP size. Public startups that log both the card and
"Load weight begin. avail mem" (or "Init torch distributed ends. mem usage=") give:

  card (MiB total)         TP  total GiB  pre GiB   overhead   source
  RTX 5090-class 32 GB      1    31.84     30.77     1.07      sgl-project/sglang#7227 (21.96 + 8.81 weights)
  H100 80GB HBM3 (81559)    1    79.65     77.17     2.48      sgl-project/sglang#8008 (Kimi-VL, 77.17)
  96 GB class (97871)       8    95.58     92.80     2.78      the seed host ct200 (Kimi K2.6, TP 8)
  H200 (143771)             8   140.40    137.29     3.11      sgl-project/sglang#11716 (137.29)
  H200 TP8 "Init torch distributed ends. mem usage=" 1.77-2.01 GB  sgl-project/sglang#11716

So: about 1.1 GiB on consumer cards (< 40 GiB: smaller cuBLAS / attention workspaces, no NVLink
all-reduce buffers), about 2.45 GiB on data-centre cards at TP 1, and about 0.09 GiB more per extra TP
rank (NCCL channels and custom all-reduce buffers per peer). The spread of the evidence around this
line is within ±0.35 GiB; the cold margin below covers it, and the container or driver can move it
further: the first real start replaces the estimate (a failed start's "Load weight begin" too).
"""

from __future__ import annotations

from dataclasses import dataclass

SMALL_CARD_GIB = 40.0
SMALL_BASE_GIB = 1.1
LARGE_BASE_GIB = 2.45
PER_RANK_GIB = 0.09
COLD_MARGIN_GIB = 0.35


@dataclass(frozen=True)
class Overhead:
    gib: float
    margin_gib: float
    why: str


def pre_weights_overhead(card_gib: float, tp: int, pp: int = 1) -> Overhead:
    """The CUDA context + communication overhead per GPU, and the margin the plan keeps for it."""
    base = SMALL_BASE_GIB if card_gib < SMALL_CARD_GIB else LARGE_BASE_GIB
    ranks = max(1, tp) * max(1, pp)
    gib = base + PER_RANK_GIB * (ranks - 1)
    kind = "consumer-class" if card_gib < SMALL_CARD_GIB else "data-centre"
    why = (
        f"{gib:.2f} GiB before the weights ({kind} card {base:.2f} GiB + {PER_RANK_GIB:.2f} GiB per extra "
        f"rank, from public startups), ±{COLD_MARGIN_GIB:.2f} GiB: the fraction is chosen for the low end"
    )
    return Overhead(gib, COLD_MARGIN_GIB, why)
