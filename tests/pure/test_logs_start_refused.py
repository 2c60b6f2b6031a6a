"""A start SGLang refused while reading its arguments (argparse, or an exception of its argument checks:
srt/server_args.py and the srt/arg_groups/ hooks, e.g. pd_disaggregation_hook.py:190-196) is a start
refusal with SGLang's message as its fix, never a scheduler's exception: no scheduler ran."""

from __future__ import annotations

import pytest

from agent.sglang.logs import events as ev
from agent.sglang.logs.fixes import fix_for
from agent.sglang.logs.summary import SummaryBuilder

SITE = "/opt/sglang/.venv/lib/python3.11/site-packages/sglang"
ROLE_SWITCH = (
    "--enable-pd-role-switch does not rebuild role-specific state for the following features: expert "
    "parallelism (--ep-size 4). Remove these options or drop --enable-pd-role-switch."
)
FRAMES = {  # the frames of a traceback that ends in one of SGLang's argument checks
    "hook": [f'  File "{SITE}/srt/arg_groups/pd_disaggregation_hook.py", line 192, in handle_pd',
             "    raise ValueError("],
    "server_args": [f'  File "{SITE}/launch_server.py", line 11, in <module>',
                    f'  File "{SITE}/srt/server_args.py", line 6120, in prepare_server_args',
                    '  File "<string>", line 412, in __init__',
                    f'  File "{SITE}/srt/server_args.py", line 830, in __post_init__'],
    "deeper": [f'  File "{SITE}/srt/server_args.py", line 830, in __post_init__',
               f'  File "{SITE}/srt/arg_groups/pipeline.py", line 88, in run',
               '  File "/usr/lib/transformers/configuration_utils.py", line 9, in get'],
}  # fmt: skip


def summary_of(lines: list[str]) -> tuple[str, str, str | None]:
    builder = SummaryBuilder()
    for line in lines:
        builder.feed(line)
    failure = builder.summary().failure
    assert failure is not None
    return failure.failure_kind, failure.line, fix_for(failure.failure_kind, failure.line)


@pytest.mark.parametrize("frames", FRAMES.values(), ids=FRAMES.keys())
@pytest.mark.parametrize("exc", ["ValueError", "AssertionError", "RuntimeError"])
@pytest.mark.parametrize("prefix", ["", "[2026-12-06 10:00:00] "])
def test_an_exception_of_the_argument_checks_is_a_start_refusal(
    frames: list[str], exc: str, prefix: str
) -> None:
    lines = [f"{prefix}Traceback (most recent call last):", *frames, f"{exc}: {ROLE_SWITCH}"]
    kind, line, fixed = summary_of(lines)
    assert kind == ev.START_REFUSED and line.endswith(ROLE_SWITCH), (kind, line)
    assert kind not in ev.GENERIC_FAILURE_KINDS  # final: a start watcher waits for no later line
    assert fixed is not None and ROLE_SWITCH.rstrip(".") in fixed and exc not in fixed, fixed


@pytest.mark.parametrize(
    ("line", "said"),
    [("sglang serve: error: unrecognized arguments: --bogus", "unrecognized arguments: --bogus"),
     ("launch_server.py: error: argument --tp-size: invalid int value: 'x'",
      "argument --tp-size: invalid int value: 'x'")],
)  # fmt: skip
def test_argparses_refusal_is_the_same_kind_with_its_text_as_the_fix(line: str, said: str) -> None:
    kind, _, fixed = summary_of([line])
    assert kind == ev.START_REFUSED and fixed is not None and said in fixed and "error:" not in fixed


@pytest.mark.parametrize(
    "head",
    ["Traceback (most recent call last):", "[2026-12-06 10:00:00 TP0] Scheduler hit an exception: Traceback "
     "(most recent call last):"],
)  # fmt: skip
def test_a_schedulers_exception_stays_one(head: str) -> None:
    """A scheduler's traceback (its frames elsewhere; or one that passes through server_args.py, logged as a
    scheduler's), and any traceback once weights loaded, is not a start refusal."""
    scheduler = [head, f'  File "{SITE}/srt/managers/scheduler.py", line 2630, in run_scheduler_process',
                 "ValueError: boom"]  # fmt: skip
    assert summary_of(scheduler)[0] == ev.SCHEDULER_EXCEPTION
    through = [head, f'  File "{SITE}/srt/server_args.py", line 9, in get_x', "ValueError: boom"]
    expected = ev.SCHEDULER_EXCEPTION if "hit an exception" in head else ev.START_REFUSED
    assert summary_of(through)[0] == expected
    loaded = ["[2026-12-06 10:00:00 TP0] Load weight begin. avail mem=70.00 GB", *through]
    assert summary_of(loaded)[0] == ev.SCHEDULER_EXCEPTION


def test_the_flag_ends_with_its_traceback() -> None:
    """An exception line after the refused traceback's end, with no frame of its own, is not a refusal."""
    lines = ["Traceback (most recent call last):", *FRAMES["hook"], f"ValueError: {ROLE_SWITCH}"]
    builder = SummaryBuilder()
    for line in [*lines, "Traceback (most recent call last):", '  File "/x/y.py", line 1, in z',
                 "KeyError: 'a'"]:  # fmt: skip
        builder.feed(line)
    failure = builder.summary().failure
    assert failure is not None and failure.failure_kind == ev.START_REFUSED  # the first cause kept
