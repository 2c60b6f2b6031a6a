"""`apply --dry-run`, `status` and `rollback` of a [pd] service, against fake agents (one per unit): what is
asked of each unit, what is shown, and what is sent."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.output import Output
from agent.protocol.requests import ROUTER_KIND, Request
from tests.pure.test_pd import example, host_of

CHANGING = ("apply", "rollback", "recover", "signal")


class FakeAgent:
    """A unit's agent: its installed unit, its status and its backups; every request it got."""

    def __init__(self, installed: str, answers: dict[str, dict[str, Any]] | None = None) -> None:
        self.installed = installed
        self.answers = answers or {}
        self.asked: list[Request] = []

    def call(self, req: Request) -> dict[str, Any]:
        self.asked.append(req)
        assert req.verb not in CHANGING, f"{req.verb} sent to {req.unit}"
        if req.verb == "facts":
            return {"unit_text": self.installed}
        if req.verb == "compare":
            return {"up_to_date": req.unit_text == self.installed}
        return self.answers.get(req.verb, {})


def fake_clients(agents: Sequence[FakeAgent]) -> Any:
    @contextlib.contextmanager
    def clients(hosts: Sequence[HostConfig], _conn: Connection) -> Iterator[list[FakeAgent]]:
        assert len(hosts) == len(agents)
        yield list(agents)

    return clients


def output() -> Output:
    return Output(stdout=io.StringIO(), stderr=io.StringIO())


def said(out: Output) -> str:
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return out.stdout.getvalue() + out.stderr.getvalue()


# ---- apply --dry-run


def test_a_dry_run_shows_each_units_flag_changes_and_diff_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agent.group.pdapply as pdapply
    from agent.deploy import apply

    host = host_of(example())
    units = pdapply.planned_units(host, 32768)
    # the prefill's installed unit is the 16k one; the decode and the router are up to date
    old = pdapply.planned_units(host, 16384)[0].text
    agents = [FakeAgent(old), FakeAgent(units[1].text), FakeAgent(units[2].text)]
    monkeypatch.setattr(pdapply, "clients", fake_clients(agents))
    out = output()
    code = apply(Connection("pd"), Change(32768, dry_run=True), out, host)
    text = said(out)
    assert code == 0, text
    assert "prefill[0]" in text and "--context-length" in text and "16384" in text and "32768" in text
    assert "-    --context-length 16384" in text and "+    --context-length 32768" in text, text
    # the decode restarts after its prefill (sglang#13054): said, though its unit does not change
    assert "decode[0]" in text and "re-register" in text
    assert "dry run: nothing was changed" in text
    for agent in agents:  # facts and compare only: nothing changed, no transaction
        assert {r.verb for r in agent.asked} <= {"facts", "compare"}


def test_a_dry_run_with_nothing_to_change_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdapply as pdapply
    from agent.deploy import apply

    host = host_of(example())
    agents = [FakeAgent(u.text) for u in pdapply.planned_units(host, 32768)]
    monkeypatch.setattr(pdapply, "clients", fake_clients(agents))
    out = output()
    assert apply(Connection("pd"), Change(32768, dry_run=True), out, host) == 0
    assert "up to date" in said(out)


# ---- status


def state(active: str, sub: str) -> dict[str, Any]:
    return {"unit": "u", "load_state": "loaded", "active_state": active, "sub_state": sub,
            "invocation_id": "x", "need_daemon_reload": False, "n_restarts": 0, "exec_main_status": 0,
            "exec_main_code": 0, "fragment_path": ""}  # fmt: skip


def status_of(active: str, sub: str, pool: int | None = None) -> dict[str, Any]:
    last = {"ts": "2026-12-06T10:00:00Z", "message": "applied",
            "data": {"outcome": "applied", **({"kv_tokens": pool} if pool else {})}}  # fmt: skip
    return {"state": state(active, sub), "last_txn": "t1", "last_outcome": last}


def test_status_shows_each_roles_unit_its_pool_and_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.status as group_status
    from agent.deploy import status

    host = host_of(example())
    agents = [
        FakeAgent("", {"status": status_of("active", "running", 301_234)}),
        FakeAgent("", {"status": status_of("failed", "failed", 280_000)}),
        FakeAgent("", {"status": status_of("active", "running")}),
    ]
    monkeypatch.setattr(group_status, "clients", fake_clients(agents))
    monkeypatch.setattr("agent.deploy.load_service", lambda *_: host)
    out = output()
    assert status(Connection("pd"), out, follow_running=False) == 0
    text = said(out)
    lines = text.splitlines()
    prefill = next(line for line in lines if line.startswith("prefill[0]"))
    decode = next(line for line in lines if line.startswith("decode[0]"))
    router = next(line for line in lines if line.startswith("router"))
    assert "llama-pd-prefill-0.service" in prefill and "active/running" in prefill and "301,234" in prefill
    assert "failed/failed" in decode and "280,000" in decode
    assert "llama-pd-router.service" in router and "active/running" in router
    assert "WARNING" in text and "decode[0]" in text.split("WARNING")[1]  # a role down is said
    assert [r.verb for a in agents for r in a.asked] == ["status"] * 3
    assert agents[2].asked[0].port == 30000  # the router asked as its own unit


# ---- rollback


PREFILL = "llama-pd-prefill-0.service"
DECODE_BAK = "llama-pd-decode-0.service.bak.20261206T100000Z"


KEY = "20261206T120000Z-abcdef"  # the group change that took a backup


def backups_of(*rows: tuple[str, bool], key: str | None = KEY) -> dict[str, Any]:
    """A unit's listing: its installed flags and backups (taken by change `key`), flags as the example's."""
    flags = {"page-size": "16", "kv-cache-dtype": "auto"}
    return {"flags": flags,
            "backups": [{"name": n, "taken": n, "size": 1, "same_as_installed": same, "flags": flags,
                         "changes": [["context-length", 16384, 32768]] if not same else [],
                         **({"group": key} if key else {})}
                        for n, same in rows]}  # fmt: skip


def test_rollback_takes_each_unit_with_a_previous_unit_back_as_one_group_in_waves() -> None:
    from agent.group.pdrollback import chosen_backups, rollback_nodes

    host = host_of(example())
    listings = [
        backups_of((f"{PREFILL}.bak.20261206T120000Z", False), (f"{PREFILL}.bak.20261206T110000Z", True)),
        backups_of((DECODE_BAK, True)),  # the decode: none differs, yet it re-registers after the prefill
        backups_of(),  # the router: never changed
    ]
    picked = chosen_backups(host, listings)
    assert [(c.label, c.backup, c.why is not None) for c in picked] == [
        ("prefill[0]", f"{PREFILL}.bak.20261206T120000Z", True),
        ("decode[0]", DECODE_BAK, True),
    ]
    nodes, waves = rollback_nodes(host, picked, [object(), object(), object()])  # type: ignore[list-item]
    assert waves == (0, 1)
    for rank, node in enumerate(nodes):
        req = node.request
        assert req.verb == "rollback"
        assert req.group is not None and req.group.rank == rank and req.group.nnodes == 2
        assert req.group.collective is False and req.txn
    # each by name: the prefill that change's backup (its agent's default may be another change's), the
    # decode its copy
    assert (
        nodes[0].request.backup == f"{PREFILL}.bak.20261206T120000Z" and nodes[1].request.backup == DECODE_BAK
    )
    assert nodes[1].request.routed_url is not None  # the last wave proves the whole through the router


def test_rollback_includes_the_router_when_its_unit_changed_and_it_goes_last() -> None:
    from agent.group.pdrollback import chosen_backups, rollback_nodes

    host = host_of(example())
    listings = [
        backups_of(),
        backups_of(),
        backups_of(("llama-pd-router.service.bak.20261206T120000Z", False)),
    ]
    picked = chosen_backups(host, listings)
    assert [c.label for c in picked] == ["router"]
    nodes, waves = rollback_nodes(host, picked, [object()])  # type: ignore[list-item]
    assert waves == (0,) and nodes[0].request.kind == ROUTER_KIND


def test_rollback_with_no_previous_unit_anywhere_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdrollback as pdrollback
    from agent.errors import UsageError

    host = host_of(example())
    agents = [FakeAgent("", {"backups": backups_of(("x", True))}) for _ in range(3)]
    monkeypatch.setattr(pdrollback, "clients", fake_clients(agents))
    with pytest.raises(UsageError, match="no backup"):
        pdrollback.rollback(host, Connection("pd"), None, output(), yes=True)


def test_rollback_to_a_named_backup_is_refused_for_a_pd_service(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.deploy import rollback
    from agent.errors import UsageError

    monkeypatch.setattr("agent.deploy.load_service", lambda *_: host_of(example()))
    with pytest.raises(UsageError, match="--to"):
        rollback(Connection("pd"), "some-backup", output(), yes=True)


def test_a_rollback_may_run_as_a_member_of_a_group() -> None:
    """The agent refused it ("only apply runs as a node of a group"): every member of the first real [pd]
    rollback ended `the transaction never started on the host`."""
    from agent.protocol.requests import Group

    req = Request("rollback", txn="20261206T120000Z-abcdef", group=Group(0, 2, 60.0, collective=False))
    assert Request.from_json(req.to_json()).group == req.group  # validates


TXN_BACK = "20261206T130000Z-fedcba"


def rollback_follow(fakes: list[Any]) -> Any:
    """The member's rollback transaction on its fake host, its events to the coordinator."""
    from agent.protocol.events import Event

    def follow(node: Any, on_event: Any) -> object:
        fake = fakes[node.rank]
        fake.txn_dir(TXN_BACK).mkdir(parents=True, exist_ok=True)
        (fake.txn_dir(TXN_BACK) / "request.json").write_text(node.request.to_json())
        txn = fake.host.transaction(node.request, txn=TXN_BACK)
        txn.group_start_bound_s = 1.0
        txn.log.listeners.append(on_event)
        result = txn.rollback()
        on_event(Event(TXN_BACK, 99, "", "done", "outcome", result.message,
                       {"outcome": result.outcome.value, **result.data}))  # fmt: skip
        return None

    return follow


@pytest.mark.parametrize("old_decode_fails", [False, True])
def test_a_group_rollback_takes_every_unit_back_or_none(tmp_path: Any, old_decode_fails: bool) -> None:
    """After an applied change of prefill, decode and router, one group rollback (each member the agent's
    rollback verb, in waves) puts every unit back on its old unit; when the decode's old unit no longer
    starts, the group aborts and every unit stays on the new one (never a prefill old and a decode new)."""
    from agent.group.decide import group_outcome
    from agent.group.run import Coordinator, Node, converge
    from agent.protocol.events import Outcome
    from agent.protocol.requests import Group
    from tests.pure.test_group_change import fake_deliver, rollback, served
    from tests.pure.test_pd_group import NEW, OLD, ROLES, WAIT_S, pd_group, role_unit, run_waves

    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.APPLIED
    if old_decode_fails:
        fakes[1].host.script.crash.add(str(OLD))  # the decode's old unit now crashes at its start
    back = [
        Node(n.rank, n.host, None, replace(n.request, verb="rollback", unit_text=None, target_context=None,
                                           txn=TXN_BACK, group=Group(n.rank, 3, WAIT_S, collective=False)))
        for n in nodes
    ]  # fmt: skip
    Coordinator(back, lambda *_: None, deliver=fake_deliver(fakes), follow=rollback_follow(fakes),
                waves=(0, 1, 2)).run()  # fmt: skip
    outcome = group_outcome([n.view for n in back], converge(back, rollback(fakes)))
    expected = NEW if old_decode_fails else OLD
    assert outcome is (Outcome.ROLLED_BACK if old_decode_fails else Outcome.APPLIED)
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(expected, role), role


def test_a_group_rollback_judges_its_routed_completion_by_the_services_smoke_settings(tmp_path: Any) -> None:
    """A rollback has no smoke test of its own (the old unit served before), but the routed check of its
    last wave is sent with the service's [smoke]: a random-weight model's answer is noise, judged on usage
    alone (`expect` ""). It was judged against the default `expect` ("dog"), and the real 1P1D's rollback
    rolled back ("routed check through the router failed: expected 'dog'")."""
    from agent.group.decide import group_outcome
    from agent.group.run import Coordinator, Node, converge
    from agent.protocol.events import Outcome
    from agent.protocol.requests import Group, Smoke
    from tests.pure.test_group_change import fake_deliver, rollback, served
    from tests.pure.test_pd_group import NEW, OLD, ROLES, WAIT_S, pd_group, role_unit, run_waves

    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.APPLIED
    for fake in fakes:
        fake.host.probe.answer = "zq"  # a random-weight model's answer
    back = [
        Node(n.rank, n.host, None, replace(n.request, verb="rollback", unit_text=None, target_context=None,
                                           txn=TXN_BACK, group=Group(n.rank, 3, WAIT_S, collective=False),
                                           smoke=Smoke(expect="")))
        for n in nodes
    ]  # fmt: skip
    Coordinator(back, lambda *_: None, deliver=fake_deliver(fakes), follow=rollback_follow(fakes),
                waves=(0, 1, 2)).run()  # fmt: skip
    outcome = group_outcome([n.view for n in back], converge(back, rollback(fakes)))
    assert outcome is Outcome.APPLIED, [n.view.why for n in back]
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(OLD, role), role


class NoCoordinator:
    """The members' transactions already ended (each view holds its outcome): nothing to run."""

    def __init__(self, *_: object, **__: object) -> None:
        pass

    def run(self) -> None:
        pass


def ended_group(verb: str, outcome: Any) -> list[Any]:
    """The [pd] example's three members, each a `verb` transaction that ended with `outcome`."""
    from agent.group.decide import Rank
    from agent.group.pdstatus import parts
    from agent.group.run import Node

    units = [u for _, u in parts(host_of(example()))]
    return [Node(i, u, None, Request(verb), Rank(outcome=outcome)) for i, u in enumerate(units)]


@pytest.mark.parametrize("verb", ["apply", "rollback"])
def test_a_group_rollback_that_went_through_is_reported_as_a_rollback(
    monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """The first [pd] rollback's report said `== pd: APPLIED`: an apply's word for the undo of one. A
    rollback's report says RESTORED (the one-host rollback's message: `<unit> restored <backup>`), its exit
    code still 0; an apply's stays APPLIED."""
    import agent.group.pdapply as pdapply
    from agent.protocol.events import Outcome

    monkeypatch.setattr(pdapply, "Coordinator", NoCoordinator)
    out = output()
    code = pdapply.run_group(out, host_of(example()), ended_group(verb, Outcome.APPLIED), (0, 1, 2))
    header = next(ln for ln in said(out).splitlines() if ln.startswith("== "))
    assert code == 0
    if verb == "apply":
        assert header.startswith("== pd: APPLIED"), header
    else:
        assert "APPLIED" not in header and "RESTORED" in header and "one generation" in header, header


def test_a_group_rollback_that_was_undone_says_the_rollback_was_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rollback whose group aborted (every member back on the unit it had before the rollback) exits 3 as
    a rejected apply does, but its report says the rollback was rejected, not 'the change'."""
    import agent.group.pdapply as pdapply
    from agent.protocol.events import Outcome

    monkeypatch.setattr(pdapply, "Coordinator", NoCoordinator)
    out = output()
    members = ended_group("rollback", Outcome.ROLLED_BACK)
    code = pdapply.run_group(out, host_of(example()), members, (0, 1, 2))
    header = next(ln for ln in said(out).splitlines() if ln.startswith("== "))
    assert code == Outcome.ROLLED_BACK.exit_code
    assert "the rollback was rejected" in header and "the change was rejected" not in header, header
