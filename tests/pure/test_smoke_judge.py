"""The smoke test's verdict on a reply: the prompt arrived whole and an answer came; the expected word only
where one is set (a random-weight model, like the real SGLang's tiny test model, answers noise)."""

from __future__ import annotations

from agent.host.probe import judge

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
