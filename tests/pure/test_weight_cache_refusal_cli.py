"""`plan` and `render` refuse what the weight-cache daemon cannot serve as `apply` does: the one refusal
(agent/apply.py refuse_weight_cache), one line, exit 2; and the plan's restart note reads as a sentence."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output

UNITS = Path(__file__).resolve().parents[2] / "units"


def cached_units(tmp_path: Path) -> Path:
    """ct200-sim (a DFLASH draft) with [weight_cache] on."""
    text = (UNITS / "ct200-sim.toml").read_text()
    assert "[draft]" in text
    (tmp_path / "ct200-sim.toml").write_text(text + "\n[weight_cache]\nenabled = true\n")
    return tmp_path


def run(units: Path, argv: list[str]) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO(), isatty=False, stdin_isatty=False)
    code = main(["--units", str(units), *argv], out)
    return code, out.stdout.getvalue(), out.stderr.getvalue()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "argv",
    [["plan", "ct200-sim", "--context", "100k", "--offline"], ["render", "ct200-sim", "--context", "100k"]],
    ids=["plan", "render"],
)
def test_plan_and_render_refuse_a_speculative_service_with_the_weight_cache(
    tmp_path: Path, argv: list[str]
) -> None:
    code, stdout, stderr = run(cached_units(tmp_path), argv)
    assert code == ExitCode.USAGE and stdout == "", stdout
    errors = [line for line in stderr.splitlines() if line.startswith("deployctl: error:")]
    assert len(errors) == 1 and "[weight_cache] enabled cannot serve" in errors[0], stderr
    assert "speculative decoding" in errors[0]
