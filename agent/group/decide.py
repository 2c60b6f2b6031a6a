"""Pure: a multi-node change's next step, from what each node's transaction has said so far.

Every node stops, and none starts before every rank has stopped ("go"): a rank started early would join
the other ranks' old servers at the same rendezvous port. Every node then votes; the group commits only
when every rank is ready (rank 0's votes last: its gate includes /health and the smoke test, which need
every rank up). Anything else aborts every rank. A node that kept the new unit while another went back is
rolled back too, once the abort stands at every other rank: the group converges on all new or all old,
never a mix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from agent.protocol.events import Outcome
from agent.protocol.groupmachine import Answer


class Vote(str, Enum):
    """How far a node's transaction has got, from its events."""

    STARTED = "started"  # sent, not stopped yet (writing, draining, stopping)
    STOPPED = "stopped"  # stopped, waiting for "go"
    READY = "ready"  # its start passed its gate: waiting for the decision
    FAILED = "failed"  # its start failed (it rolls itself back)


@dataclass(frozen=True)
class Rank:
    vote: Vote = Vote.STARTED
    outcome: Outcome | None = None  # its transaction ended
    lost: bool = False  # no contact: the follow gave up re-attaching
    back: bool = False  # rolling back: it stopped its new server and waits to start its old one
    why: str = ""  # a failed vote's reason, or the outcome's message


class Step(str, Enum):
    WAIT = "wait"
    GO = "go"
    COMMIT = "commit"
    ABORT = "abort"
    GO_BACK = "go-back"  # every rank that rolls back has stopped its new server: start the old ones
    DONE = "done"


@dataclass(frozen=True)
class Next:
    step: Step
    reason: str = ""


def next_step(ranks: Sequence[Rank], went: bool, decided: Step | None, went_back: bool = False) -> Next:
    """went: "go" was sent; decided: COMMIT or ABORT once sent; went_back: "go-back" was sent."""
    if decided is not None:
        if all(r.outcome is not None or r.lost for r in ranks):
            return Next(Step.DONE)
        # a rank out of reach, or one that kept its new unit, may run its new server: no old start may meet it
        stopped = all(r.back or r.outcome not in (None, Outcome.APPLIED) for r in ranks)
        if decided is Step.ABORT and not went_back and stopped:
            return Next(Step.GO_BACK)
        return Next(Step.WAIT)
    for n, r in enumerate(ranks):
        why = _why_not(r)
        if why is not None:
            return Next(Step.ABORT, f"rank {n} {why}")
    votes = {r.vote for r in ranks}
    if not went and votes <= {Vote.STOPPED, Vote.READY}:
        return Next(Step.GO)
    if votes == {Vote.READY}:
        return Next(Step.COMMIT)
    return Next(Step.WAIT)


def next_wave(ranks: Sequence[Rank], waves: Sequence[int], sent: int) -> int | None:
    """Started in waves (a [pd] service: its prefills, then its decodes, then its router): the wave whose
    "go" is due once next_step says GO, or None while a wave before it is still starting. A wave goes only
    once every rank of the waves before it voted ready: a decode started before its prefill serves would
    register with the old one, and Mooncake keeps that pair failed until the decode re-registers
    (sglang#13054)."""
    if not waves or sent > max(waves):
        return None
    earlier = [r for r, w in zip(ranks, waves, strict=True) if w < sent]
    return sent if all(r.vote is Vote.READY for r in earlier) else None


def _why_not(r: Rank) -> str | None:
    """Why this rank stops the group, or None."""
    if r.lost:
        return "cannot be reached (it rolls itself back when no decision comes)"
    if r.vote is Vote.FAILED:
        return f"failed: {r.why}" if r.why else "failed"
    if r.back:  # its agent died and the next one stopped its new server (host/roles/grouprecovery.py)
        return "stopped its new server to roll back (its agent died mid-change)"
    if r.outcome is not None:  # ended before the group decided: refused, locked, or the agent died
        return f"ended without a decision ({r.outcome.value}): {r.why}"
    return None


# A rank that lost its peers fails because another one did: torch's words for it (gloo's closed pair,
# the rendezvous store's timeouts). Such a failure is a consequence, not the cause.
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "DistStoreError", "DistNetworkError")


def first_cause(ranks: Sequence[Rank]) -> tuple[int, str] | None:
    """The rank whose failure rolled the group back, and why: a rank that failed on its own rather than
    one that lost its peers (in a lockstep start every rank dies when one does)."""
    failed = [(n, r.why) for n, r in enumerate(ranks) if r.vote is Vote.FAILED or r.lost]
    own = [(n, why) for n, why in failed if not any(word in why for word in PEER_LOST)]
    return (own or failed)[0] if failed else None


def to_roll_back(ranks: Sequence[Rank]) -> tuple[int, ...]:
    """Once every transaction ended: the rank that kept the new unit while another did not. None while a
    rank is out of reach: whether the commit reached it is unknown, and a rank restarted alone would meet
    the others' servers of another generation (the report says the group is in doubt). None either when
    several ranks kept it: rolled back one by one, the first one's old start would meet the others' new
    servers at the rendezvous (the report says so; an apply of the old settings restarts them together)."""
    if any(r.lost for r in ranks):
        return ()
    kept = tuple(n for n, r in enumerate(ranks) if r.outcome is Outcome.APPLIED)
    return kept if len(kept) == 1 < len(ranks) else ()


def one_side(ranks: Sequence[Rank]) -> bool:
    """Every rank kept the new unit, or none did: nothing is left to converge."""
    kept = [r.outcome is Outcome.APPLIED for r in ranks]
    return all(kept) or not any(kept)


def to_revoke(ranks: Sequence[Rank]) -> tuple[int, ...]:
    """Before any rank is rolled back: every other rank, in order, whose decision must stand at abort. A
    rank in doubt may hold the commit (a word that reached it after it stopped), or be told it later; its
    next recovery would then start its new unit against the others' old ones. The coordinator claims the
    abort there first (first writer wins): a rank in doubt is never a side to converge toward."""
    kept = to_roll_back(ranks)
    return tuple(n for n in range(len(ranks)) if n not in kept) if kept else ()


def may_roll_back(answers: Sequence[Answer]) -> bool:
    """Whether the abort claimed at the ranks of to_revoke lets the kept ranks be rolled back: it stands
    there (or the rank never ran the change: nothing to recover). A commit that stands, or no answer,
    leaves every rank as it is (the group is reported in doubt; its next apply takes it to one side)."""
    return all(a in (Answer.TOOK, Answer.ABORTED, Answer.UNKNOWN) for a in answers)


def group_outcome(ranks: Sequence[Rank], converged: bool) -> Outcome:
    """The group's outcome: applied only when every rank applied; rolled back when every rank is back on
    its old unit (converged: the ranks that had kept the new one were rolled back too)."""
    outcomes = [r.outcome for r in ranks]
    if all(o is Outcome.APPLIED for o in outcomes):
        return Outcome.APPLIED
    if any(r.lost for r in ranks) or Outcome.ROLLBACK_FAILED in outcomes or not converged:
        return Outcome.ROLLBACK_FAILED
    if all(o in (Outcome.ERROR, Outcome.LOCKED) for o in outcomes):
        return Outcome.ERROR  # refused everywhere before anything was changed
    return Outcome.ROLLED_BACK
