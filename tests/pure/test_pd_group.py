"""A [pd] service's change as one group, with fakes: the coordinator (group/run.py) drives a real host
transaction per unit (fake systemd and journal, txnfakes.py) in waves: the prefills, then the decodes, then
the router. Each unit's start is gated on its own pool; a failure of any role rolls every unit back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import InventoryError
from agent.group.decide import Rank, Vote, group_outcome, next_wave
from agent.group.pdapply import planned_units, request_of
from agent.group.run import Coordinator, Node, converge
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.output import Output
from agent.pd.group import Part, Seen, members
from agent.protocol.events import Event, Outcome
from agent.protocol.requests import ROUTER_KIND, Group, Smoke
from tests.pure.test_group_change import FakeNode, fake_deliver, fake_follow, rollback, served
from tests.pure.txnfakes import TXN, UNIT, Host, Script, unit_text

OLD, NEW, BROKEN = 100_000, 200_000, 300_000
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 5.0
ROLES = ("prefill", "decode", "router")


def role_unit(context: int, role: str) -> str:
    """A role's unit; the router's is sglang-router's (it logs no pool: its /health is its readiness), and
    its "context" only tells the fakes' script whether its start crashes (BROKEN) or runs."""
    if role == "router":
        argv = (
            f"/usr/bin/python3 -m sglang_router.launch_router --request-timeout-secs {context} --port 30000"
        )
        return f"[Unit]\nDescription=router\n\n[Service]\nExecStart={argv} --pd-disaggregation\n"
    return unit_text(context).replace("--model-path /m", f"--model-path /m --disaggregation-mode {role}")


def pd_group(tmp_path: Path, news: list[int]) -> tuple[list[Node], list[FakeNode]]:
    """One fake host per unit (prefill, decode, router-as-unit), each installed with its old unit."""
    fakes, nodes = [], []
    for rank, (role, new) in enumerate(zip(ROLES, news, strict=True)):
        host = Host(tmp_path / role, Script(pools={"100000": 110_000, "200000": 210_000}, crash={"300000"}))
        host.install(host.etc, role_unit(OLD, role))
        req = host.request(new, unit_text=role_unit(new, role))
        req = replace(req, txn=TXN, group=Group(rank, len(news), WAIT_S), drain=False)
        if role == "router":
            req = replace(req, kind=ROUTER_KIND, smoke=Smoke())
        fakes.append(FakeNode(host))
        nodes.append(Node(rank, HostConfig.model_construct(name=role), None, req))
    return nodes, fakes


def run_waves(nodes: list[Node], fakes: list[FakeNode]) -> list[tuple[str, str]]:
    """Run the group in waves (0, 1, 2); what each unit said of its start and its vote, in order."""
    said: list[tuple[str, str]] = []
    lock = threading.Lock()

    def hear(node: Node, event: Event) -> None:
        with lock:
            if event.message.startswith("every rank stopped: starting") and "old unit" not in event.message:
                said.append((ROLES[node.rank], "start"))
            elif event.data.get("vote") == "ready":
                said.append((ROLES[node.rank], "ready"))

    waves = tuple(range(len(nodes)))
    Coordinator(nodes, hear, deliver=fake_deliver(fakes), follow=fake_follow(fakes), waves=waves).run()
    return said


def test_prefill_is_ready_before_the_decode_starts_and_the_router_last(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    said = run_waves(nodes, fakes)
    assert said == [(role, what) for role in ROLES for what in ("start", "ready")]
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.APPLIED
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(NEW, role)


@pytest.mark.parametrize("broken", [0, 1, 2])
def test_any_role_that_fails_rolls_every_unit_and_the_router_back(tmp_path: Path, broken: int) -> None:
    news = [NEW, NEW, NEW]
    news[broken] = BROKEN
    nodes, fakes = pd_group(tmp_path, news)
    said = run_waves(nodes, fakes)
    converged = converge(nodes, rollback(fakes))
    assert group_outcome([n.view for n in nodes], converged) is Outcome.ROLLED_BACK
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(OLD, role)
    # no later wave started once a role failed
    assert not any(ROLES.index(role) > broken for role, what in said if what == "start")


def test_a_role_below_its_need_fails_its_gate_and_rolls_all_back(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    # the decode's need (max-running-requests x (context + reserved)) above what its start logs
    nodes[1].request = replace(nodes[1].request, target_context=500_000)
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.ROLLED_BACK
    assert "500,000" in nodes[1].view.why or "500000" in nodes[1].view.why
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(OLD, role)


votes = st.sampled_from(list(Vote))


@given(st.lists(st.tuples(votes, st.integers(0, 2)), min_size=1, max_size=6), st.integers(0, 3))
def test_a_wave_goes_only_after_every_earlier_wave_is_ready(ranks: list[tuple[Vote, int]], sent: int) -> None:
    views, waves = [Rank(v) for v, _ in ranks], [w for _, w in ranks]
    wave = next_wave(views, waves, sent)
    if wave is not None:
        assert wave == sent <= max(waves)
        assert all(v is Vote.READY for v, w in ranks if w < sent)
    elif sent <= max(waves):
        assert any(v is not Vote.READY for v, w in ranks if w < sent)


def test_no_waves_is_no_wave() -> None:
    assert next_wave([Rank(Vote.STOPPED)], [], 0) is None
    assert next_wave([Rank(Vote.READY), Rank(Vote.STOPPED)], [0, 1], 2) is None


def test_the_routed_completion_gates_the_whole_and_its_failure_rolls_all_back(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    fakes[2].host.probe.answer = "RuntimeError: Page size mismatch"  # what the router's completion returns
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.ROLLED_BACK
    assert "routed check" in nodes[2].view.why and "Page size mismatch" in nodes[2].view.why
    for role, fake in zip(ROLES, fakes, strict=True):
        assert served(fake) == role_unit(OLD, role)


def test_the_router_is_asked_for_a_routed_completion_and_no_server_info(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    run_waves(nodes, fakes)
    assert nodes[2].view.outcome is Outcome.APPLIED
    assert "server_info" not in fakes[2].host.probe.asked and "smoke" in fakes[2].host.probe.asked


def test_a_decode_of_the_last_wave_checks_through_the_router_url(tmp_path: Path) -> None:
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    nodes, fakes = nodes[:2], fakes[:2]  # the router's unit unchanged: not restarted, not a member
    for node in nodes:
        node.request = replace(node.request, group=Group(node.rank, 2, WAIT_S))
    nodes[1].request = replace(nodes[1].request, routed_url="http://127.0.0.1:30000")
    fakes[1].host.probe.answer = "decode failed: Page size mismatch"
    Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes),
                waves=(0, 1)).run()  # fmt: skip
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.ROLLED_BACK
    assert "routed check" in nodes[1].view.why
    assert served(fakes[0]) == role_unit(OLD, "prefill") and served(fakes[1]) == role_unit(OLD, "decode")


# ---- the laptop's decisions: who restarts, in which wave, who sends the routed check

P, D, R = Part.PREFILL, Part.DECODE, Part.ROUTER


def seen(*changes: tuple[Part, bool]) -> list[Seen]:
    return [Seen(part, f"{part.value}[{i}]", changed) for i, (part, changed) in enumerate(changes)]


@pytest.mark.parametrize(
    ("changes", "chosen"),
    [
        # nothing changes: nothing restarts
        ([(P, False), (D, False), (R, False)], []),
        # a decode alone: the prefill and the router keep running; the decode checks through the router
        ([(P, False), (D, True), (R, False)], [(1, 0, True)]),
        # a prefill: every decode restarts after it (re-registers, sglang#13054), and checks the route
        ([(P, True), (D, False), (D, False), (R, False)], [(0, 0, False), (1, 1, True), (2, 1, True)]),
        # the router alone: it is the only member, and its own start sends the routed completion
        ([(P, False), (D, False), (R, True)], [(2, 0, False)]),
        # everything: three waves, the router last and its own check
        ([(P, True), (D, True), (R, True)], [(0, 0, False), (1, 1, False), (2, 2, False)]),
        # a second prefill unchanged is not restarted: only the changed one and the decodes
        ([(P, True), (P, False), (D, False), (R, False)], [(0, 0, False), (2, 1, True)]),
    ],
)
def test_members_waves_and_the_routed_check(
    changes: list[tuple[Part, bool]], chosen: list[tuple[int, int, bool]]
) -> None:
    got = members(seen(*changes))
    assert [(m.index, m.wave, m.routed) for m in got] == chosen
    assert all(m.why for m in got)


@given(st.lists(st.tuples(st.sampled_from([P, D]), st.booleans()), min_size=2, max_size=6), st.booleans())
def test_members_never_restart_without_a_reason(units: list[tuple[Part, bool]], router: bool) -> None:
    units = sorted(units, key=lambda u: u[0] is D)  # prefills first, as pd_units gives them
    got = members(seen(*units, (R, router)))
    for m in got:
        part, changed = [*units, (R, router)][m.index]
        assert changed or (part is D and any(c for p, c in units if p is P))
    assert sorted({m.wave for m in got}) == list(range(len({m.wave for m in got})))  # no gap
    routed = [m for m in got if m.routed]
    assert not routed or (not router and all(m.wave == max(w.wave for w in got) for m in routed))


def example_host() -> HostConfig:
    from tests.pure.test_pd import example, host_of

    return host_of(example())


def test_the_example_is_three_requests_each_gated_on_its_role(monkeypatch: pytest.MonkeyPatch) -> None:
    units = planned_units(example_host(), 32768)
    assert [u.part for u in units] == [P, D, R]
    prefill, decode, router = (request_of(u, "absent", 32768) for u in units)
    assert decode.target_context == 8 * (32768 + 512)  # the decode's need is its gate
    assert prefill.target_context == units[0].need and not prefill.smoke.enabled  # a prefill serves no prompt
    assert router.kind == ROUTER_KIND and router.port == 30000 and router.unit.endswith("-router.service")
    assert "--disaggregation-mode prefill" in prefill.unit_text or "disaggregation-mode" in str(
        prefill.unit_text
    )


def test_a_refused_pd_apply_touches_no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdapply as pdapply
    from tests.pure.test_pd import example, host_of

    data = example()
    data["pd"]["decode"][0]["flags"]["page-size"] = 16
    host = host_of(data)

    def no_host(*_: object) -> None:
        raise AssertionError("a refused apply reached a host")

    monkeypatch.setattr(pdapply, "clients", no_host)
    with pytest.raises(InventoryError, match="page"):
        pdapply.apply(host, Connection("pd"), Change(32768, yes=True), Output())


# ---- the agent of one unit killed at each of its jobs, the whole group running


def kill_rig(tmp_path: Path) -> tuple[list[Node], list[FakeNode]]:
    """pd_group, each fake host's systemd one that the agent may die at (test_kill_at_every_job.py)."""
    from tests.pure.test_kill_at_every_job import TwoUnits

    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    for fake, role in zip(fakes, ROLES, strict=True):
        units = TwoUnits(fake.host.systemd.search, fake.host.script)
        fake.host.systemd = units
        fake.host.journal.systemd = units
        fake.host.probe.unit = lambda units=units: units.loaded  # type: ignore[misc]
        fake.host.install(fake.host.etc, role_unit(OLD, role))
    return nodes, fakes


def killing_follow(fakes: list[FakeNode], rank: int, at: tuple[int, str]) -> Callable[..., object]:
    """The unit's transaction, killed at job `at` on unit `rank`; then, as the follower does when its
    runner died, the `recover` verb of that transaction (the recorded job list), its events passed on."""
    from tests.pure.test_kill_at_every_job import Killed

    plain = fake_follow(fakes)

    def follow(node: Node, on_event: Callable[[Event], None]) -> object:
        if node.rank != rank:
            return plain(node, on_event)
        from agent.host.change.folder import write_request
        from agent.host.state import StateDir

        host = fakes[rank].host
        write_request(StateDir(node.request.state_dir), node.request, TXN)  # as the runner does
        host.systemd.kill_at = at  # type: ignore[attr-defined]
        try:
            return plain(node, on_event)
        except Killed:
            host.systemd.kill_at = None  # type: ignore[attr-defined]
            # as the laptop's `recover` sends it: no kind (a router is known by its unit's command)
            again = replace(node.request, verb="recover", died=TXN, group=None, kind="engine")
            txn = host.transaction(again, txn="20261203T120100Z-recover")
            txn.log.listeners.append(on_event)
            result = txn.recover_only()
            on_event(Event(TXN, 99, "", "done", "outcome", result.message, {"outcome": result.outcome.value}))
            return None

    return follow


def jobs_per_unit(tmp_path: Path) -> list[int]:
    nodes, fakes = kill_rig(tmp_path)
    Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes),
                waves=(0, 1, 2)).run()  # fmt: skip
    assert all(n.view.outcome is Outcome.APPLIED for n in nodes)
    return [len(f.host.systemd.calls) for f in fakes]  # type: ignore[attr-defined]


def test_a_unit_killed_at_any_job_leaves_the_service_on_one_generation(tmp_path: Path) -> None:
    """Any unit's agent killed before or after any of its jobs, its recovery the recorded job list's (the
    `recover` verb, as for a one-host change): every running unit ends on the old texts or every one on
    the new, each running the text on its disk; a stopped unit is never reported healthy."""
    counts = jobs_per_unit(tmp_path / "count")
    ends: set[str] = set()
    for rank, n in enumerate(counts):
        for k in range(1, n + 1):
            for where in ("before", "after"):
                nodes, fakes = kill_rig(tmp_path / f"{rank}-{k}-{where}")
                follow = killing_follow(fakes, rank, (k, where))
                Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=follow,
                            waves=(0, 1, 2)).run()  # fmt: skip
                converge(nodes, rollback(fakes))
                ends.add(_one_generation(nodes, fakes, f"{ROLES[rank]} killed {where} job {k}"))
    print(f"jobs per unit {counts}: ends {sorted(ends)}")
    # every job of a member (its stop, its start) comes before its vote: its recovery claims the abort, and
    # the whole service is back on its old units, every one running (none left stopped, in doubt)
    assert ends == {"old"}


def _one_generation(nodes: list[Node], fakes: list[FakeNode], at: str) -> str:
    """The generation the running units serve ("old", "new", or "none"), checked to be one."""
    running = set()
    for node, fake, role in zip(nodes, fakes, ROLES, strict=True):
        units, on_disk = fake.host.systemd, (fake.host.etc / "sglang.service").read_text()
        said = f"{at}: {role} {node.view.outcome} {node.view.why}"
        if units.active == "active":
            assert units.running == on_disk, said  # type: ignore[attr-defined]
            running.add("new" if on_disk == role_unit(NEW, role) else "old")
        else:
            assert node.view.outcome is not Outcome.ROLLED_BACK, f"stopped yet called healthy: {said}"
    assert len(running) <= 1, f"{at}: two generations run: {running}"
    stopped = any(f.host.systemd.active != "active" for f in fakes)
    return (running.pop() if running else "none") + (", some in doubt" if stopped else "")


def test_a_running_router_whose_unit_is_unchanged_is_up_to_date(tmp_path: Path) -> None:
    """A router has no pool to meet a target: its agent finds nothing to do when it runs its very unit, so
    a change of the roles alone never restarts it."""
    host = Host(tmp_path, Script())
    host.install(host.etc, role_unit(OLD, "router"))
    req = replace(host.request(OLD, unit_text=role_unit(OLD, "router")), kind=ROUTER_KIND)
    result = host.transaction(req).apply()
    assert result.outcome is Outcome.UP_TO_DATE, result.message
    assert (host.systemd.restarts, host.systemd.stops, host.systemd.starts) == (0, 0, 0)
    changed = replace(req, unit_text=role_unit(NEW, "router"))
    assert host.transaction(changed).apply().outcome is Outcome.APPLIED  # a changed one restarts


def test_the_routed_check_asks_again_while_the_router_selects_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sglang-router answers 503 `server_selection_failed` until its health check sees the restarted units:
    asked again; a 502 (a decode that died at the transfer) fails at once."""
    from agent.host.roles import pdrouter
    from agent.host.watch.probe import SmokeResult
    from agent.protocol.requests import Timeouts

    monkeypatch.setattr(pdrouter, "UNSELECTED_PAUSE_S", 0.0)
    for replies, passed in ((["HTTP 503", "HTTP 503", ""], True), (["HTTP 502: Decode server error"], False)):
        host = Host(tmp_path / str(passed), Script())
        said = iter(replies)

        def smoke(s: Smoke, said: object = said) -> SmokeResult:
            detail = next(said)  # type: ignore[call-overload]
            return SmokeResult(s.prompt_tokens, 0.1, "" if detail else "dog", not detail, detail)

        host.probe.smoke = smoke  # type: ignore[method-assign]
        req = host.request(NEW, kind=ROUTER_KIND, timeouts=Timeouts(ready_s=30))
        txn = host.transaction(req)
        failed = pdrouter.routed_check(txn.ports, Smoke())
        assert (failed is None) is passed, failed
        assert next(said, None) is None  # every reply was asked for, none more


def test_a_router_is_known_by_its_command_when_a_request_names_no_kind(tmp_path: Path) -> None:
    """A rollback or a recovery sent without the kind (`deployctl`'s own recover, a by-hand rollback)
    still judges the router's start by its /health: it logs no pool."""
    host = Host(tmp_path, Script())
    host.install(host.etc, role_unit(OLD, "router"))
    applied = host.transaction(
        replace(host.request(NEW, unit_text=role_unit(NEW, "router")), kind=ROUTER_KIND)
    )
    assert applied.apply().outcome is Outcome.APPLIED
    back = replace(host.request(OLD), verb="rollback")  # no kind
    result = host.transaction(back, txn="20261203T130000Z-abcdef").rollback()
    assert result.outcome is Outcome.APPLIED and result.data.get("restored_from"), result.message
    assert served(FakeNode(host)) == role_unit(OLD, "router")


def test_a_role_is_gated_on_its_need_not_on_the_offline_prediction() -> None:
    """The plan of a [pd] file is the inventory's, not calibrated on the host: a start whose pool holds its
    role's need passes though it is below that prediction (seen on the test host: 93,608 against 103,479)."""
    for unit in planned_units(example_host(), 32768)[:2]:
        req = request_of(unit, "absent", 32768)
        assert req.planned_pool is None and req.target_context == unit.need


def test_a_committed_member_leaves_systemd_with_its_unit_as_on_disk(tmp_path: Path) -> None:
    """The boot guard's drop-in goes at the commit: systemd must read the unit again after it, or it
    says NeedDaemonReload=yes and the next apply's compare takes the running unit for one not running as
    installed (found on the test host: a second apply of an unchanged [pd] service restarted every role)."""
    nodes, fakes = pd_group(tmp_path, [NEW, NEW, NEW])
    guards: list[list[bool]] = [[] for _ in fakes]
    for fake, seen in zip(fakes, guards, strict=True):
        sd, drop_in = fake.host.systemd, fake.host.etc / "sglang.service.d" / "50-deployctl-pending.conf"
        reload = sd.daemon_reload

        def watched(
            reload: Callable[[], None] = reload, seen: list[bool] = seen, drop_in: Path = drop_in
        ) -> None:
            seen.append(drop_in.exists())
            reload()

        sd.daemon_reload = watched  # type: ignore[method-assign]
    run_waves(nodes, fakes)
    assert group_outcome([n.view for n in nodes], converge(nodes, rollback(fakes))) is Outcome.APPLIED
    for role, seen in zip(ROLES, guards, strict=True):
        assert seen and seen[-1] is False, (role, seen)  # the last reload read the unit without the guard


def test_a_committed_or_rolled_back_group_leaves_every_unit_loaded_as_written_and_up_to_date(
    tmp_path: Path,
) -> None:
    """A group member's boot guard (a drop-in, host/change/bootguard.py) goes once the change is decided;
    systemd reported NeedDaemonReload=yes for the unit ever after (measured on the real 1P1D), so the next
    apply's compare took the unchanged running unit for one not running as installed, and restarted every
    unit of the service for nothing ("would restart (its unit changes)", "the unit would not change")."""
    from agent.host.change.compare import running_as_installed

    for news, expected in (([NEW, NEW, NEW], NEW), ([NEW, BROKEN, NEW], OLD)):
        nodes, fakes = pd_group(tmp_path / str(expected), news)
        run_waves(nodes, fakes)
        converge(nodes, rollback(fakes))
        for node, fake, role in zip(nodes, fakes, ROLES, strict=True):
            assert served(fake) == role_unit(expected, role)
            again = replace(node.request, unit_text=role_unit(expected, role), target_context=expected,
                            group=None, txn=None)  # fmt: skip
            txn = fake.host.transaction(again, txn="20261207T010000Z-abcdef")
            assert running_as_installed(txn.ports), (role, fake.host.systemd.unit_state(UNIT))
            done = txn.compare(wait=False)
            assert getattr(done, "outcome", None) is Outcome.UP_TO_DATE, (role, done)
