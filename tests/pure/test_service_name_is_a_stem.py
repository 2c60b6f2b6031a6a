"""A service is named by its inventory file's stem: every command that names one answers a path to the file
(however spelled) with the stem to type, exit 2, before any host is reached."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import ROOT

COMMANDS = [
    ("plan", "--offline", "--context", "32k"),
    ("render", "--context", "32k"),
    ("apply", "--context", "32k", "--dry-run"),
    ("rollback", "--yes"),
    ("backups",),
    ("status",),
    ("facts",),
    ("adopt", "--ssh", "h"),
]
STEMS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)
FOLDERS = st.sampled_from(["", "units/", "./units/", "/etc/deployctl/units/", "../inv/", "units//"])


@settings(max_examples=60, deadline=None)
@given(command=st.sampled_from(COMMANDS), folder=FOLDERS, stem=STEMS)
def test_a_path_to_an_inventory_file_is_answered_with_its_stem(
    command: tuple[str, ...], folder: str, stem: str
) -> None:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    name, *rest = command
    code = main([name, f"{folder}{stem}.toml", *rest, "--units", str(ROOT / "units")], out)
    assert isinstance(out.stderr, io.StringIO)
    err = out.stderr.getvalue()
    assert code == 2 and f"its stem, {stem!r}" in err, (command, err)
