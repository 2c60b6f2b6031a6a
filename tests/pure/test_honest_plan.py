"""Honest headlines: a plan SGLang would refuse is not feasible, and says which constraint binds."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.facts import parse_facts
from agent.plan.from_facts import plan_for_host, plan_from_facts
from tests.pure.test_facts_plan import H100, facts

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
SIM = (ROOT / "units" / "ct200-sim.toml").read_text(encoding="utf-8")


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text(encoding="utf-8"))
    return loaded


@pytest.mark.parametrize(("model", "tp", "weights_gb"), [("mixtral-8x7b", 2, 93), ("qwen3-32b", 1, 65)])
def test_a_context_above_the_models_own_is_not_feasible(model: str, tp: int, weights_gb: int) -> None:
    """Mixtral and Qwen3-32B at 128k printed "feasible" beside "SGLang 0.5.3 and newer refuse to start"."""
    doc = facts(config(model), H100, tp, weights=weights_gb * 10**9, flags={"tp-size": tp})
    p = plan_from_facts(parse_facts(doc), Target(131_072))
    assert not p.feasible
    assert p.binding is not None and "SGLang refuses a context of 131,072 above the model's own" in p.binding
    allowed = {**doc, "env": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}}
    assert not plan_from_facts(parse_facts(allowed), Target(131_072)).refusals


def plan_text(tmp_path: Path, toml: str, *argv: str) -> tuple[int, str]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "units" / "h.toml").write_text(toml, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["--units", str(tmp_path / "units"), "plan", "h", "--offline", *argv], out)
    assert isinstance(out.stdout, io.StringIO)
    return code, out.stdout.getvalue()


def test_tp_times_pp_above_the_gpus_is_refused(tmp_path: Path) -> None:
    """tp-size 8 on 4 GPUs planned "feasible"."""
    code, text = plan_text(tmp_path, SIM.replace("count = 8", "count = 4"), "--context", "100k")
    assert code == 8
    head = text.splitlines()
    assert "NOT FEASIBLE" in head[0]
    assert (
        head[1] == "  because         tensor parallel 8 × pipeline parallel 1 needs 8 GPUs; "
        "the service has 4 ([gpus])"
    )


def test_weights_that_do_not_fit_say_so(tmp_path: Path) -> None:
    """Not "predicted pool 0 tokens" with "post -54 GiB"."""
    code, text = plan_text(tmp_path, SIM.replace("weights_gib_per_gpu = 70.48", "weights_gib_per_gpu = 150"),
                           "--context", "100k")  # fmt: skip
    assert code == 8
    assert "because         the weights do not fit: about 151.2 GiB per GPU" in text  # with the draft's


def test_a_flag_the_hosts_sglang_removed_is_not_feasible(tmp_path: Path) -> None:
    """A running unit with a flag its SGLang removed is not feasible; an inventory with one is bad input."""
    doc = facts(
        config("qwen3-32b"), H100, 1, weights=65 * 10**9, flags={"tp-size": 1, "cuda-graph-max-bs": 8}
    )
    p = plan_from_facts(parse_facts(doc), Target(16_384))
    assert not p.feasible
    assert p.binding is not None and p.binding.startswith(
        "--cuda-graph-max-bs is not accepted by SGLang 0.5.23"
    )
    toml = SIM.replace("chunked-prefill-size = 8192", "chunked-prefill-size = 8192\ncuda-graph-max-bs = 64")
    code, text = plan_text(tmp_path, toml, "--context", "100k")
    assert (code, text) == (2, "")


def test_the_memory_floor_is_named_when_it_binds(tmp_path: Path) -> None:
    code, text = plan_text(tmp_path, SIM.replace("max_context = 262144", "max_context = 1000000"),
                           "--context", "400k")  # fmt: skip
    assert code == 8
    assert "because         the memory floor: 0.955, the highest fraction that leaves 4.0 GiB" in text


def test_fractions_print_with_three_decimals(tmp_path: Path) -> None:
    _, text = plan_text(tmp_path, SIM, "--context", "100k", "--mem-fraction-static", "0.7657059374999999")
    flags_line = next(line for line in text.splitlines() if line.startswith("  flags"))
    assert "--mem-fraction-static 0.766 " in flags_line, flags_line


def test_a_feasible_plan_has_no_binding() -> None:
    from agent.inventory import load_host

    p = plan_for_host(load_host("ct200-sim", ROOT / "units"), Target(200_000), None, {})
    assert p.feasible and p.binding is None and p.refusals == ()


def test_the_chart_passes_through_the_plans_own_point() -> None:
    """Qwen3.5-27B (linear attention beside full attention): the chart drew the plain cell's 32,768 tokens
    where the plan predicts 62,259; the curve now runs through the chosen point, labelled on its row."""
    from agent.chart import draw, from_plan

    doc = facts(config("qwen3.5-27b"), H100, 1, weights=54 * 10**9, flags={"tp-size": 1})
    p = plan_from_facts(parse_facts(doc), Target(32_768))
    chart = from_plan(p, None)
    assert chart.pool_at(p.mem_fraction_static) == p.predicted_pool_tokens
    label = f"{p.predicted_pool_tokens / 1e3:.0f}k"
    assert any(line.lstrip().startswith(label) and "O" in line for line in draw(chart).splitlines())


def test_an_inventory_without_the_models_context_is_not_refused_on_a_guess() -> None:
    """An adopted inventory names no model.max_context: SGLang's 2048 fallback (no length key in a config)
    is not this model's limit, so a 200k plan must not be refused for it (it was, once the inventory went
    through the facts planner)."""
    from pathlib import Path

    from agent.inventory import load_host
    from agent.plan.choose import Target
    from agent.plan.from_facts import plan_for_host

    host = load_host("ct200-sim", Path(__file__).resolve().parents[2] / "units")
    host = host.model_copy(update={"model": host.model.model_copy(update={"max_context": None})})
    plan = plan_for_host(host, Target(200_000), [], dict(host.sglang.flags))
    assert plan.feasible and not plan.refusals, plan.refusals
    known = host.model_copy(update={"model": host.model.model_copy(update={"max_context": 131072})})
    refused = plan_for_host(known, Target(200_000), [], dict(host.sglang.flags))
    assert not refused.feasible and "above the model's own 131,072" in " ".join(refused.refusals)
