"""`plan --facts` takes the margin and the memory floor from the facts file's `planning` section, and
derives the floor from what takes it when the file states none (issue 30 item 6): the commonest single-card
setup, Llama 3.1 8B at 32k on one RTX 4090 (people run it at 0.88-0.90 for about 45k tokens), was not
feasible under the fixed 4 GiB floor; it is under the derived one, and under a 2.5 GiB one a person states."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from agent.cli.main import main
from agent.output import Output

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
RTX4090 = {"name": "NVIDIA GeForce RTX 4090", "memory_total_mib": 24564, "compute_capability": "8.9"}


def run(tmp_path: Path, planning: dict[str, float] | None) -> tuple[int, str]:
    doc: dict[str, Any] = {
        "format": "deployctl-facts/1", "gpus": [RTX4090], "sglang": {"version": "0.5.23"},
        "model": {"config": json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text()),
                  "weights_bytes": 16_070_000_000},
        "flags": {}, "last_start": None,
    }  # fmt: skip
    if planning is not None:
        doc["planning"] = planning
    path = tmp_path / "rtx4090.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["plan", "--facts", str(path), "--context", "32k"], out=out)
    return code, out.stdout.getvalue() + out.stderr.getvalue()  # type: ignore[attr-defined]


def test_the_facts_planning_section_sets_the_floor_and_the_margin(tmp_path: Path) -> None:
    code, text = run(tmp_path, {"reserve_floor_gib": 4.0})
    assert code != 0 and "NOT FEASIBLE" in text and "floor 4.0 GiB" in text
    code, text = run(tmp_path, {"margin": 0.02, "reserve_floor_gib": 2.5})
    assert code == 0 and "feasible" in text and "floor 2.5 GiB" in text
    code, text = run(tmp_path, {"margin": 0.2, "reserve_floor_gib": 2.5})
    assert "with margin 38,400" in text  # 32,000 x 1.2


def test_the_commonest_single_card_setup_is_feasible_under_the_derived_floor(tmp_path: Path) -> None:
    code, text = run(tmp_path, None)
    assert code == 0 and "feasible (architecture)" in text
    floor = float(re.findall(r"the memory floor is ([\d.]+) GiB per GPU, derived: CUDA graphs", text)[0])
    assert 1.0 <= floor < 2.5  # graphs for batch sizes up to 48, a 4,096-token chunk, the slack
    fraction = float(re.findall(r"--mem-fraction-static ([\d.]+) the pool is predicted", text)[0])
    assert 0.82 <= fraction <= 0.90
