"""A calibrated plan under what changed since its start: another process on a card now (issue 30 item 8), and
another KV cache dtype than the start ran (item 1, for `--from-log` starts)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.inventory import HostConfig
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.effective import effective
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_from_facts
from agent.plan.from_inventory import plan_input_from_inventory
from agent.plan.predict import pool_model
from agent.plan.sizing import sizing
from agent.report import render_plan
from agent.sglang.kvpool import GIB
from tests.pure.test_facts_plan import ct200
from tests.pure.test_plan_cmd import HOST_TOML, START_LOG
from tests.pure.test_start_check import ARGS

PYTHON = {"pid": 4242, "name": "python", "used_mib": 6 * 1024.0, "unit": "notebook.service"}
OWN = {
    "pid": 77,
    "name": "sglang::scheduler_TP3",
    "used_mib": 88_000.0,
    "unit": "sglang.service",
    "service": True,
}


def with_processes(per_card: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    doc = ct200()
    doc["gpus"] = [copy.deepcopy(card) for card in doc["gpus"]]
    for index, procs in per_card.items():
        doc["gpus"][index]["processes"] = procs
    return doc


def test_a_process_outside_the_service_comes_off_the_calibrated_pool_and_is_named() -> None:
    # The last start (92.80 GiB free before the weights) ran on a clean card; a 6 GiB python process now
    # holds memory on GPU 3. SGLang charges it against both free-memory figures (pre and post), so the pool
    # at fraction f loses 6 GiB x f of KV (mem_cache/kv_cache_configurator.py _profile_available_bytes).
    clean = pool_model(parse_facts(ct200()), 200_000)
    busy = pool_model(parse_facts(with_processes({3: [PYTHON]})), 200_000)
    assert busy.pool.basis == "calibrated"
    cell = busy.pool.sizer.effective_cell() if busy.pool.sizer is not None else busy.pool.cell_bytes
    for f in (0.85, 0.92, 0.94):
        lost = clean.pool.pool(f) - busy.pool.pool(f)
        assert lost == pytest.approx(6 * GIB * f / cell, abs=3)
    assert any("pid 4242 python (notebook.service): 6.00 GiB" in n for n in busy.notes)
    assert any("92.80 GiB free before the weights shows a clean card then" in n for n in busy.notes)
    plan = plan_from_facts(parse_facts(with_processes({3: [PYTHON]})), Target(200_000))
    line = render_plan("ct200", plan).splitlines()[0]
    assert "pid 4242 python" in line and "calibrated" in line
    # The rule: feasible exactly when the low end (the calibrated prediction) holds the target's goal.
    holds = plan.predicted_pool_low_tokens >= plan.target_pool_tokens
    assert plan.feasible == (holds and plan.reserve_gib_per_gpu >= plan.reserve_floor_gib)
    assert (
        plan.predicted_pool_tokens
        < plan_from_facts(
            parse_facts(ct200()), Target(200_000, fraction=plan.mem_fraction_static)
        ).predicted_pool_tokens
    )


def test_only_the_services_own_processes_subtract_nothing() -> None:
    clean = pool_model(parse_facts(ct200()), 200_000)
    own = pool_model(parse_facts(with_processes({i: [OWN] for i in range(8)})), 200_000)
    assert own.pool.pool(0.92) == clean.pool.pool(0.92)
    assert not any("held by other processes" in n for n in own.notes)


def test_what_a_process_held_at_the_start_is_not_subtracted_again() -> None:
    # It held 4 GiB when the start measured its free memory: only the 2 GiB it grew by since come off.
    grown = {**PYTHON, "at_start_mib": 4 * 1024.0}
    clean = pool_model(parse_facts(ct200()), 200_000)
    busy = pool_model(parse_facts(with_processes({3: [grown]})), 200_000)
    cell = busy.pool.sizer.effective_cell() if busy.pool.sizer is not None else busy.pool.cell_bytes
    assert clean.pool.pool(0.92) - busy.pool.pool(0.92) == pytest.approx(2 * GIB * 0.92 / cell, abs=3)
    unknown = pool_model(parse_facts(with_processes({3: [PYTHON]})), 200_000)
    assert any("not known" in n and "all of it" in n for n in unknown.notes)


def _plan_cli(tmp_path: Path, *argv: str) -> dict[str, Any]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / "ct200.toml").write_text(HOST_TOML, encoding="utf-8")
    path = tmp_path / "start.log"
    path.write_text(ARGS.format(path="/models/Kimi-K2.6", tp=8, kv="auto") + START_LOG, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    main(["--units", str(tmp_path / "units"), "plan", "ct200", "--context", "200k", "--json",
          "--from-log", str(path), *argv], out)  # fmt: skip
    assert isinstance(out.stdout, io.StringIO)
    plan: dict[str, Any] = json.loads(out.stdout.getvalue())
    return plan


def test_a_bf16_start_from_log_calibrates_an_fp8_kv_plan(tmp_path: Path) -> None:
    # Was: "--from-log ...: the earlier start ran --kv-cache-dtype auto, the plan is for fp8_e4m3: ... it does
    # not calibrate this plan", and the plan fell back to the architecture.
    fp8 = _plan_cli(tmp_path, "--set", "kv-cache-dtype=fp8_e4m3", "--mem-fraction-static", "0.9")
    bf16 = _plan_cli(tmp_path, "--mem-fraction-static", "0.9")
    assert fp8["basis"] == "calibrated" and bf16["basis"] == "calibrated"
    assert not any("does not calibrate" in n for n in fp8["notes"] + fp8["warnings"])
    assert any("scaled from a start at --kv-cache-dtype auto" in e for e in fp8["evidence"])
    # The project's own cells, bf16 and fp8 (MLA's latent and rope parts and the DFLASH draft's K and V).
    host = HostConfig.model_validate({"name": "ct200", **_toml()})
    was = sizing(plan_input_from_inventory(host, host.sglang.flags)).sizer.cell_bytes
    fp8_host = effective(host, (("kv-cache-dtype", "fp8_e4m3"),)).host  # the inventory as --set renders it
    now = sizing(plan_input_from_inventory(fp8_host, fp8_host.sglang.flags))
    ratio = was / now.sizer.cell_bytes
    assert 1.9 < ratio <= 2.0
    assert fp8["predicted_pool_tokens"] / bf16["predicted_pool_tokens"] == pytest.approx(ratio, rel=0.002)


def _toml() -> dict[str, Any]:
    import tomllib

    return tomllib.loads(HOST_TOML)


def test_a_facts_last_start_under_another_kv_dtype_calibrates_scaled() -> None:
    # The file's flags say fp8 KV now; its last start's server_args line says it ran auto (bf16).
    ran = ARGS.format(path="/models/Kimi-K2.6", tp=8, kv="auto") + START_LOG
    doc = ct200(last_start=ran)
    doc["flags"] = {**doc["flags"], "kv-cache-dtype": "fp8_e4m3"}
    plan = plan_from_facts(parse_facts(doc), Target(250_000))
    bf16 = plan_from_facts(
        parse_facts(ct200(last_start=ran)), Target(100_000, fraction=plan.mem_fraction_static)
    )
    assert plan.basis == "calibrated" and plan.feasible and not plan.warnings
    assert plan.evidence == ("the cell scaled from a start at --kv-cache-dtype auto",)
    assert plan.predicted_pool_tokens / bf16.predicted_pool_tokens == pytest.approx(2.0, rel=0.002)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    held=st.lists(
        st.tuples(st.integers(0, 7), st.floats(0, 20 * 1024), st.sampled_from(["own", "other", "unplaced"])),
        max_size=4,
    ),
    fraction=st.sampled_from([0.85, 0.9, 0.93]),
)
def test_the_calibrated_pool_loses_the_busiest_cards_outside_memory_times_the_fraction(
    held: list[tuple[int, float, str]], fraction: float
) -> None:
    # A process no unit claims counts only when the service's own were found (plan/overhead.py _outside).
    units = {"own": "sglang.service", "other": "notebook.service", "unplaced": None}
    per_card: dict[int, list[dict[str, Any]]] = {}
    for n, (card, mib, kind) in enumerate(held):
        proc = {"pid": 100 + n, "name": "p", "used_mib": mib, "unit": units[kind], "service": kind == "own"}
        per_card.setdefault(card, []).append(proc)
    found_own = any(kind == "own" for _, _, kind in held)
    counts = {"own": False, "other": True, "unplaced": found_own}
    kinds = {100 + n: kind for n, (_, _, kind) in enumerate(held)}
    outside = max(
        (sum(p["used_mib"] for p in ps if counts[kinds[p["pid"]]]) for ps in per_card.values()), default=0
    )
    busy = pool_model(parse_facts(with_processes(per_card)), 200_000).pool
    clean = pool_model(parse_facts(ct200()), 200_000).pool
    cell = busy.sizer.effective_cell() if busy.sizer is not None else busy.cell_bytes
    lost = outside * 2**20 * fraction / cell  # down to an empty pool
    assert clean.pool(fraction) - busy.pool(fraction) == pytest.approx(min(lost, clean.pool(fraction)), abs=3)
    plan = plan_from_facts(parse_facts(with_processes(per_card)), Target(150_000))
    holds = plan.predicted_pool_low_tokens >= plan.target_pool_tokens
    fits = plan.reserve_gib_per_gpu >= plan.reserve_floor_gib
    assert plan.feasible == (holds and fits and not plan.refusals)
    assert (outside > 0) == any(e.startswith("less ") for e in plan.evidence)


def test_the_docs_fp8_example_calibrates_on_the_example_start_log(tmp_path: Path) -> None:
    # examples/ct200-start.log's server_args (0.5.23's dict form) says kv_cache_dtype 'auto', its pool line
    # torch.bfloat16. Was: "the earlier start is set aside: its pool gives 2.00 x the architecture's bytes per
    # token", the plan cold.
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "ct200.toml").write_text(HOST_TOML, encoding="utf-8")
    log = str(Path(__file__).parents[2] / "examples" / "ct200-start.log")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(tmp_path / "units"), "plan", "ct200", "--context", "250k", "--json",
                 "--set", "kv-cache-dtype=fp8_e4m3", "--from-log", log], out)  # fmt: skip
    assert isinstance(out.stdout, io.StringIO)
    plan = json.loads(out.stdout.getvalue())
    assert code == 0 and plan["feasible"] and plan["basis"] == "calibrated" and not plan["warnings"]
    assert plan["evidence"] == ["the cell scaled from a start at --kv-cache-dtype auto"]


def test_the_kv_dtype_a_start_ran_is_read_off_its_pool_line_without_server_args() -> None:
    from agent.plan.startcheck import identity

    assert identity(START_LOG.splitlines()).kv_dtype == "bf16"
    fp8 = START_LOG.replace("dtype: torch.bfloat16", "dtype: torch.float8_e4m3fn")
    assert identity(fp8.splitlines()).kv_dtype == "fp8_e4m3"
    said = ARGS.format(path="/m", tp=8, kv="auto") + fp8  # the server_args line says what the flag was
    assert identity(said.splitlines()).kv_dtype == "auto"
    assert identity(["[t TP0] KV Cache is allocated. dtype: torch.float16, #tokens: 5"]).kv_dtype is None


UNPLACED = {"pid": 91_000, "name": "python3", "used_mib": 88_000.0, "unit": None}


def test_a_process_no_unit_claims_is_not_taken_for_a_neighbour_when_the_service_was_not_found() -> None:
    # nvidia-smi names pids the agent cannot place in a unit (another PID namespace): with none of the
    # service's own found on the cards, such a process may be the running server itself. Subtracting its
    # 86 GiB would call every plan not feasible; it is named and set aside instead, in both plans.
    clean = pool_model(parse_facts(ct200()), 200_000)
    seen = pool_model(parse_facts(with_processes({i: [UNPLACED] for i in range(8)})), 200_000)
    assert seen.pool.pool(0.92) == clean.pool.pool(0.92)
    assert any("pid 91000 python3" in n and "not subtracted" in n for n in seen.notes)


def test_a_process_no_unit_claims_counts_when_the_services_own_processes_were_found() -> None:
    clean = pool_model(parse_facts(ct200()), 200_000)
    stray = {**UNPLACED, "used_mib": 6 * 1024.0}
    seen = pool_model(parse_facts(with_processes({i: [OWN] for i in range(8)} | {3: [OWN, stray]})), 200_000)
    assert seen.pool.pool(0.92) < clean.pool.pool(0.92)
    assert any("pid 91000 python3" in n for n in seen.notes)
