"""The HiCache host pool's section of docs/accuracy.md: the planner (agent/plan/hostpool.py) against SGLang
0.5.23's own sizing code on the cases in tests/data/oracle/hostpool-cases.json (made in the oracle venv by
`python -m tests.oracle.hostpool_cases`), grouped by sizing mode and pool layout, with the largest error."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.pure.test_hostpool_oracle import FIXTURE, plan

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class HostRow:
    """One case: its group, what SGLang answered, what the planner said, and whether they agree."""

    mode: str  # size, ratio, auto, or a decode's backup
    layout: str  # MHA or MLA
    case: str
    kind: str  # "pool", "refusal" or "no host pool" (SGLang's answer)
    token_error: int | None  # planner - SGLang, tokens (pools both built)
    byte_error: int | None
    agrees: bool  # equal to the token and byte, the same refusal in the same words, or both build none
    why: str = ""


def _row(case: dict[str, Any]) -> HostRow:
    pool, got = plan(case)
    answer = case["answer"]
    layout = "MLA" if case["pool"].get("kv_cache_dim") else "MHA"
    mode = "decode backup" if case.get("decode") else (got.mode.value if got else "-")
    name = str(case["case"])
    if pool.bytes_per_token != answer["bytes_per_token"]:
        return HostRow(mode, layout, name, "pool", None, None, False, "the bytes per token differ")
    if got is None or "decode_backend" in answer:
        same = got is None and answer.get("decode_backend") == "cpu_tensor"
        return HostRow(mode, layout, name, "no host pool", None, None, same, "" if same else "a pool differs")
    if not answer["ok"]:
        same = got.refusal is not None and got.message() == answer["message"]
        return HostRow(mode, layout, name, "refusal", None, None, same, "" if same else "another refusal")
    if got.refusal is not None:
        return HostRow(mode, layout, name, "pool", None, None, False, f"planner refuses: {got.message()}")
    dt, db = got.tokens - answer["tokens"], got.bytes - answer["bytes"]
    return HostRow(mode, layout, name, "pool", dt, db, dt == 0 and db == 0, "" if dt == db == 0 else "off")


def host_rows() -> list[HostRow]:
    return [_row(c) for c in json.loads(FIXTURE.read_text())["cases"]]


def _worst(values: Sequence[int | None]) -> str:
    shown = [abs(v) for v in values if v is not None]
    return f"{max(shown):,}" if shown else "-"


def summary_line(rows: Sequence[HostRow]) -> str:
    agree = sum(r.agrees for r in rows)
    pools = [r for r in rows if r.kind == "pool"]
    return (
        f"- HiCache host pool vs SGLang 0.5.23's own code: {len(rows)} cases: {agree} agree, "
        f"{len(rows) - agree} differ; largest error {_worst([r.token_error for r in pools])} tokens, "
        f"{_worst([r.byte_error for r in pools])} bytes over {len(pools)} pools"
    )


INTRO = (
    "The host pool per rank (agent/plan/hostpool.py) against SGLang 0.5.23's own HiCache sizing run in the "
    "oracle venv ({fixture}, `python -m tests.oracle.hostpool_cases`): ratios, sizes, auto fractions and a "
    "decode's retraction backup, 1-16 ranks per host, cgroup limits at two levels. A pool agrees when its "
    "tokens and bytes are SGLang's exactly; a refusal when it is SGLang's, in SGLang's words (`Not enough "
    "host memory available ...`, `No host memory is left ...`); a decode that SGLang backs up without a "
    "host pool when the planner plans none."
)


def section() -> list[str]:
    rows = host_rows()
    out = [
        "## HiCache host pool against SGLang's own code",
        "",
        INTRO.format(fixture=FIXTURE.relative_to(ROOT)),
        "",
        summary_line(rows),
        "",
        "| mode | layout | cases | pools equal | refusals equal | no host pool | differ "
        "| largest error (tokens) | largest error (bytes) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, layout in sorted({(r.mode, r.layout) for r in rows}):
        group = [r for r in rows if (r.mode, r.layout) == (mode, layout)]

        def count(kind: str, group: list[HostRow] = group) -> int:
            return sum(r.agrees and r.kind == kind for r in group)

        out.append(
            f"| {mode} | {layout} | {len(group)} | {count('pool')} | {count('refusal')} | "
            f"{count('no host pool')} | {sum(not r.agrees for r in group)} | "
            f"{_worst([r.token_error for r in group])} | {_worst([r.byte_error for r in group])} |"
        )
    differ = [r for r in rows if not r.agrees]
    out += ["", "Cases that differ: " + (", ".join(f"{r.case} ({r.why})" for r in differ) or "none") + "."]
    return out
