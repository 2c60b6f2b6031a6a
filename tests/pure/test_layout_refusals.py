"""The layouts SGLang 0.5.23 refuses (server_args.py compute_world_size, arg_groups/parallel_hook.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.plan.refusals import _layout

SIZES = st.sampled_from([1, 2, 3, 4, 8, 16])


@given(SIZES, SIZES, SIZES, SIZES)
def test_replicas_need_dp_tp_pp_gpus(tp: int, pp: int, dp: int, gpus: int) -> None:
    found = _layout({"tp-size": tp, "pp-size": pp, "dp-size": dp}, gpus)
    assert bool(found) == (dp * tp * pp > gpus), found


@given(SIZES, SIZES)
def test_attention_dp_adds_no_gpus_and_must_divide_tp(tp: int, attn_dp: int) -> None:
    for flags in (
        {"tp-size": tp, "attn-dp-size": attn_dp},
        {"tp-size": tp, "dp-size": attn_dp, "enable-dp-attention": True},
    ):
        found = _layout(flags, tp)  # type: ignore[arg-type]
        assert bool(found) == (tp % attn_dp != 0), (flags, found)


def test_replicas_with_attention_dp_are_refused() -> None:
    assert _layout({"tp-size": 4, "attn-dp-size": 2, "dp-size": 2}, 8)


@given(SIZES, SIZES, st.sampled_from(["tp-size", "tensor-parallel-size", "tp"]))
def test_one_reading_of_the_layout_every_spelling_sglangs_default(tp: int, pp: int, spelling: str) -> None:
    from agent.plan.effective import world

    assert world({spelling: tp, "pipeline-parallel-size": pp}) == (tp, pp)
    assert world({}) == (1, 1)  # server_args.py: tp_size and pp_size default to 1; the unit renders none
    assert bool(_layout({spelling: tp}, tp)) is False
