"""One node's transaction in a multi-node change, with fake systemd and the coordinator's signals as files:
stop, wait for "go", start, vote, then commit or roll back as the group decided, or by itself in time."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.change.transaction import Transaction
from agent.host.roles.groupsignal import Signals
from agent.protocol.events import Event, Outcome
from agent.protocol.groupmachine import Decision
from agent.protocol.requests import Group, Request
from tests.pure.txnfakes import TXN, Host, Script, unit_text

OLD, NEW, BROKEN = 100_000, 200_000, 300_000
WAIT_S = 0.4  # how long the node waits for a signal before it rolls itself back


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))


def node_unit(context: int, rank: int) -> str:
    return unit_text(context).replace(
        f"--context-length {context}", f"--context-length {context} --nnodes 2 --node-rank {rank}"
    )


def node_request(host: Host, context: int, rank: int) -> Request:
    req = host.request(context, unit_text=node_unit(context, rank), group=Group(rank, 2, WAIT_S))
    return replace(req, drain=rank == 0)


def on_vote(txn: Transaction, vote: str, then: Callable[[Signals], object]) -> Signals:
    """What the coordinator does when this node's `vote` event ("stopped", "ready") is logged."""
    signals = Signals(Path(txn.req.state_dir) / "txn" / TXN)

    def hear(event: Event) -> None:
        if event.data.get("vote") == vote:
            then(signals)

    txn.log.listeners.append(hear)
    return signals


def coordinator(txn: Transaction, decision: Decision | None) -> Signals:
    """ "go" once the node stopped, then `decision` once it voted ready (None: never a word)."""
    signals = on_vote(txn, "stopped", Signals.go)
    on_vote(txn, "stopped_back", lambda s: s.for_rollback().go())  # every rank stopped to roll back
    if decision is not None:
        on_vote(txn, "ready", lambda s: s.claim(decision, "rank 1 failed: OOM", "deployctl"))
    return signals


@pytest.mark.parametrize("rank", [0, 1])
def test_a_node_starts_only_after_go_and_keeps_the_new_unit_on_commit(host: Host, rank: int) -> None:
    host.install(host.etc, node_unit(OLD, rank))
    txn = host.transaction(node_request(host, NEW, rank))
    coordinator(txn, Decision.COMMIT)
    result = txn.apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert host.systemd.loaded == node_unit(NEW, rank) and host.systemd.active == "active"
    assert (host.systemd.stops, host.systemd.starts, host.systemd.restarts) == (1, 1, 0)


def test_a_rank_above_0_is_ready_on_its_pool_line_and_never_asked_over_http(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    coordinator(txn, Decision.COMMIT)
    assert txn.apply().outcome is Outcome.APPLIED
    assert host.probe.asked == []  # its /health is a placeholder's: 200 whatever the group does


def test_the_group_s_abort_rolls_a_healthy_node_back_and_says_why(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    coordinator(txn, Decision.ABORT)
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK
    assert "rank 1 failed: OOM" in result.message
    assert host.systemd.loaded == node_unit(OLD, 0) and host.systemd.active == "active"


def test_rank_0_with_no_go_in_time_rolls_back_at_once_without_ever_starting_the_new_unit(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    result = txn.apply()  # no coordinator: it never says go
    assert result.outcome is Outcome.ROLLED_BACK
    assert "no start signal" in result.message
    # rank 0's files are the group's commit point: no rank took "go", so its old unit starts at once
    assert host.systemd.starts == 1 and host.systemd.loaded == node_unit(OLD, 0)
    assert any("no rank took go: starting rank 0's old unit" in e.message for e in txn.events)
    assert host.systemd.active == "active"


def test_rank_1_with_no_go_in_time_never_starts_a_generation_alone(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    result = txn.apply()  # no coordinator: no go, no go-back
    # rank 0 may have taken "go" and run its new server: an old rank 1 must not meet it; it stays stopped
    assert result.outcome is Outcome.ROLLBACK_FAILED and "stays stopped" in result.message
    assert host.systemd.starts == 0 and host.systemd.loaded == node_unit(OLD, 1)


def test_no_decision_in_time_rolls_back_and_a_late_commit_is_told_so(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    signals = coordinator(txn, None)
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK and "no decision" in result.message
    late = signals.claim(Decision.COMMIT, "", "deployctl")  # the coordinator comes back too late
    assert (late.decision, late.by) == (Decision.ABORT, "node")


def test_a_node_whose_start_fails_claims_the_abort_so_no_commit_can_win_it(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, BROKEN, 1))
    signals = coordinator(txn, None)
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK
    stands = signals.decided()
    assert stands is not None and stands.decision is Decision.ABORT and stands.by == "node"
    assert "rank 1" in stands.reason


def test_an_unchanged_node_still_restarts_with_the_group_and_its_rollback_keeps_its_unit(host: Host) -> None:
    host.install(host.etc, node_unit(NEW, 1))  # this rank already runs the new unit; another rank does not
    txn = host.transaction(node_request(host, NEW, 1))
    coordinator(txn, Decision.ABORT)
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK
    assert host.systemd.starts == 2  # it restarted with the group, then with the group's rollback
    assert host.systemd.loaded == node_unit(NEW, 1) and host.systemd.active == "active"


def test_the_first_claim_wins_and_later_ones_read_it(tmp_path: Path) -> None:
    signals = Signals(tmp_path / "txn")
    first = signals.claim(Decision.COMMIT, "", "deployctl")
    second = signals.claim(Decision.ABORT, "timeout", "node")
    assert first == second and second.decision is Decision.COMMIT and second.by == "deployctl"
    assert list((tmp_path / "txn").iterdir()) == [tmp_path / "txn" / "group-decision"]  # no temp file left


def test_rank_0_whose_server_dies_while_it_waits_rolls_back_at_once_and_claims_the_abort(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    on_vote(txn, "stopped", Signals.go)
    on_vote(txn, "stopped_back", lambda s: s.for_rollback().go())

    def peer_gone(s: Signals) -> None:  # node 1 went away: this rank's process exits (gloo)
        host.systemd.active, host.systemd.sub = "failed", "failed"

    signals = on_vote(txn, "ready", peer_gone)
    txn.req = replace(txn.req, group=Group(0, 2, 60.0))  # it must not wait its whole minute
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK and "server stopped" in result.message
    stands = signals.decided()
    assert stands is not None and (stands.decision, stands.by) == (Decision.ABORT, "node")
    assert host.systemd.loaded == node_unit(OLD, 0) and host.systemd.active == "active"


def test_rank_1_whose_server_dies_before_any_word_stops_and_claims_nothing(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    on_vote(txn, "stopped", Signals.go)

    def peer_gone(s: Signals) -> None:  # rank 0 went away: committed or not, this rank cannot know
        host.systemd.active, host.systemd.sub = "failed", "failed"

    signals = on_vote(txn, "ready", peer_gone)
    result = txn.apply()
    assert result.outcome is Outcome.ROLLBACK_FAILED and "in doubt" in result.message
    assert signals.decided() is None  # rank 0's word decides; the next run takes this rank there
    assert host.systemd.active != "active"  # stopped: no Restart= into another generation


def test_a_rolling_back_node_starts_its_old_unit_only_once_every_rank_stopped(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    coordinator(txn, Decision.ABORT)
    txn.apply()
    said = [(e.data.get("vote"), e.message) for e in txn.events if e.stage == "group"]
    back = next(i for i, (vote, _) in enumerate(said) if vote == "stopped_back")
    assert said[back + 1][1] == "every rank stopped: starting rank 0's old unit"


def test_processes_a_stop_left_behind_are_killed_before_the_new_start(host: Host) -> None:
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    coordinator(txn, Decision.COMMIT)
    host.systemd.left = [4242]  # systemd's final kill failed: a scheduler is still in the group
    assert txn.apply().outcome is Outcome.APPLIED
    assert host.systemd.killed == [9] and host.systemd.left == []
    assert any("1 process(es) left after the stop (4242)" in e.message for e in txn.events)


def test_a_node_aborted_before_its_start_does_not_vote_failed(host: Host) -> None:
    """Another rank failed while this one still waited for "go": the abort is the group's word, so this
    node must not look like the rank that failed (the report names the one that did)."""
    host.install(host.etc, node_unit(OLD, 0))
    txn = host.transaction(node_request(host, NEW, 0))
    on_vote(txn, "stopped", lambda s: s.claim(Decision.ABORT, "rank 1 failed: OOM", "deployctl"))
    on_vote(txn, "stopped_back", lambda s: s.for_rollback().go())
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK and "rank 1 failed: OOM" in result.message
    assert not [e for e in txn.events if e.data.get("vote") == "failed"]
    assert host.systemd.starts == 1 and host.systemd.loaded == node_unit(OLD, 0)


def test_recovering_an_earlier_change_under_a_group_request_never_waits_on_this_changes_barrier(
    host: Host,
) -> None:
    from agent.host.change.record import PHASE_RESTARTED, Record
    from agent.host.state import StateDir
    from agent.protocol import unit_sha256

    host.install(host.etc, node_unit(NEW, 1))  # an earlier change's agent died after its restart
    (host.etc / "sglang.service.bak.20261201T000000Z").write_text(node_unit(OLD, 1))
    StateDir(str(host.root / "state")).save_record(
        Record("20261201T000000Z-earlier", "sglang.service", PHASE_RESTARTED,
               "sglang.service.bak.20261201T000000Z", unit_sha256(node_unit(NEW, 1)))
    )  # fmt: skip
    txn = host.transaction(node_request(host, NEW, 1))
    signals = on_vote(txn, "stopped", Signals.go)
    on_vote(txn, "ready", lambda s: s.claim(Decision.COMMIT, "", "deployctl"))
    result = txn.apply()
    # the restore only stopped the server: no "stopped_back" vote into this change, no wait for a go-back
    assert not any(e.data.get("vote") == "stopped_back" for e in txn.events)
    assert result.outcome is Outcome.APPLIED and signals.decided() is not None


def test_a_node_still_starting_when_the_group_aborts_stops_at_once_and_does_not_vote_failed(
    host: Host,
) -> None:
    """Rank 0 failed while rank 1's start still waited at the rendezvous: rank 1 stops at once (the group
    machine's step) instead of waiting out a start that cannot complete, so rank 0, waiting for every
    rank's stop before its old unit starts, gets its "go-back" in time."""
    hangs = 250_000  # a start that logs nothing: it waits for a rank 0 that has gone
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, hangs, 1))
    txn.req = replace(txn.req, group=Group(1, 2, 60.0))  # it must not wait out its start's minutes
    signals = on_vote(txn, "stopped", Signals.go)
    on_vote(txn, "stopped_back", lambda s: s.for_rollback().go())

    def rank_0_failed(event: Event) -> None:
        if event.message == "every rank stopped: starting rank 1":
            signals.claim(Decision.ABORT, "rank 0 failed: the service stopped", "deployctl")

    txn.log.listeners.append(rank_0_failed)
    result = txn.apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert "the group rolled back while rank 1 started (rank 0 failed" in result.message
    assert result.data.get("failure_kind") == "abandoned"
    assert not [e for e in txn.events if e.data.get("vote") == "failed"]
    assert host.systemd.loaded == node_unit(OLD, 1) and host.systemd.active == "active"


EARLIER = "20261201T000000Z-earlier"


def agent_died_mid_change(host: Host, rank: int, go_age_s: float | None) -> Signals:
    """An earlier group change's agent died after its new server started: its record, its request (with the
    group), the new unit running, its "go" taken `go_age_s` ago (None: never)."""
    import os
    import time

    from agent.host.change.folder import write_request
    from agent.host.change.record import PHASE_RESTARTED, Record
    from agent.host.state import StateDir
    from agent.protocol import unit_sha256
    from agent.protocol.requests import Timeouts

    host.install(host.etc, node_unit(NEW, rank))
    host.systemd.start("sglang.service", 5.0)
    (host.etc / "sglang.service.bak.20261201T000000Z").write_text(node_unit(OLD, rank))
    state = StateDir(str(host.root / "state"))
    state.save_record(
        Record(EARLIER, "sglang.service", PHASE_RESTARTED,
               "sglang.service.bak.20261201T000000Z", unit_sha256(node_unit(NEW, rank)))
    )  # fmt: skip
    real = Timeouts(weights_s=60, pool_s=60, ready_s=60, no_progress_s=60)  # as a request.json holds them
    write_request(state, replace(node_request(host, NEW, rank), timeouts=real), EARLIER)
    signals = Signals(state.txn_dir(EARLIER))
    if go_age_s is not None:
        signals.go()
        then = time.time() - go_age_s
        os.utime(signals.folder / "group-go", (then, then))
    return signals


def recover_verb(host: Host, died: str | None = EARLIER) -> tuple[Transaction, Outcome, str]:
    """The `recover` run: by default the one the dead runner's follower starts for its coordinator."""
    req = replace(host.request(NEW), verb="recover", died=died)
    txn = host.transaction(req, txn="20261201T000100Z-recover")
    result = txn.recover_only()
    return txn, result.outcome, result.message


def test_a_group_node_whose_agent_died_never_starts_its_old_unit_alone(host: Host) -> None:
    """Recovery follows the group machine: no word, no go-back: stopped, old unit file back, in doubt (a
    one-host recovery restarted the old unit at once, which could meet its peers' new servers)."""
    signals = agent_died_mid_change(host, 1, go_age_s=1e6)
    starts = host.systemd.starts
    txn, outcome, message = recover_verb(host)
    assert outcome is Outcome.ROLLBACK_FAILED and "in doubt" in message, message
    assert host.systemd.loaded == node_unit(OLD, 1) and host.systemd.active != "active"
    assert host.systemd.starts == starts and host.systemd.restarts == 0
    stands = signals.decided()
    assert stands is not None and (stands.decision, stands.by) == (Decision.ABORT, "node")
    assert any(e.data.get("vote") == "stopped_back" for e in txn.events)


def test_a_recovered_group_node_starts_its_old_unit_on_go_back(host: Host) -> None:
    signals = agent_died_mid_change(host, 1, go_age_s=1e6)
    signals.for_rollback().go()  # every rank has stopped its new server
    _, outcome, message = recover_verb(host)
    assert outcome is Outcome.ROLLED_BACK, message
    assert host.systemd.loaded == node_unit(OLD, 1) and host.systemd.active == "active"


def test_a_recovered_group_node_keeps_the_new_unit_the_group_committed(host: Host) -> None:
    signals = agent_died_mid_change(host, 1, go_age_s=10.0)
    signals.claim(Decision.COMMIT, "", "deployctl")
    starts = host.systemd.starts
    _, outcome, message = recover_verb(host)
    assert outcome is Outcome.APPLIED, message
    assert host.systemd.loaded == node_unit(NEW, 1) and host.systemd.active == "active"
    assert host.systemd.starts == starts and host.systemd.restarts == 0  # nothing restarted


def test_rank_0_recovered_after_its_peers_deadline_keeps_the_new_unit_they_took_for_committed(
    host: Host,
) -> None:
    signals = agent_died_mid_change(host, 0, go_age_s=1e6)
    _, outcome, message = recover_verb(host)
    assert outcome is Outcome.APPLIED, message
    stands = signals.decided()
    assert stands is not None and (stands.decision, stands.by) == (Decision.COMMIT, "node")
    assert host.systemd.loaded == node_unit(NEW, 0) and host.systemd.active == "active"


def test_a_later_runs_recovery_of_a_node_in_doubt_does_not_wait_for_a_go_back_nobody_sends(
    host: Host,
) -> None:
    """The laptop died after "go"; both ranks ended in doubt. The next `apply` recovers each node first:
    only the dead change's coordinator could send its go-back, so the node stops with its old unit file at
    once (the change's horizon is hours here) and the new change starts it with its peers."""
    import time

    from agent.host.change.orphans import orphaned

    signals = agent_died_mid_change(host, 1, go_age_s=5.0)
    state = Path(host.request(NEW).state_dir)
    (state / "txn" / EARLIER / "events.jsonl").write_text('{"kind": "outcome"}\n')  # ended in doubt
    (state / "units" / "sglang.service" / "last_txn.json").write_text(json.dumps({"txn": EARLIER}))
    assert orphaned(host.request(NEW), lambda: None)  # a group node's record: the next run recovers it
    t0 = time.monotonic()
    _, outcome, message = recover_verb(host, died=None)
    assert time.monotonic() - t0 < 30 and outcome is Outcome.ROLLBACK_FAILED and "in doubt" in message
    assert host.systemd.loaded == node_unit(OLD, 1) and host.systemd.active != "active"
    assert signals.decided() is not None


def test_a_watch_that_ends_short_of_ready_without_a_reason_votes_failed_not_ready(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's vote follows the one decider (host/change/next_step.py next_step): only a READY watch that
    # verified votes ready. Was: a watch that ended at POOL_OK with no reason fell through to a "ready" vote.
    from agent.host.change.decide import Action, Verdict
    from agent.host.roles import groupstep
    from agent.host.watch.start import WatchResult

    real = groupstep.restart_and_watch

    def short(*args: object, **kwargs: object) -> WatchResult:
        real(*args, **kwargs)  # type: ignore[arg-type]
        return WatchResult(Verdict(Action.POOL_OK), {"kv_tokens": 210_000}, 1.0)

    monkeypatch.setattr(groupstep, "restart_and_watch", short)
    host.install(host.etc, node_unit(OLD, 1))
    txn = host.transaction(node_request(host, NEW, 1))
    votes: list[str] = []
    txn.log.listeners.append(lambda e: votes.append(str(e.data["vote"])) if "vote" in e.data else None)
    signals = coordinator(txn, Decision.COMMIT)
    result = txn.apply()
    assert "ready" not in votes and "failed" in votes
    assert result.outcome is Outcome.ROLLED_BACK
    stands = signals.decided()
    assert stands is not None and stands.decision is Decision.ABORT and "not ready" in stands.reason


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("group.json", "{not json"),
        ("group.json", '{"version": 2, "rank": 1, "wait_s": 60, "start_bound_s": 600}'),
        ("request.json", "{not json"),  # a folder an agent wrote before it kept a group record
    ],
)
def test_an_unreadable_group_record_is_refused_never_recovered_as_one_host(
    host: Host, path: str, text: str
) -> None:
    """A group node whose change's request could not be read was recovered as a one-host change: its old
    unit restarted alone, into its peers' new servers. It is refused: nothing changed, the record kept."""
    from agent.host.state import StateDir

    agent_died_mid_change(host, 1, go_age_s=1e6)
    folder = host.root / "state" / "txn" / EARLIER
    if path == "request.json":
        (folder / "group.json").unlink()
    (folder / path).write_text(text)
    before = (host.systemd.loaded, host.systemd.active, host.systemd.starts, host.systemd.stops)
    _, outcome, message = recover_verb(host)
    assert (
        outcome is Outcome.ERROR
        and f"{folder / path} is unreadable" in message
        and "nothing changed" in message
    )
    assert (host.systemd.loaded, host.systemd.active, host.systemd.starts, host.systemd.stops) == before
    assert StateDir(str(host.root / "state")).load_record("sglang.service") is not None  # kept for a person
    assert Signals(folder).decided() is None  # no claim either


def test_the_group_record_is_written_before_the_request_and_read_back(tmp_path: Path) -> None:
    from agent.host.change.folder import write_request
    from agent.host.state import StateDir
    from agent.protocol.grouprecord import GroupRecord
    from agent.protocol.requests import Timeouts

    host = Host(tmp_path, Script())
    state = StateDir(str(tmp_path / "state"))
    real = Timeouts(weights_s=60, pool_s=60, ready_s=60, no_progress_s=60)  # as a request.json holds them
    req = replace(node_request(host, NEW, 2), group=Group(2, 3, 45.0), timeouts=real)
    write_request(state, req, EARLIER)
    assert GroupRecord.read(state.txn_dir(EARLIER)) == GroupRecord.of(req)
    write_request(state, replace(req, group=None), TXN)  # one host: no group record, and read as none
    assert not (state.txn_dir(TXN) / "group.json").exists() and GroupRecord.read(state.txn_dir(TXN)) is None


@given(st.dictionaries(st.sampled_from(["version", "rank", "wait_s", "start_bound_s", "x"]),
                       st.one_of(st.integers(-2, 3), st.floats(allow_nan=True), st.booleans(), st.none(),
                                 st.text(max_size=3))))  # fmt: skip
def test_a_group_record_is_read_only_when_whole(body: dict[str, object]) -> None:
    """Any other content is refused (ValueError), never taken for a group node of another rank."""
    from agent.protocol.grouprecord import GroupRecord

    try:
        record = GroupRecord.from_json(json.dumps(body))
    except ValueError:
        return
    assert set(body) == {"version", "rank", "wait_s", "start_bound_s"} and body["version"] == 1
    assert record.rank == body["rank"] and record.rank >= 0 and record.wait_s > 0 and record.start_bound_s > 0
    assert GroupRecord.from_json(record.to_json()) == record
