"""A [pd] role's values are checked by the rules of [sglang.flags] and [unit], named by the role's key path:
every bad value of every field, on either role, is refused as the file loads (exit 2, nothing sent)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import EXAMPLE

PREFILL = "flags = { tp-size = 1, chunked-prefill-size = 8192 }"
DECODE = "flags = { tp-size = 1, max-running-requests = 8 }"
# (the TOML the role's table gains, the key path and the words the refusal must say)
BAD = [
    ("flags.page-size", "0", ">= 1"),
    ("flags.page-size", "-16", ">= 1"),
    ("flags.tp-size", "0", ">= 1"),
    ("flags.max-running-requests", '"eight"', "eight"),
    ("flags.max-running-requests", "0", ">= 1"),
    ("flags.context-length", '"long"', "long"),
    ("flags.nnodes", "2", "[nodes]"),
    ("url", '"http://gpu-pd:99999"', "1..65535"),
    ("url", '"http://gpu-pd:0"', "1..65535"),
    ("url", '"http://gpu-pd:65536/x"', "1..65535"),
    ("environment", '{ "A B" = "1" }', "variable name"),
    ("environment", '{ "1X" = "1" }', "variable name"),
    ("environment", '{ "A=B" = "1" }', "variable name"),
]


def _with(role: str, key: str, value: str) -> str:
    text = EXAMPLE.read_text(encoding="utf-8")
    old = PREFILL if role == "prefill" else DECODE
    name = key.removeprefix("flags.")
    if name == key:
        new = f"{key} = {value}\n{old}"
    elif f" {name} = " in old:  # the role sets it: its value replaced
        new = re.sub(rf" {name} = [^,}}]+", f" {name} = {value}", old)
    else:
        new = old.replace(" }", f", {name} = {value} }}")
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("command", [["plan", "pd", "--offline"], ["render", "pd"]])
def test_a_roles_bad_value_is_refused_by_its_key(
    tmp_path: Path, role: str, bad: tuple[str, str, str], command: list[str]
) -> None:
    key, value, said = bad
    (tmp_path / "pd.toml").write_text(_with(role, key, value), encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*command, "--context", "32k", "--units", str(tmp_path)], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    err = out.stderr.getvalue()
    assert code == 2 and out.stdout.getvalue() == ""
    head = f"pd.{role}.0.{key.split('.')[0]}"
    assert head in err and said in err, err
