"""The plan as a picture: golden charts for every golden plan, and the plan command's choice of marks."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.chart import ASCII, UNICODE, PoolChart, draw, from_plan
from agent.cli.main import main
from agent.inventory import HostConfig
from agent.output import Output
from agent.plan.choose import Target
from agent.plan.from_facts import plan_for_host
from tests.pure.test_plan_cmd import start_log, units  # noqa: F401  (fixtures)
from tests.pure.test_planner import CT200, merged

ROOT = Path(__file__).resolve().parents[1] / "golden"
PLANS = sorted((ROOT / "plan").glob("*.json"))
CHARTS = ROOT / "chart"


def chart_of(path: Path) -> PoolChart:
    given = json.loads(path.read_text(encoding="utf-8"))["input"]
    host = HostConfig.model_validate(merged(CT200, given.get("host", {})))
    asked = Target(given["target"], given.get("fraction"), given.get("max_running_requests"))
    plan = plan_for_host(host, asked, given.get("calibration"), host.sglang.flags)
    return from_plan(plan, float(host.sglang.flags["mem-fraction-static"]))


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
@pytest.mark.parametrize("unicode", [False, True], ids=["ascii", "unicode"])
def test_golden_chart(path: Path, unicode: bool, request: pytest.FixtureRequest) -> None:
    text = draw(chart_of(path), unicode=unicode) + "\n"
    expected = CHARTS / f"{path.stem}.{'unicode' if unicode else 'ascii'}.txt"
    if request.config.getoption("--update-golden"):
        expected.write_text(text, encoding="utf-8")
    assert text == expected.read_text(encoding="utf-8"), f"run pytest --update-golden and review {expected}"


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_the_chart_marks_the_chosen_point_once_where_the_plan_says(path: Path) -> None:
    chart = chart_of(path)
    text = draw(chart)
    assert text.isascii()
    plot = text.splitlines()[1:13]
    assert sum(line.count(ASCII.chosen) for line in plot) == 1
    assert f"{ASCII.chosen} chosen {chart.chosen:.3f}: {chart.chosen_pool:,} tokens" in text
    assert f"target {chart.target:,}" in text
    unicode = draw(chart, unicode=True)
    assert sum(line.count(UNICODE.chosen) for line in unicode.splitlines()[1:13]) == 1


def test_a_higher_pool_is_drawn_higher() -> None:
    base = dict(pool_at=lambda f: int(f * 400_000), target=200_000, goal=204_000, floor_fraction=0.95)
    low = draw(PoolChart(chosen=0.60, chosen_pool=240_000, floor_gib=4.0, **base)).splitlines()
    high = draw(PoolChart(chosen=0.60, chosen_pool=340_000, floor_gib=4.0, **base)).splitlines()
    row = next(i for i, line in enumerate(low) if "O" in line.split("|", 1)[-1])
    assert next(i for i, line in enumerate(high) if "O" in line.split("|", 1)[-1]) < row


def _plan(units: Path, start_log: Path, *, isatty: bool, extra: tuple[str, ...] = ()) -> str:  # noqa: F811
    out = Output(stdout=io.StringIO(), stderr=io.StringIO(), isatty=isatty)
    argv = ["--units", str(units), "plan", "ct200", "--context", "200k", "--from-log", str(start_log), *extra]
    assert main(argv, out=out) == 0
    assert isinstance(out.stdout, io.StringIO)
    return out.stdout.getvalue()


def test_plan_draws_unicode_on_a_terminal_and_ascii_elsewhere(
    units: Path,  # noqa: F811
    start_log: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = _plan(units, start_log, isatty=True)
    assert UNICODE.chosen in tty and "KV pool (tokens) against --mem-fraction-static" in tty
    piped = _plan(units, start_log, isatty=False)
    assert (
        piped.split("KV pool (tokens)")[1].isascii()
        and "O chosen 0.929" in piped
        and "C running 0.850" in piped
    )
    monkeypatch.setenv("NO_COLOR", "1")
    assert _plan(units, start_log, isatty=True) == piped
    as_json = _plan(units, start_log, isatty=True, extra=("--json",))
    assert "KV pool" not in as_json and json.loads(as_json)["mem_fraction_static"] == 0.929


def test_the_docs_show_the_golden_chart() -> None:
    readme = (ROOT.parents[1] / "docs/commands.md").read_text(encoding="utf-8")
    assert (CHARTS / "ct200_200k_calibrated.ascii.txt").read_text(encoding="utf-8") in readme
