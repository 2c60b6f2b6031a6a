"""HiCache host-pool cases answered by SGLang 0.5.23's own code: `python -m tests.oracle.hostpool_cases`.

Writes tests/data/oracle/hostpool-cases.json (inputs, SGLang's answer and its log lines), which
tests/pure/test_hostpool_oracle.py compares the planner with; CI needs no oracle venv. The cases cross the
three sizing modes (ratio, size, auto fraction) and a decode's retraction backup with TP / ranks per host,
available memory, cgroup limits (memory.max and memory.high at two levels, with usage and page cache), page
sizes and pool geometries, chosen so that refusals of both kinds occur.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.oracle.client import site_packages, venv_dir, venv_ready

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parents[0] / "data/oracle/hostpool-cases.json"
GIB, GB = 1024**3, 10**9

# (heads per rank, head dim, layers, dtype): small to 70B-class MHA geometries.
GEOMETRIES = [
    (2, 64, 2, "bfloat16"),
    (8, 128, 32, "bfloat16"),
    (1, 128, 80, "bfloat16"),
    (4, 128, 48, "float8_e4m3fn"),
]
# MLA (kv_lora_rank + rope dims, layers, dtype): DeepSeek-V3-like, bf16 and fp8.
MLA_GEOMETRIES = [(576, 61, "bfloat16"), (576, 61, "float8_e4m3fn"), (576, 27, "bfloat16")]
MEMORY = [int(17.3 * GIB), 256 * GB, 1024 * GIB, 3 * 10**12, 12 * GIB, int(10.5 * GIB)]
FLAGS: list[dict[str, Any]] = [
    {}, {"fraction": 0.5}, {"fraction": 0.001}, {"fraction": 1.0}, {"ratio": 0.5}, {"ratio": 2.0},
    {"ratio": 2.5}, {"ratio": 3.0, "fraction": 0.5}, {"size_gb": 1}, {"size_gb": 8}, {"size_gb": 40},
    {"size_gb": 64.5}, {"size_gb": 200},
]  # fmt: skip
LAYOUTS = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 2)]  # (launch world size, nodes)


def _cgroup(rng: random.Random, available: int) -> list[dict[str, Any]]:
    kind = rng.choice(["none", "max", "high", "both-levels"])
    usage = rng.randrange(0, 4 * GIB)
    cache = rng.randrange(0, usage + 1)
    top = {"usage": usage + rng.randrange(0, 8 * GIB), "page_cache": cache}
    unit: dict[str, Any] = {"usage": usage, "page_cache": cache}
    limit = rng.randrange(8 * GIB, max(available, 9 * GIB) + 64 * GIB)
    if kind == "max":
        unit["max"] = limit
    elif kind == "high":
        unit["high"] = limit
    elif kind == "both-levels":
        top["max"] = limit
        unit["max"], unit["high"] = limit + rng.randrange(0, 8 * GIB), limit - rng.randrange(0, 2 * GIB)
    return [top, unit]


def build_cases(count: int = 240, seed: int = 41, mla: int = 60) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        heads, dim, layers, dtype = GEOMETRIES[i % len(GEOMETRIES)]
        world, nodes = rng.choice(LAYOUTS)
        available = rng.choice(MEMORY) + rng.randrange(0, GIB)
        decode = i % 5 == 4
        flags = dict(rng.choice(FLAGS[:4] if decode and rng.random() < 0.7 else FLAGS))
        pool = {
            "dtype": dtype, "head_dim": dim, "heads": heads, "layers": layers,
            "page_size": rng.choice([1, 16, 64]),
            "device_tokens": rng.choice([16384, 101_134, 500_000, 2_000_000]) + rng.randrange(0, 4096),
        }  # fmt: skip
        case: dict[str, Any] = {
            "case": f"c{i:03d}", "pool": pool, "world_size": world, "nnodes": nodes, "available": available,
            "cgroup": _cgroup(rng, available), "flags": flags,
        }  # fmt: skip
        if decode:
            case["decode"] = {
                "context_len": rng.choice([4096, 32768, 131072, 1_000_000]),
                "receive_threshold": rng.choice([1.0, 1.0, 0.5]),
            }
        cases.append(case)
    for i in range(mla):  # the first cases' host, flags and layout again, on MLA pools
        dim, layers, dtype = MLA_GEOMETRIES[i % len(MLA_GEOMETRIES)]
        case = {**cases[i % count], "case": f"m{i:03d}"}
        case["pool"] = {**case["pool"], "dtype": dtype, "kv_cache_dim": dim, "layers": layers, "heads": 0}
        cases.append(case)
    return cases


def ask(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    venv = venv_dir()
    if not venv_ready(venv):
        raise SystemExit(f"no oracle venv at {venv} (make oracle)")
    proc = subprocess.run(
        [str(venv / "bin/python"), str(HERE / "_hostpool_worker.py")],
        input=json.dumps({"cases": cases}), capture_output=True, text=True, timeout=900, check=False,
        env={"PYTHONPATH": str(site_packages(venv)), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    results: list[dict[str, Any]] = json.loads(proc.stdout.splitlines()[-1])["results"]
    return results


def main() -> int:
    cases = build_cases()
    for case, answer in zip(cases, ask(cases), strict=True):
        case["answer"] = answer
    FIXTURE.write_text(json.dumps({"sglang": "0.5.23", "cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} cases -> {FIXTURE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
