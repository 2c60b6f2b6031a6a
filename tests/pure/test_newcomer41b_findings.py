"""A second newcomer's half hour with HiCache host-memory planning, from the docs and examples alone.

Starting from examples/qwen3-32b-tp4-hicache.json (Qwen3-32B at TP 4 on H100s), edited by hand: a smaller
host, a PD decode's retraction backup, an adopted unit's MemoryMax=/MemoryHigh=, and SGLang's own refusal
lines fed to `parse-log`. Each test states what SGLang 0.5.23 (or deployctl's docs) would have the tool
say, and fails on what it says today.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_newcomer41_findings import cli, qwen_toml, write_units

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def example(available_gib: int, flags: dict[str, Any]) -> dict[str, Any]:
    """The shipped example on a host with `available_gib` free, no cgroup limit, no neighbour."""
    data: dict[str, Any] = json.loads((ROOT / "examples/qwen3-32b-tp4-hicache.json").read_text())
    data["flags"] = {"tp-size": 4, **flags}
    data["host_memory"].update(total=128 * GIB, available=available_gib * GIB, cgroup=[], siblings={})
    return data


def plan(tmp_path: Path, data: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["plan", "--facts", str(path), "--context", "32k"], out)
    assert isinstance(out.stdout, io.StringIO)
    return code, out.stdout.getvalue()


def because(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.strip().startswith("because"))


DECODE = {"disaggregation-mode": "decode", "max-running-requests": 64}
HICACHE = {"enable-hierarchical-cache": True, "max-running-requests": 64}


def test_a_decodes_explicit_size_is_checked_at_the_last_rank_as_hicaches_is(tmp_path: Path) -> None:
    """60 GiB free, TP 4. An explicit --hicache-size turns SGLang's auto size off for a decode too
    (hicache_hook.py:122-123: fraction None, so no budget scope), and each rank checks its pool against
    free memory read afresh (pool_host/base.py:103-108,247-257): the 4th rank sees 2.59 GB. The plan
    refuses --hicache-size 8 with HiCache on ('only have 2.59 GB free'), offers 4; on a decode it offers 8
    (refusing 20: 'only have 8.59 GB free; --hicache-size 8 per rank would fit') and accepts 8, exit 0."""
    assert plan(tmp_path, example(60, {**HICACHE, "hicache-size": 8}))[0] == 8  # holds today
    code, stdout = plan(tmp_path, example(60, {**DECODE, "hicache-size": 20}))
    assert code == 8  # holds today
    offered = re.search(r"--hicache-size (\d+) per rank would fit", because(stdout))
    assert offered and int(offered.group(1)) <= 4, because(stdout)
    assert plan(tmp_path, example(60, {**DECODE, "hicache-size": 8}))[0] == 8


def test_a_decode_backups_refusal_offers_a_fix_that_applies(tmp_path: Path) -> None:
    """A PD decode without HiCache on a host with 12 GiB free: SGLang's default retraction backup pins a
    host pool and the plan refuses it ('No host memory is left for HiCache ...; no host pool fits: turn
    HiCache off for it'). HiCache is already off; what drops the pool is
    --disaggregation-decode-retraction-backup cpu_tensor (kv_cache_builder.py:197-242), which the plan
    then accepts."""
    code, stdout = plan(tmp_path, example(12, DECODE))
    assert code == 8  # holds today
    cpu = {**DECODE, "disaggregation-decode-retraction-backup": "cpu_tensor"}
    assert plan(tmp_path, example(12, cpu))[0] == 0  # holds today
    assert "turn HiCache off" not in because(stdout), because(stdout)
    assert "retraction-backup" in because(stdout), because(stdout)


def test_a_last_rank_refusal_note_names_the_refusal_not_an_allocation(tmp_path: Path) -> None:
    """100 GiB free, TP 4, --hicache-size 12: ranks 1-3 pin, the 4th is refused ('Requesting 12.00 GB but
    only have 10.33 GB free'). The note reads 'HiCache: no host pool fits (Allocating kv hierarchical KV
    host pool: 183106 tokens, 12.00 GB host memory.)': a success line given as why nothing fits."""
    code, stdout = plan(tmp_path, example(100, {"enable-hierarchical-cache": True, "hicache-size": 12}))
    assert code == 8 and "only have 10.33 GB free" in because(stdout)  # holds today
    note = next(x for x in stdout.splitlines() if "no host pool fits (" in x)
    assert "Allocating" not in note, note


ADOPTED = 'template = "sglang-adopted.service.j2"\nverbatim = {{ Service = [{lines}] }}'


def test_a_refusal_under_memory_high_offers_a_limit_that_fixes_it(tmp_path: Path) -> None:
    """An adopted unit with MemoryMax=64G and MemoryHigh=32G, --hicache-size 4: the plan refuses under
    32G (right: SGLang reads memory.high too) but says 'checked under the unit's own MemoryMax=32.0G' and
    offers 'a MemoryMax= of at least 55.0 GiB'. Set MemoryMax=55G (MemoryHigh=32G kept): refused again,
    the same offer. The binding limit is MemoryHigh=; raising MemoryMax= cannot pass."""
    lines = '"MemoryMax=55G", "MemoryHigh=32G"'
    units = write_units(tmp_path, qwen=qwen_toml("hicache-size = 4", ADOPTED.format(lines=lines)))
    code, stdout, _ = cli(units, "plan", "qwen", "--offline", "--context", "64k")
    assert code == 8  # holds today: 32G binds
    reason = because(stdout)
    offer = re.search(r"a MemoryMax= of at least ([\d.]+) GiB", reason)
    assert offer is None or float(offer.group(1)) > 55, reason
    assert "MemoryHigh" in reason, reason


def test_parse_log_and_plan_agree_on_the_size_for_one_refusal(tmp_path: Path) -> None:
    """The plan of the example on a 100 GiB host (TP 4, --hicache-size 30) refuses in SGLang's words
    'Requesting 30.00 GB but only have 19.33 GB free' and offers 11, which it accepts (12 it refuses).
    docs/planning.md: parse-log's fix is R x Y / (P + R - 1) = 4 x 19.33 / 7 = 11.05 for 4 ranks and 4
    pools; fed that very line with tp_size=4, parse-log says 'at most 10'."""
    code, stdout = plan(tmp_path, example(100, {"enable-hierarchical-cache": True, "hicache-size": 30}))
    assert code == 8 and "--hicache-size 11 per rank would fit" in because(stdout)  # holds today
    assert plan(tmp_path, example(100, {"enable-hierarchical-cache": True, "hicache-size": 11}))[0] == 0
    line = re.search(r"Not enough host memory available\..*?hierarchical cache\.", because(stdout))
    assert line  # holds today
    log = tmp_path / "start.log"
    log.write_text(
        "[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/models/Qwen3-32B', tp_size=4, "
        "enable_hierarchical_cache=True, hicache_size=30)\n"
        "[2026-12-01 10:01:06 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        f"ValueError: {line.group(0)}\n"
    )
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert main(["parse-log", str(log), "--json"], out) == 0
    assert isinstance(out.stdout, io.StringIO)
    fix = json.loads(out.stdout.getvalue())["fix"]
    assert "at most 11 " in fix, fix


def test_parse_logs_text_names_the_host_pool_the_log_pinned(tmp_path: Path) -> None:
    """A ready start that logged SGLang's auto-size line and 'Allocating kv hierarchical KV host pool:
    488282 tokens, 32.00 GB host memory.': `parse-log --json` carries host_pool_tokens 488282,
    host_pool_gb 32.0 and the ratio 2.0 -> 0.615; the text report (pool, free memory, fraction, ready)
    has no word of the host pool, and is what README's first look shows a newcomer."""
    log = tmp_path / "start.log"
    log.write_text(
        "[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/models/Qwen3-32B', tp_size=4, "
        "enable_hierarchical_cache=True)\n"
        "[2026-12-01 10:01:05 TP0] KV Cache is allocated. #tokens: 793120, "
        "K size: 24.20 GB, V size: 24.20 GB\n"
        "[2026-12-01 10:01:05 TP0] HiCache auto-sizing: ratio 2.000 -> 0.615; 52.5 GiB host memory per rank "
        "(fraction 0.80, 4 ranks on this host), host pools 29.8 GiB.\n"
        "[2026-12-01 10:01:06 TP0] Allocating kv hierarchical KV host pool: 488282 tokens, "
        "32.00 GB host memory.\n"
        "[2026-12-01 10:02:00 TP0] The server is fired up and ready to roll!\n"
    )
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert main(["parse-log", str(log), "--json"], out) == 0
    assert isinstance(out.stdout, io.StringIO)
    assert json.loads(out.stdout.getvalue())["host_pool_tokens"] == 488282  # holds today
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert main(["parse-log", str(log)], out) == 0
    assert isinstance(out.stdout, io.StringIO)
    assert "488,282" in out.stdout.getvalue() or "488282" in out.stdout.getvalue(), out.stdout.getvalue()


def test_the_small_pool_warning_does_not_offer_a_size_the_host_refuses(tmp_path: Path) -> None:
    """The shipped example as is: the warning says '--hicache-size 52 per rank or more holds more than
    the GPU does, where the host has the room'. The plan has the host's facts and knows it has not: set
    52 and it refuses ('only have 17.37 GB free; --hicache-size 32 per rank would fit'). With the facts
    in hand, the warning should say this host holds at most 32, not offer 52."""
    data: dict[str, Any] = json.loads((ROOT / "examples/qwen3-32b-tp4-hicache.json").read_text())
    code, stdout = plan(tmp_path, data)
    assert code == 0  # holds today
    line = next(x for x in stdout.splitlines() if "smaller than the device pool" in x)
    offered = re.search(r"--hicache-size (\d+) per rank or more", line)
    assert offered  # holds today
    data["flags"]["hicache-size"] = int(offered.group(1))
    code, bigger = plan(tmp_path, data)
    assert code == 8 and "--hicache-size 32 per rank would fit" in because(bigger)  # holds today
    assert "32" in line, line
