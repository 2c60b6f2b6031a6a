"""The oracle's case list: simulated hosts, the seed starts, and every stored config under a few flag sets.

`python -m tests.oracle.cases` writes tests/data/oracle/cases.json: (config, flags, env, gpu) -> SGLang
0.5.23's pool, for comparison tests (the planner's, for one) to read without running SGLang.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.oracle import GpuFigures, load_model, request, size_many, stored_models

FIXTURE = Path(__file__).resolve().parents[1] / "data/oracle/cases.json"
SEED_DRAFT = Path(__file__).resolve().parents[1] / "sim/sglang/data/seed-dflash-draft.json"

# ct200 as the seed measured it: free 92.80 GiB before the weights, 21.12 after target + DFLASH draft.
CT200 = GpuFigures(
    count=8, total_gib=95.6, pre_gib=92.7951, post_gib=round(92.7951 - 70.1783 - 1.5, 6),
    capability=(12, 0), name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
)  # fmt: skip
# An 8 x H100 host; post leaves room for mid-size weights at TP 8.
H100 = GpuFigures(count=8, total_gib=79.1, pre_gib=76.9, post_gib=59.4, capability=(9, 0))
HOSTS = {"ct200": CT200, "h100": H100}

SEED_FLAGS = {"tp-size": 8, "chunked-prefill-size": 8192, "speculative-algorithm": "DFLASH"}
# The seed's three starts: (context, fraction, max running requests) -> the pool its logs show.
SEED_STARTS = [((32768, 0.85, 64), 101_134), ((200_000, 0.92, 8), 192_406), ((200_000, 0.94, 8), 218_484)]
NO_MM_RESERVATION = {"SGLANG_VLM_CACHE_SIZE_MB": "0"}

# Flag sets every stored config is sized under (context-length, mem-fraction-static, tp-size, kv dtype).
FLAG_SETS: dict[str, dict[str, Any]] = {
    "tp8-32k": {"tp-size": 8, "context-length": 32768, "mem-fraction-static": 0.85},
    "tp4-8k-fp8": {
        "tp-size": 4, "context-length": 8192, "mem-fraction-static": 0.8, "kv-cache-dtype": "fp8_e4m3"
    },
}  # fmt: skip


KEPT = (
    "max_total_num_tokens", "max_running_requests", "context_len", "mem_fraction_static", "page_size",
    "cell_bytes", "draft_cell_bytes", "mm_reservation_gib", "full_max_total_num_tokens",
    "swa_max_total_num_tokens", "max_mamba_cache_size", "attention_arch", "pool_configurator",
    "kv_cache_dtype", "attention_backend", "ok", "error_type", "message",
)  # fmt: skip


def seed_request(start: tuple[int, float, int], env: dict[str, str]) -> dict[str, Any]:
    context, fraction, running = start
    flags = {**SEED_FLAGS, "context-length": context, "mem-fraction-static": fraction}
    flags["max-running-requests"] = running
    draft = json.loads(SEED_DRAFT.read_text())
    return request(load_model("kimi-k2.5"), flags, env, CT200, draft)


def model_requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(model, flag set, request) for every stored config; the H100 host for both flag sets."""
    out = []
    for name in stored_models():
        for label, flags in FLAG_SETS.items():
            ctx = flags["context-length"]
            config = load_model(name)
            out.append((name, label, request(config, {**flags, "context-length": ctx}, {}, H100)))
    return out


def build_fixture() -> list[dict[str, Any]]:
    labelled = [
        ("kimi-k2.5", f"seed-{i}", seed_request(s, NO_MM_RESERVATION)) for i, (s, _) in enumerate(SEED_STARTS)
    ]
    labelled += [("kimi-k2.5", f"seed-{i}-mm", seed_request(s, {})) for i, (s, _) in enumerate(SEED_STARTS)]
    labelled += model_requests()
    answers = size_many([req for _, _, req in labelled])
    cases = []
    for (model, label, req), ans in zip(labelled, answers, strict=True):
        inputs = {k: v for k, v in req.items() if k not in ("config", "draft_config")}
        inputs["draft"] = "seed-dflash-draft" if req["draft_config"] else None
        cases.append(
            {"model": model, "case": label, **inputs, "answer": {k: ans.get(k) for k in KEPT if k in ans}}
        )
    return cases


def main() -> int:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    cases = build_fixture()
    FIXTURE.write_text(json.dumps({"sglang": "0.5.23", "cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} cases -> {FIXTURE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
