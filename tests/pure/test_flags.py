"""The flags model: ExecStart <-> flags with systemd's quoting, and flag differences."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sglang.flags import (
    FlagChange,
    FlagsError,
    FlagValue,
    diff_flags,
    flag_table,
    format_exec_start,
    parse_exec_start,
    parse_unit_flags,
    quote_word,
    split_words,
)

PY = ["/usr/bin/python3", "-m", "sglang.launch_server"]

# Any text without control characters (categories Cc: C0, DEL, C1; Cs: lone surrogates).
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20)
NAMES = st.from_regex(r"[a-z0-9][a-z0-9-]{0,15}", fullmatch=True)
WORD = TEXT.filter(lambda w: not w.startswith("--"))
VALUES: st.SearchStrategy[FlagValue] = st.one_of(
    TEXT, st.just(True), st.lists(WORD, min_size=2, max_size=4).map(tuple)
)


@given(st.dictionaries(NAMES, VALUES, max_size=8), st.lists(TEXT.filter(bool), max_size=3))
def test_round_trip(flags: dict[str, FlagValue], args: list[str]) -> None:
    executable = ["/opt/sglang/bin/python", *args]
    head = [w for w in executable if not w.startswith("--")]
    if head != executable:
        return  # a word starting with -- belongs to the flags, by definition
    assert parse_exec_start(format_exec_start(executable, flags)) == (executable, flags)


@given(TEXT)
def test_any_word_reads_back(word: str) -> None:
    assert split_words(quote_word(word)) == [word]


@pytest.mark.parametrize(
    ("word", "written"),
    [
        ("plain", "plain"),
        ("0.94", "0.94"),
        ("", '""'),
        ("two words", '"two words"'),
        ("100%", "100%%"),
        ("%n", "%%n"),
        ("$HOME", '"$$HOME"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("it's", '"it\'s"'),
        (";", '";"'),
    ],
)
def test_quote_word(word: str, written: str) -> None:
    assert quote_word(word) == written


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a  b\tc", ["a", "b", "c"]),
        ("'single quoted' \"double quoted\"", ["single quoted", "double quoted"]),
        ('--x="a b"', ["--x=a b"]),
        (r'"tab\there" \x41 "\101" \u00e9', ["tab\there", "A", "A", "é"]),
        ("50%% $$HOME %i $VAR", ["50%", "$HOME", "%i", "$VAR"]),
        ("''", [""]),
    ],
)
def test_split_words_follows_systemd(text: str, words: list[str]) -> None:
    assert split_words(text) == words


@pytest.mark.parametrize("text", ['"unterminated', "ends with \\", "bad \\q escape"])
def test_split_words_refuses_what_systemd_refuses(text: str) -> None:
    with pytest.raises(FlagsError):
        split_words(text)


def test_parse_exec_start_reads_values_booleans_and_lists() -> None:
    text = (
        "-/usr/bin/python3 -m sglang.launch_server --model-path /m --trust-remote-code "
        "--chunked-prefill-size -1 --mem-fraction-static=0.9 --cuda-graph-bs 1 2 4 --enable-metrics"
    )
    executable, flags = parse_exec_start(text)
    assert executable == PY
    assert flags == {
        "model-path": "/m",
        "trust-remote-code": True,
        "chunked-prefill-size": "-1",
        "mem-fraction-static": "0.9",
        "cuda-graph-bs": ("1", "2", "4"),
        "enable-metrics": True,
    }


def test_value_starting_with_dashes_stays_in_its_word() -> None:
    text = format_exec_start(PY, {"extra": "--odd value"})
    assert text.endswith('"--extra=--odd value"')
    assert parse_exec_start(text)[1] == {"extra": "--odd value"}


def test_format_writes_numbers_and_leaves_out_false() -> None:
    text = format_exec_start(PY, {"tp-size": 8, "mem-fraction-static": 0.94, "a": True, "b": False})
    assert text == "/usr/bin/python3 -m sglang.launch_server --tp-size 8 --mem-fraction-static 0.94 --a"


def test_format_refuses_an_executable_with_a_prefix() -> None:
    with pytest.raises(FlagsError):
        format_exec_start(["-/usr/bin/python3"], {})


HAND_WRITTEN = """\
[Unit]
Description=written by hand
# ExecStart=/not/this --one

[Service]
Environment=A=1
ExecStart=/usr/bin/python3 -m sglang.launch_server \\
    --model-path "/models/with space" \\
# a comment inside the continued line is skipped, as systemd does
    --context-length 32768 \\
    --trust-remote-code
Restart=on-failure
"""


def test_parse_unit_flags_joins_continued_lines() -> None:
    assert parse_unit_flags(HAND_WRITTEN) == {
        "model-path": "/models/with space",
        "context-length": "32768",
        "trust-remote-code": True,
    }


def test_empty_exec_start_resets_and_two_are_refused() -> None:
    reset = "[Service]\nExecStart=/bin/old --a 1\nExecStart=\nExecStart=/bin/new --b 2\n"
    assert parse_unit_flags(reset) == {"b": "2"}
    with pytest.raises(FlagsError, match="one ExecStart"):
        parse_unit_flags("[Service]\nExecStart=/bin/a\nExecStart=/bin/b\n")
    with pytest.raises(FlagsError, match="one ExecStart"):
        parse_unit_flags("[Unit]\nExecStart=/bin/not-in-service\n")


def test_diff_flags_orders_removed_changed_then_added() -> None:
    before = {"tp-size": 8, "context-length": 32768, "mem-fraction-static": "0.85", "old": True}
    after = {"tp-size": "8", "context-length": "200000", "mem-fraction-static": 0.94, "new": True}
    assert diff_flags(before, after) == [
        FlagChange("context-length", "32768", "200000"),
        FlagChange("mem-fraction-static", "0.85", "0.94"),
        FlagChange("old", True, None),
        FlagChange("new", None, True),
    ]
    assert [c.kind for c in diff_flags(before, after)] == ["changed", "changed", "removed", "added"]
    assert diff_flags(after, after) == []


def test_flag_table() -> None:
    table = flag_table([FlagChange("context-length", "32768", "200000"), FlagChange("x", None, True)])
    assert table.splitlines() == [
        "flag             | before | after",
        "-----------------+--------+-------",
        "--context-length | 32768  | 200000",
        "--x              | -      | true",
    ]
