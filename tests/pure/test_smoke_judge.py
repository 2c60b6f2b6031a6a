"""The smoke test's verdict on a reply: the prompt arrived whole and an answer came; the expected word only
where one is set (a random-weight model, like the real SGLang's tiny test model, answers noise)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.errors import InventoryError
from agent.host.watch.probe import judge
from agent.inventory import HostConfig, load_host
from agent.remote.client import base_request

UNITS = Path(__file__).resolve().parents[2] / "units"

# A real reply of SGLang 0.5.23 serving the random-weight tiny model (tests/realsglang): noise.
NOISE = "ample\ufffdample\ufffdample\ufffdample\ufffd"


def test_random_weights_pass_on_usage_alone() -> None:
    assert judge("", words_sent=3700, tokens=4071, completion=8, answer=NOISE) == ""


def test_a_prompt_the_server_counted_short_fails_even_with_the_right_word() -> None:
    why = judge("dog", words_sent=3700, tokens=1500, completion=8, answer="dog")
    assert "under half the 3,700 words sent" in why


def test_no_generated_token_is_no_answer() -> None:
    assert judge("", words_sent=30, tokens=31, completion=0, answer="") == "no token was generated"


def test_the_expected_word_still_counts_for_real_models() -> None:
    assert judge("dog", words_sent=30, tokens=31, completion=2, answer="Dog.") == ""
    assert judge("dog", words_sent=30, tokens=31, completion=2, answer=NOISE) == "expected 'dog'"


def _host(tmp: Path, smoke: str) -> HostConfig:
    text = re.sub(r"^expect = .*$", "", (UNITS / "ct200-sim.toml").read_text(encoding="utf-8"), flags=re.M)
    (tmp / "h.toml").write_text(text.replace("[smoke]\n", f"[smoke]\n{smoke}\n"), encoding="utf-8")
    return load_host("h", tmp)


def test_an_inventory_says_random_weights_rather_than_a_blank_word(tmp_path: Path) -> None:
    """A blank `expect` stays refused (every answer contains ""); `random_weights` is how an inventory of a
    test model says "usage only", and only that sends the wire's empty word."""
    with pytest.raises(InventoryError, match=r"smoke\.expect"):
        _host(tmp_path, 'expect = ""')
    assert base_request(_host(tmp_path, "random_weights = true"), "status").smoke.expect == ""
    assert base_request(_host(tmp_path, 'expect = "cat"'), "status").smoke.expect == "cat"
