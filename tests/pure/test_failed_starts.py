"""Never recommend what already failed: a start that ran out of memory bounds the plan's fraction."""

from __future__ import annotations

import io
import json
from pathlib import Path

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_plan_cmd import HOST_TOML

# ct200 started at 0.94 with 64 requests: the pool was built (as the seed's try 3 logged), then graph
# capture ran out of memory (the seed's figures; the graphs' need here is made up to fail).
FAILED_AT_094 = """\
[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/models/Kimi-K2.6', tp_size=8, \
mem_fraction_static=0.94, max_running_requests=64, context_length=200000)
[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=92.80 GB
[2026-12-01 10:09:00 TP0] Load weight end. elapsed=540.00 s, type=KimiK25ForConditionalGeneration, \
avail mem=22.32 GB, mem usage=70.48 GB.
[2026-12-01 10:09:30 TP0] Load weight begin. avail mem=22.32 GB
[2026-12-01 10:09:40 TP0] Load weight end. elapsed=10.00 s, type=DFlash2DraftModel, avail mem=21.12 GB, \
mem usage=1.20 GB.
[2026-12-01 10:09:41 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 218484, KV size: 14.30 GB
[2026-12-01 10:09:42 TP0] Memory pool end. avail mem=5.56 GB
[2026-12-01 10:09:50 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=5.50 GB
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.
"""


def plan_json(tmp_path: Path, *argv: str) -> dict[str, object]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / "ct200.toml").write_text(HOST_TOML, encoding="utf-8")
    log = tmp_path / "failed.log"
    log.write_text(FAILED_AT_094, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    main(["--units", str(tmp_path / "units"), "plan", "ct200", "--json", "--from-log", str(log), *argv], out)
    assert isinstance(out.stdout, io.StringIO)
    loaded: dict[str, object] = json.loads(out.stdout.getvalue())
    return loaded


def test_a_graph_oom_at_a_fraction_is_never_recommended_again(tmp_path: Path) -> None:
    """The start that died at 0.94 was planned "feasible (calibrated)" at 0.94 again, with no warning."""
    p = plan_json(tmp_path, "--context", "200k")
    fraction = p["mem_fraction_static"]
    assert isinstance(fraction, float) and fraction < 0.94
    warnings = p["warnings"]
    assert isinstance(warnings, list)
    assert any("0.940 ran out of GPU memory capturing CUDA graphs" in w for w in warnings), warnings


def test_a_target_that_needs_the_failed_fraction_is_not_feasible(tmp_path: Path) -> None:
    p = plan_json(tmp_path, "--context", "215k")
    assert p["feasible"] is False
    assert isinstance(p["binding"], str) and "memory floor" in p["binding"]
