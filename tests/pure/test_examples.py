"""Every example command in README.md, docs/ and each command's --help runs, or at least parses.

The examples a newcomer can run with nothing but this checkout (the shipped units/ and examples/: `plan`
with --offline, --from-log or --facts, `render`, `parse-log FILE`) are run in-process from the repository
root and must exit 0 (or NOT_FEASIBLE where the example shows a plan that cannot fit). The others need a
host over SSH (apply, rollback, status, backups, adopt, facts, fleet, plan without --offline): their
arguments are checked with the real parser only, so a renamed or removed option in an example fails here.
"""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest

from agent.cli.main import COMMANDS, build_parser, main, refuse_unknown_options
from agent.exitcodes import ExitCode
from agent.output import Output

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _command(line: str) -> list[str]:
    """The words after `deployctl`, without the comment, a redirection or a pipe that follows."""
    text = re.split(r"\s#\s|\s{2,}\(|\s[>|]\s", line.strip() + " ", maxsplit=1)[0]
    return shlex.split(text)[1:]


def page_examples() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text(encoding="utf-8")):
            for line in block.splitlines():
                if line.startswith("deployctl "):
                    found.append((f"{page.name}: {line.strip()[:60]}", _command(line)))
    return found


def help_examples() -> list[tuple[str, list[str]]]:
    found = []
    for name in COMMANDS:
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "command").choices[name]  # type: ignore[attr-defined]
        texts = [sub.epilog or ""]
        texts += [
            p.epilog or "" for a in sub._actions if a.dest == "fleet_command" for p in a.choices.values()
        ]  # type: ignore[union-attr]
        for text in texts:
            for m in re.finditer(r"example: (deployctl [^\n]*)", text):
                found.append((f"{name} --help: {m[1][:60]}", _command(m[1])))
    return found


EXAMPLES = page_examples() + help_examples()
# Examples that show a plan which cannot fit, on purpose: plan prints it and exits NOT_FEASIBLE.
NOT_FEASIBLE = {("plan", "ct200", "--context", "400k", "--set", "kv-cache-dtype=fp8_e4m3", "--offline")}


def runs_offline(argv: list[str]) -> bool:
    """Whether the example needs nothing but this checkout."""
    if argv[:1] == ["render"]:
        return True
    if argv[:1] == ["parse-log"]:
        return "-" not in argv[1:] and len(argv) > 1
    return argv[:1] == ["plan"] and any(a in argv for a in ("--offline", "--from-log", "--facts"))


def test_the_examples_are_found() -> None:
    assert len(page_examples()) >= 30 and len(help_examples()) >= 15
    assert sum(runs_offline(argv) for _, argv in EXAMPLES) >= 10


@pytest.mark.parametrize(("where", "argv"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_every_example_runs_or_parses(where: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("DEPLOYCTL_UNITS", raising=False)
    if not runs_offline(argv):  # needs a host over SSH: its arguments only
        parser = build_parser()
        refuse_unknown_options(parser, argv)
        parser.parse_args(argv)
        return
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(argv, out)
    assert isinstance(out.stderr, io.StringIO)
    expected = ExitCode.NOT_FEASIBLE if tuple(argv) in NOT_FEASIBLE else ExitCode.OK
    assert code == expected, f"{where}: exit {code}: {out.stderr.getvalue()}"
