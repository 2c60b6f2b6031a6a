"""The single-host change's decider (agent/host/change/next_step.py), over every combination of
observations."""

from __future__ import annotations

import itertools

from agent.host.change.next_step import Observed, Seen, Step, after_group, next_step
from agent.protocol.groupmachine import Phase

ALL = [Observed(watch, verify) for watch, verify in itertools.product(Seen, Seen)]


def test_every_observation_has_one_next_step() -> None:
    for seen in ALL:
        assert isinstance(next_step(seen), Step)


def test_nothing_happens_before_the_restart_and_its_watch() -> None:
    for seen in ALL:
        if seen.watch is Seen.NOT_YET:
            assert next_step(seen) is Step.RESTART


def test_a_failed_watch_rolls_back_whatever_else_was_seen() -> None:
    for seen in ALL:
        if seen.watch is Seen.FAILED:
            assert next_step(seen) is Step.ROLL_BACK


def test_a_ready_unit_is_verified_before_anything_else() -> None:
    assert next_step(Observed(Seen.PASSED, Seen.NOT_YET)) is Step.VERIFY


def test_only_a_verified_unit_is_committed() -> None:
    for seen in ALL:
        committed = next_step(seen) is Step.COMMIT
        assert committed == (seen.watch is Seen.PASSED and seen.verify is Seen.PASSED)


def test_a_failed_verification_rolls_back() -> None:
    assert next_step(Observed(Seen.PASSED, Seen.FAILED)) is Step.ROLL_BACK


def test_the_driver_ends_in_at_most_three_steps() -> None:
    """Following the decider from nothing seen, whatever each step observes, ends in commit or roll back
    after restart, verify and one ending: never a loop, never a step twice."""
    for watch, verify in itertools.product((Seen.PASSED, Seen.FAILED), repeat=2):
        seen, steps = Observed(), []
        while (step := next_step(seen)) not in (Step.COMMIT, Step.ROLL_BACK):
            assert step not in steps and len(steps) < 3
            steps.append(step)
            seen = Observed(watch, seen.verify) if step is Step.RESTART else Observed(seen.watch, verify)
        assert steps[0] is Step.RESTART
        assert (step is Step.COMMIT) == (watch is Seen.PASSED and verify is Seen.PASSED)


def test_a_groups_node_ends_as_the_group_machine_ended() -> None:
    """Every phase of the group machine names one ending: only COMMITTED keeps the new unit, only IN_DOUBT
    stays stopped, everything else rolls back."""
    for phase in Phase:
        step = after_group(phase)
        assert (step is Step.COMMIT) == (phase is Phase.COMMITTED)
        assert (step is Step.STAY_STOPPED) == (phase is Phase.IN_DOUBT)
        assert step in (Step.COMMIT, Step.STAY_STOPPED, Step.ROLL_BACK)
