"""The README and docs/ say what the code does: every command shown parses, every link resolves, the
inventory reference is the inventory's own models."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agent.cli.main import COMMANDS, build_parser
from tests import docgen

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def shown_commands() -> list[tuple[str, str]]:
    """(page, command line) for every `deployctl ...` line inside a code block, comments and pipes cut."""
    found = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                words = line.strip()
                if not words.startswith("deployctl "):
                    continue
                words = re.split(r"\s+#\s", words)[0]  # a comment after the command
                words = re.split(r"\s[|>]\s?", words)[0]  # a pipe or a redirection
                found.append((page.name, words))
    return found


COMMAND_LINES = shown_commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMAND_LINES) >= 20
    assert {line.split()[1] for _, line in COMMAND_LINES} >= set(COMMANDS)


@pytest.mark.parametrize(("page", "line"), COMMAND_LINES, ids=[f"{p}:{c}" for p, c in COMMAND_LINES])
def test_every_command_shown_parses(page: str, line: str) -> None:
    argv = shlex.split(line)[1:]
    args = build_parser().parse_args(argv)
    assert args.command in COMMANDS, f"{page}: {line}"


def test_every_link_resolves() -> None:
    for page in PAGES:
        for target, _ in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    linked = set(LINK.findall("\n".join(lines)))
    assert {target for target, _ in linked} >= {f"docs/{p.name}" for p in PAGES[1:]}, (
        "every page under docs/ is linked from the README"
    )


def test_the_inventory_reference_is_generated_from_the_models() -> None:
    text = docgen.DOC.read_text(encoding="utf-8")
    assert docgen.table() in text, "docs/inventory.md is out of date: run python -m tests.docgen"


def test_every_inventory_key_has_a_meaning() -> None:
    empty = [row for row in docgen.rows() if row.rstrip().endswith("|  |")]
    assert not empty, empty
