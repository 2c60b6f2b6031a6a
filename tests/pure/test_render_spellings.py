"""A flag the unit renders once, whatever spelling the inventory gives it and whatever spelling replaces it:
SGLang's argparse stores the aliases in one field and runs whichever comes last."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import RenderError
from agent.inventory import HostConfig, load_host
from agent.render import effective_flags, render_unit, template_dir
from tests.pure.test_review39_findings import LLAMA70_TOML


def _host(tmp_path: Path, toml: str) -> HostConfig:
    (tmp_path / "l70.toml").write_text(toml, encoding="utf-8")
    return load_host("l70", tmp_path)


def test_an_alias_of_model_path_in_the_flags_is_the_only_model_rendered(tmp_path: Path) -> None:
    toml = LLAMA70_TOML.replace("tp-size = 8", 'tp-size = 8\nmodel = "/models/Llama-3.1-70B"')
    flags = effective_flags(_host(tmp_path, toml), {})
    assert "model-path" not in flags and flags["model"] == "/models/Llama-3.1-70B"


def test_an_alias_of_model_path_that_names_another_model_is_refused(tmp_path: Path) -> None:
    toml = LLAMA70_TOML.replace("tp-size = 8", 'tp-size = 8\nmodel = "/models/other"')
    with pytest.raises(RenderError, match=r"sglang\.flags\.model: must be the same as model\.path"):
        render_unit(_host(tmp_path, toml), {}, template_dir())
