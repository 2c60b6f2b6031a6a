"""A unit that leaves --mem-fraction-static to SGLang runs at SGLang's default for the flags it runs now: a
--set that moves that default (a bigger chunk reserves more for activations) must not quietly plan the
pool down to the new default or to the smallest fraction that reaches the target."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.output import Output

FACTS = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-8b-h100.json"


def plan_json(*argv: str) -> dict[str, Any]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    main(["plan", "--facts", str(FACTS), "--context", "128k", "--json", *argv], out)
    assert isinstance(out.stdout, io.StringIO)
    doc: dict[str, Any] = json.loads(out.stdout.getvalue())
    return doc


@pytest.mark.parametrize("chunk", [8192, 16384, 32768, 65536])
def test_a_set_of_the_chunk_keeps_the_running_pool_or_says_it_shrinks(chunk: int) -> None:
    running = plan_json()["predicted_pool_tokens"]  # SGLang's default fraction for the unit as it runs
    doc = plan_json("--set", f"chunked-prefill-size={chunk}")
    assert doc["feasible"]
    if doc["predicted_pool_tokens"] < running * 0.99:
        assert "shrinks" in doc, (chunk, running, doc["predicted_pool_tokens"])
    else:
        assert "shrinks" not in doc


def test_the_plans_flags_line_writes_a_switch_bare_as_the_unit_does() -> None:
    """`--set disable-cuda-graph=true` prints `--disable-cuda-graph`, which SGLang's argparse takes; never
    `--disable-cuda-graph True`, which it refuses."""
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    main(["plan", "--facts", str(FACTS), "--context", "32k", "--set", "disable-cuda-graph=true"], out)
    assert isinstance(out.stdout, io.StringIO)
    line = next(x for x in out.stdout.getvalue().splitlines() if x.strip().startswith("flags"))
    assert "--disable-cuda-graph" in line.split() and "True" not in line.split(), line
