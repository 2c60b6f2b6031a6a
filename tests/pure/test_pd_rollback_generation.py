"""A [pd] rollback takes the service back to ONE generation: the units as they were before the newest
group change that changed any (its backups, every other unit as installed), never each unit's newest
backup on its own; and a set SGLang would refuse (page size, KV dtype differing) is refused before any
host is sent anything. The agent records which group change took each backup."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import InventoryError, UsageError
from agent.group.pdrollback import chosen_backups
from tests.pure.test_pd import example, host_of

HOST = host_of(example())
UNITS = ("llama-pd-prefill-0.service", "llama-pd-decode-0.service", "llama-pd-router.service")
Flags = dict[str, str]


def role(page: str, dtype: str, running: str) -> Flags:
    return {"page-size": page, "kv-cache-dtype": dtype, "max-running-requests": running}


@dataclass
class Service:
    """The units' flags as installed, and each unit's backups (newest first) as its agent keeps them."""

    units: list[Flags]
    backups: list[list[tuple[str, str, Flags]]] = field(default_factory=lambda: [[], [], []])  # name, key
    applies: int = 0

    def apply(self, new: list[Flags], ok: bool) -> None:
        """One group change: each unit it restarts is backed up under its key (a decode restarts too when a
        prefill does: it re-registers); an aborted change leaves every unit as it was."""
        self.applies += 1
        key = f"20261206T{self.applies:06d}Z-abcdef"
        restart = [i for i in range(3) if new[i] != self.units[i]]
        if 0 in restart and 1 not in restart:
            restart.append(1)
        for i in restart:
            self.backups[i].insert(0, (f"{UNITS[i]}.bak.{self.applies:04d}", key, dict(self.units[i])))
        if ok:
            self.units = [dict(u) for u in new]

    def listings(self) -> list[dict[str, Any]]:
        return [
            {"flags": self.units[i], "backups": [
                {"name": n, "taken": n, "size": 1, "same_as_installed": f == self.units[i], "changes": [],
                 "flags": f, "group": k} for n, k, f in self.backups[i]]}
            for i in range(3)
        ]  # fmt: skip


def after(service: Service, picked: list[Any]) -> list[Flags]:
    """Each unit as the rollback leaves it."""
    by_name = {n: f for rows in service.backups for n, _, f in rows}
    got = [dict(u) for u in service.units]
    for c in picked:
        got[c.index] = by_name[c.backup]
    return got


def test_the_review_case_goes_back_one_change_not_each_units_newest_backup() -> None:
    """Apply 1 set page 16 on both roles, apply 2 the decode's concurrency only: the rollback undoes apply 2
    (the decode back to 8, the prefill left at 16), never the prefill to page 1 beside a decode at 16."""
    s = Service([role("1", "auto", "8"), role("1", "auto", "8"), {"policy": "random"}])
    s.apply([role("16", "auto", "8"), role("16", "auto", "8"), s.units[2]], ok=True)
    s.apply([role("16", "auto", "8"), role("16", "auto", "16"), s.units[2]], ok=True)
    picked = chosen_backups(HOST, s.listings())  # type: ignore[arg-type]
    assert [c.label for c in picked] == ["decode[0]"]
    assert after(s, picked) == [role("16", "auto", "8"), role("16", "auto", "8"), {"policy": "random"}]


def test_a_set_whose_page_sizes_differ_is_refused_naming_its_units() -> None:
    """Units installed by hand with differing page sizes, then one apply that made them agree: going back
    to that generation is refused, in one line naming the units, before anything is sent."""
    s = Service([role("1", "auto", "8"), role("16", "auto", "8"), {"policy": "random"}])
    s.apply([role("16", "auto", "8"), role("16", "auto", "8"), s.units[2]], ok=True)
    with pytest.raises(InventoryError) as refused:
        chosen_backups(HOST, s.listings())  # type: ignore[arg-type]
    said = str(refused.value)
    assert "\n" not in said and "--page-size differs" in said, said
    assert UNITS[0] in said and UNITS[1] in said, said


def test_backups_no_group_change_took_are_refused() -> None:
    s = Service([role("1", "auto", "8"), role("1", "auto", "8"), {}])
    s.apply([role("16", "auto", "8"), role("16", "auto", "8"), {}], ok=True)
    listings = s.listings()
    for listing in listings:
        for row in listing["backups"]:
            del row["group"]
    with pytest.raises(UsageError, match="no backup"):
        chosen_backups(HOST, listings)  # type: ignore[arg-type]


configs = st.builds(
    lambda page, dtype, p_run, d_run, policy: [
        role(page, dtype, p_run),
        role(page, dtype, d_run),
        {"policy": policy},
    ],
    st.sampled_from(["1", "16", "64"]),
    st.sampled_from(["auto", "fp8_e4m3"]),
    st.sampled_from(["8", "16"]),
    st.sampled_from(["8", "16"]),
    st.sampled_from(["random", "cache_aware"]),
)


@settings(max_examples=200, deadline=None)
@given(
    first=configs,
    by_hand=st.sampled_from([None, "page-size", "kv-cache-dtype"]),
    history=st.lists(st.tuples(configs, st.booleans()), min_size=1, max_size=6),
)
def test_a_rollback_picks_the_generation_before_the_last_change_and_never_a_mixed_one(
    first: list[Flags], by_hand: str | None, history: list[tuple[list[Flags], bool]]
) -> None:
    """Over generated apply histories (some aborted; the first units maybe hand-made with differing flags):
    the rollback leaves every unit as it was before the newest change that changed one, or is refused
    (that set differs in page size or KV dtype, or no change changed anything); never a mixed set."""
    if by_hand:
        first = [first[0], {**first[1], by_hand: "32" if by_hand == "page-size" else "fp8_e5m2"}, first[2]]
    s = Service(first)
    before: list[Flags] | None = None
    for new, ok in history:
        was = [dict(u) for u in s.units]
        s.apply(new, ok)
        if ok and s.units != was:
            before = was
    try:
        picked = chosen_backups(HOST, s.listings())  # type: ignore[arg-type]
    except InventoryError:
        assert before is not None and any(
            before[0][f] != before[1][f] for f in ("page-size", "kv-cache-dtype")
        )
        return
    except UsageError:
        assert before is None
        return
    assert before is not None and after(s, picked) == before
    assert all(before[0][f] == before[1][f] for f in ("page-size", "kv-cache-dtype"))


def test_a_group_members_backup_names_its_change_and_its_flags(tmp_path: Path) -> None:
    """On the agent: a member of a group change records the group's key with the backup it took; the
    backups verb answers it with each backup's flags and the installed unit's, which the rollback reads."""
    from agent.host import verbs
    from tests.pure.test_pd_group import NEW, OLD, pd_group, run_waves

    key = "20261206T120000Z-abcdef"
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    nodes = [replace(n, request=replace(n.request, group=replace(n.request.group, key=key))) for n in nodes]
    run_waves(nodes, fakes)
    for node in nodes[:2]:
        answer = verbs.backups(replace(node.request, verb="backups", group=None, txn=None))
        newest = answer["backups"][0]
        assert newest.get("group") == key and not newest["same_as_installed"]
        assert newest["flags"] is not None and newest["flags"].get("context-length") == str(OLD)
        assert answer["flags"] is not None and answer["flags"].get("context-length") == str(NEW)


def test_a_group_change_that_rolled_back_leaves_no_generation_to_go_back_to(tmp_path: Path) -> None:
    """On fake hosts: a group change whose decode fails rolls every unit back; the backups it took are
    copies of the units installed again, so a rollback finds no generation (it would restart the failed
    change's units otherwise)."""
    from agent.group.decide import group_outcome
    from agent.group.run import converge
    from agent.host import verbs
    from agent.protocol.events import Outcome
    from tests.pure.test_group_change import rollback
    from tests.pure.test_pd_group import BROKEN, NEW, pd_group, run_waves

    key = "20261206T120000Z-abcdef"
    nodes, fakes = pd_group(tmp_path, [NEW, BROKEN, NEW])
    nodes = [replace(n, request=replace(n.request, group=replace(n.request.group, key=key))) for n in nodes]
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.ROLLED_BACK
    listings = [verbs.backups(replace(n.request, verb="backups", group=None, txn=None)) for n in nodes]
    keyed = [r for listing in listings for r in listing["backups"] if r.get("group") == key]
    assert keyed and all(r["same_as_installed"] for r in keyed)
    with pytest.raises(UsageError, match="no backup"):
        chosen_backups(HOST, listings)
