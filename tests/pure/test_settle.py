"""Before a commit with [weight_cache] (host/change/settle.py): a daemon that crashed under the checks is
waited for, and the start that was verified is kept only if it still runs; a new start is watched again."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from agent.host.change.settle import Seen, Settled, settle, verdict

ACTIVE = ["active", "activating", "reloading", "deactivating", "inactive", "failed"]
SUBS = ["running", "auto-restart", "start", "dead"]
VERIFIED, NEW = "a" * 32, "b" * 32

looks = st.builds(
    Seen,
    st.sampled_from(ACTIVE),
    st.sampled_from(SUBS),
    st.sampled_from(ACTIVE),
    st.sampled_from([VERIFIED, NEW]),
)


@given(looks)
def test_a_start_is_kept_only_while_it_runs_beside_a_running_daemon(seen: Seen) -> None:
    daemon_up = seen.daemon_active in ("active", "reloading") and seen.daemon_sub != "auto-restart"
    found = verdict(seen, VERIFIED)
    if found is Settled.KEPT:
        assert daemon_up and seen.engine_invocation == VERIFIED
        assert seen.engine_active in ("active", "reloading")
    elif found is Settled.RESTARTED:
        assert daemon_up and seen.engine_invocation == NEW and seen.engine_active != "inactive"
    else:
        assert found is None  # not yet: never a commit of a start that is not running
        runs = seen.engine_active in ("active", "reloading")
        assert (
            not daemon_up
            or (seen.engine_invocation == VERIFIED and not runs)
            or not (runs or (seen.engine_invocation == NEW and seen.engine_active == "activating"))
        )


def _script(*seen: Seen) -> Iterator[Seen]:
    yield from seen
    while True:
        yield seen[-1]


def test_a_daemon_back_from_its_crash_that_restarted_the_engine_sends_the_new_start_to_be_watched() -> None:
    script = _script(
        Seen("activating", "auto-restart", "active", VERIFIED),  # killed: waiting for RestartSec
        Seen("activating", "start", "inactive", VERIFIED),  # its restart stopped the engine (PartOf=)
        Seen("active", "running", "inactive", VERIFIED),  # up; the engine's start not begun yet
        Seen("active", "running", "activating", NEW),
    )
    assert settle(lambda: next(script), VERIFIED, daemon_s=5.0, engine_s=5.0) is Settled.RESTARTED


def test_a_running_pair_is_kept_at_the_first_look() -> None:
    calls: list[int] = []

    def look() -> Seen:
        calls.append(1)
        return Seen("active", "running", "active", VERIFIED)

    assert settle(look, VERIFIED, daemon_s=5.0) is Settled.KEPT
    assert len(calls) == 2  # one look for the daemon, one for the engine: nothing waited


def test_a_daemon_that_stays_down_is_said() -> None:
    look = _script(Seen("activating", "auto-restart", "active", VERIFIED))
    assert settle(lambda: next(look), VERIFIED, daemon_s=0.2) is Settled.DAEMON_DOWN


def test_an_engine_left_stopped_with_its_daemon_is_said() -> None:
    look = _script(Seen("active", "running", "inactive", VERIFIED))
    assert settle(lambda: next(look), VERIFIED, daemon_s=1.0, engine_s=0.2) is Settled.ENGINE_DOWN
