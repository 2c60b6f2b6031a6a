"""The README documents what the code does: its exit-code table is ExitCode, row for row; docs/commands.md
shows every command."""

from __future__ import annotations

from pathlib import Path

from agent.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]


def section(title: str, page: str = "README.md") -> list[str]:
    """The lines of one `## title` section of a page (the README, or one under docs/)."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def table_rows(lines: list[str]) -> list[list[str]]:
    """The body rows of the first markdown table in lines, cells stripped of spaces and backticks."""
    rows = [line for line in lines if line.startswith("|")]
    cells = [[c.strip().strip("`") for c in row.strip("|").split("|")] for row in rows]
    assert cells[0] == ["code", "name", "meaning"]
    assert set("".join(cells[1])) <= set("-: ")  # the separator row
    return cells[2:]


def test_exit_code_table_is_exitcode() -> None:
    rows = table_rows(section("Exit codes"))
    assert [(int(code), name) for code, name, _ in rows] == [(int(c), c.name) for c in ExitCode]
    assert all(meaning for _, _, meaning in rows)


def test_every_command_has_an_example() -> None:
    from agent.cli.main import COMMANDS

    text = "\n".join((ROOT / "docs/commands.md").read_text(encoding="utf-8").splitlines())
    assert all(f"deployctl {name} " in text for name in COMMANDS)
