"""The plan's flags line is one shell line: pasted, the shell gives back the very flags the plan prints."""

from __future__ import annotations

import io
import shlex

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_unset_fraction_set import FACTS

OVERRIDE = '{"max_position_embeddings": 131072}'


def flags_line(*argv: str) -> str:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    main(["plan", "--facts", str(FACTS), "--context", "128k", *argv], out)
    assert isinstance(out.stdout, io.StringIO)
    line = next(x for x in out.stdout.getvalue().splitlines() if x.startswith("  flags "))
    return line.removeprefix("  flags").strip()


def test_a_json_override_in_the_flags_line_reads_back_as_one_word() -> None:
    line = flags_line("--set", f"json-model-override-args={OVERRIDE}", "--set", "disable-cuda-graph=true")
    words = shlex.split(line)
    assert words[:3] == ["--json-model-override-args", OVERRIDE, "--disable-cuda-graph"], line
    assert words[3:] == ["--mem-fraction-static", "0.830", "--context-length", "128000"], line


def test_a_secret_stays_hidden_and_the_line_still_reads_back() -> None:
    words = shlex.split(flags_line("--set", "api-key=s3cret word"))
    assert "s3cret" not in " ".join(words) and words[0] == "--api-key" and len(words) == 6, words
