"""plan and render of a [pd] file at a context above the model's own (SGLang refuses the start unless
SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set, configs/model_config.py _derive_context_length): plan
names it before any decode's pool, render warns; and plan's --start N, which reads a log, is refused."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import EXAMPLE

OWN = 131072
DECODE = "flags = { tp-size = 1, max-running-requests = 8 }"


def _cli(units: Path, *argv: str) -> tuple[int, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*argv, "--units", str(units)], out)
    assert isinstance(out.stderr, io.StringIO)
    return code, out.stderr.getvalue()


def _units(tmp: Path, running: int, allow: bool) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8").replace(DECODE, DECODE.replace("= 8", f"= {running}"))
    if allow:
        text = text.replace(
            "[unit]\n", '[unit]\nenvironment = { SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN = "1" }\n'
        )
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "pd.toml").write_text(text, encoding="utf-8")
    return tmp


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=st.sampled_from([32768, OWN, OWN + 1, 200_000]), running=st.sampled_from([1, 8]),
       allow=st.booleans())  # fmt: skip
def test_a_context_above_the_models_own_is_said_first_unless_its_environment_allows_it(
    tmp_path: Path, context: int, running: int, allow: bool
) -> None:
    units = _units(tmp_path / f"{context}-{running}-{allow}", running, allow)
    above = context > OWN and not allow
    code, err = _cli(units, "plan", "pd", "--offline", "--context", str(context))
    if code == 2:  # a refusal: the context is its first word where SGLang refuses it
        assert ("above the model's own 131,072" in err.splitlines()[0]) == above, err
    code, err = _cli(units, "render", "pd", "--context", str(context))
    if code == 0:
        assert ("above the model's own 131,072" in err) == above, err


@pytest.mark.parametrize("start", ["1", "2"])
def test_plan_of_a_pd_file_refuses_start_n(tmp_path: Path, start: str) -> None:
    code, err = _cli(
        _units(tmp_path, 8, False), "plan", "pd", "--offline", "--context", "32k", "--start", start
    )
    assert code == 2 and "--start" in err, err
