"""`deployctl apply` of a [pd] service stays safe when the laptop, a link or a guess fails: no member commits
alone, each unit's routed check reaches the router, a context SGLang refuses reaches no host, and a router
unit is known by its command. Fakes as in test_pd_group.py: one fake host per unit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent.errors import ConnectError, InventoryError, UsageError
from agent.group.run import Coordinator, Node
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.output import Output
from agent.pd.group import Part, Seen, members
from agent.protocol.answers import SignalAnswer
from agent.protocol.events import Outcome
from agent.protocol.requests import ROUTER_KIND, Group, Smoke
from tests.pure.test_group_change import FakeNode, fake_deliver, fake_follow
from tests.pure.test_pd_group import NEW, OLD, WAIT_S, role_unit
from tests.pure.txnfakes import TXN, Host, Script, unit_text

P, D, R = Part.PREFILL, Part.DECODE, Part.ROUTER


def pd_nodes(tmp_path: Path, roles: list[str]) -> tuple[list[Node], list[FakeNode]]:
    """One fake host per role's unit (no router member: its unit is unchanged), each on its old unit, all
    changing to NEW; waves as members() gives them (prefills 0, decodes 1)."""
    fakes, nodes = [], []
    for rank, role in enumerate(roles):
        host = Host(tmp_path / f"{rank}-{role}", Script(pools={"100000": 110_000, "200000": 210_000}))
        host.install(host.etc, role_unit(OLD, role))
        req = host.request(NEW, unit_text=role_unit(NEW, role))
        req = replace(req, txn=TXN, group=Group(rank, len(roles), WAIT_S, collective=False), drain=False)
        fakes.append(FakeNode(host))
        nodes.append(Node(rank, HostConfig.model_construct(name=f"{role}{rank}"), None, req))
    return nodes, fakes


def runs(fake: FakeNode) -> str | None:
    return fake.host.systemd.loaded if fake.host.systemd.active == "active" else None


# ---- the laptop gone after the votes: no member commits alone (a [pd] group has no collective)


def test_laptop_gone_after_the_votes_never_leaves_the_decode_new_and_the_prefill_old(tmp_path: Path) -> None:
    """1P1D, both units change, the router's unit unchanged. The laptop goes away once both voted ready
    (no commit, no abort, no go-back reaches anyone). Rank 0 (the prefill) aborts alone at its deadline. The
    multi-node rule "my server outlived rank 0's deadline, so rank 0 committed" holds only for a collective
    (a rank's server dies with its peer's); PD roles share none, so the decode (collective false) stops at
    its deadline and waits for the word, then ends in doubt: never the decode new and the prefill old."""
    nodes, fakes = pd_nodes(tmp_path, ["prefill", "decode"])
    plain = fake_deliver(fakes)

    def laptop(node: Node, word: str, reason: str) -> SignalAnswer:
        if word == "go":
            return plain(node, word, reason)
        raise ConnectError(f"{node.host.name}: the laptop is gone")  # nothing after the last "go"

    Coordinator(nodes, lambda n, e: None, deliver=laptop, follow=fake_follow(fakes), waves=(0, 1)).run()
    prefill, decode = (n.view.outcome for n in nodes)
    said = f"prefill {prefill} runs {runs(fakes[0])!r}; decode {decode} runs {runs(fakes[1])!r}"
    # all old or all new: never the decode committed on its new unit while the prefill did not commit
    assert not (decode is Outcome.APPLIED and prefill is not Outcome.APPLIED), said


def test_a_member_without_a_collective_never_commits_without_rank_0s_word() -> None:
    """Every phase, every sight and every word short of a commit: a member of a [pd] group (collective
    false) never ends committed, nor starts its new unit, on its own deadline or recovery."""
    from itertools import product

    from agent.protocol.groupmachine import Decision, Do, Files, Node, Phase, Saw, node_step

    for rank, phase, saw, go, go_back in product(
        (0, 1, 2), list(Phase), list(Saw), (False, True), (False, True)
    ):
        for decision in (None, Decision.ABORT):
            node = Node(rank, phase, Files(go, go_back, decision), collective=False)
            after, _ = node_step(node, saw)
            assert after.files.decision is not Decision.COMMIT, (node, saw, after)
            assert after.phase is not Phase.COMMITTED or phase is Phase.COMMITTED, (node, saw, after)
    late = node_step(Node(1, Phase.DECIDING, collective=False), Saw.DEADLINE)
    assert late == (Node(1, Phase.HELD, collective=False), (Do.STOP,))
    # a [nodes] rank keeps its rule: its server outlived rank 0's deadline
    assert node_step(Node(1, Phase.DECIDING), Saw.DEADLINE)[0].phase is Phase.COMMITTED


def test_the_pd_group_is_sent_and_recorded_without_a_collective() -> None:
    """Each [pd] member's request says collective false, its group record keeps it (a recovery reads it),
    and a [nodes] record reads as before (collective true, the field absent)."""
    import agent.group.pdapply as pdapply
    from agent.protocol.grouprecord import GroupRecord
    from agent.protocol.requests import Request
    from tests.pure.test_pd import example, host_of

    host = host_of(example())
    units = pdapply.planned_units(host, 32768)
    requests = [pdapply.request_of(u, "absent", 32768) for u in units]
    chosen = members([Seen(u.part, u.label, True) for u in units])
    nodes = pdapply._nodes(host, units, [None] * len(units), requests, chosen)  # type: ignore[list-item]
    for node in nodes:
        assert node.request.group is not None and node.request.group.collective is False
        back = Request.from_json(node.request.to_json())
        record = GroupRecord.of(back)
        assert record is not None and record.collective is False
        assert GroupRecord.from_json(record.to_json()) == record
    nodes_record = GroupRecord(1, 60.0, 600.0)
    assert "collective" not in nodes_record.to_json()
    assert GroupRecord.from_json(nodes_record.to_json()).collective is True
    with pytest.raises(ValueError):
        GroupRecord.from_json(nodes_record.to_json().replace("{", '{"collective": 0, ', 1))


# ---- the routed check of a unit on another host reaches the router, not that host's loopback


def two_host_example() -> HostConfig:
    from tests.pure.test_pd import example, host_of

    data = example()
    data["pd"]["decode"][0]["target"] = "gpu2"  # the decode on a second host, reached by the router at
    data["pd"]["decode"][0]["url"] = "http://10.0.0.2:30020"  # its own address (docs/pd.md: `url`)
    data["pd"]["prefill"][0]["url"] = "http://10.0.0.1:30010"
    return host_of(data)


def test_the_routed_check_of_a_decode_on_another_host_reaches_the_router(tmp_path: Path) -> None:
    """The decode (on gpu2) sends the routed check when the router's unit is unchanged; its agent runs on
    gpu2, but routed_url is the router's bind address turned into loopback (http://127.0.0.1:30000,
    agent/group/pdapply.py:113-116, sent at :167): on gpu2 that is no router. The check then fails for
    ever (every change
    of such a service rolls back), or it passes against whatever else listens there (SGLang's default port
    is 30000: another service of gpu2), with the new decode never proven."""
    import agent.group.pdapply as pdapply

    host = two_host_example()
    units = pdapply.planned_units(host, 32768)
    requests = [pdapply.request_of(u, "absent", 32768) for u in units]
    chosen = members([Seen(u.part, u.label, u.part is not R) for u in units])  # the roles change
    nodes = pdapply._nodes(host, units, [None] * len(units), requests, chosen)  # type: ignore[list-item]
    router_at = pdapply.router_host(host).ssh.target
    for node in nodes:
        if node.request.routed_url is None or node.host.ssh.target == router_at:
            continue
        where = urlsplit(node.request.routed_url).hostname
        assert where not in ("127.0.0.1", "::1", "localhost"), (
            f"{node.host.name} on {node.host.ssh.target} checks the router at {node.request.routed_url}, "
            f"its own loopback; the router runs on {router_at}"
        )


@pytest.mark.parametrize(
    ("router", "expected"),
    [
        ({}, "http://gpu-pd:30000"),  # bound to every address: its SSH target's host name
        ({"target": "ops@10.0.0.9:2222"}, "http://10.0.0.9:30000"),
        ({"host": "10.0.0.1"}, "http://10.0.0.1:30000"),  # its bind address
        ({"url": "http://router.lan:8080/"}, "http://router.lan:8080"),
        ({"host": "127.0.0.1"}, None),  # loopback only: refused
        ({"url": "http://127.0.0.1:30000"}, None),
        ({"target": "local"}, None),
    ],
)
def test_a_unit_on_another_host_checks_the_router_at_its_reachable_address(
    router: dict[str, str], expected: str | None
) -> None:
    """The decode on gpu2 sends its routed check to the router's reachable URL ([pd.router] url, its bind
    address, or its SSH target's host); a router no other host can reach is refused in one line, before
    any host is asked; a unit on the router's own host checks its loopback."""
    import agent.group.pdapply as pdapply
    from agent.pd.refusals import check
    from agent.pd.units import routed_url, router_target
    from tests.pure.test_pd import example, host_of

    data = example()
    data["pd"]["decode"][0].update(target="gpu2", url="http://10.0.0.2:30020")
    data["pd"]["prefill"][0]["url"] = "http://10.0.0.1:30010"
    data["pd"]["router"].update(router)
    host = host_of(data)
    assert routed_url(host, "gpu2") == expected
    here = routed_url(host, router_target(host))
    assert here is not None and urlsplit(here).hostname in ("127.0.0.1", "10.0.0.1")
    refused = [r for r in check(host).refusals if "[pd.router] url" in r]
    if expected is None:
        assert refused and all("\n" not in r for r in refused), refused
        with pytest.raises(InventoryError):
            pdapply.refused_first(host, 32768)
    else:
        assert refused == []


# ---- one routed completion per unit does not prove that unit served it


class CacheAwareRouter:
    """sglang-router's cache_aware policy (the example's `policy`): a prompt goes to the worker whose tree
    holds its prefix; identical prompts go to the worker that served the first one. The worker that serves
    one counts it in its own /metrics (sglang:num_requests_total), as SGLang 0.5.23 does."""

    def __init__(self, sticky: str | None = None) -> None:
        self.tree: dict[tuple[str, int], str] = {}
        self.served: list[str] = []
        self.workers: dict[str, FakeNode] = {}
        self.sticky = sticky  # every prompt to this worker (one the router still counts unhealthy)

    def probe_of(self, me: str, fake: FakeNode) -> None:
        from agent.host.watch.probe import SmokeResult

        self.workers[me] = fake
        fake.host.probe.served = 0

        def smoke(s: Smoke) -> SmokeResult:
            worker = self.sticky or self.tree.setdefault((s.sentence, s.prompt_tokens), me)  # the first wins
            self.served.append(worker)
            probe = self.workers[worker].host.probe
            probe.served = (probe.served or 0) + 1
            return SmokeResult(s.prompt_tokens, 0.1, "dog", True)

        fake.host.probe.smoke = smoke  # type: ignore[method-assign]


def one_p_two_d(tmp_path: Path, router: CacheAwareRouter) -> tuple[list[Node], list[FakeNode]]:
    nodes, fakes = pd_nodes(tmp_path, ["prefill", "decode", "decode"])
    for rank in (1, 2):
        nodes[rank].request = replace(nodes[rank].request, routed_url="http://127.0.0.1:30000")
        router.probe_of(f"decode{rank}", fakes[rank])
    Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes),
                waves=(0, 1, 1)).run()  # fmt: skip
    return nodes, fakes


def test_every_restarted_decode_serves_a_routed_completion_before_the_commit(tmp_path: Path) -> None:
    """1P2D, the prefill changes: both decodes restart (wave 1), each sends one routed completion through
    the unchanged router (agent/host/roles/pdrouter.py:61-89). Both send the same prompt, and the router's
    cache_aware policy sends it to the same decode both times (as it does while it still counts a restarted
    decode unhealthy): decode[1] commits without ever serving one. A decode whose new unit fails at its first
    transfer (a wrong ib_device / UCX_NET_DEVICES) is committed, and half the service's requests hang."""
    router = CacheAwareRouter()
    nodes, _ = one_p_two_d(tmp_path, router)
    committed = all(n.view.outcome is Outcome.APPLIED for n in nodes)
    assert not committed or set(router.served) == {"decode1", "decode2"}, (
        f"committed; routed completions served by {router.served}"
    )
    assert committed, [n.view.why for n in nodes]


def test_a_restarted_decode_the_router_never_sends_to_rolls_the_group_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router sends every routed completion to decode1, whatever the prompt: decode2's count never
    grows, its routed check fails after its tries, and every unit goes back to its old unit."""
    from agent.host.roles import pdrouter
    from agent.host.roles.pdrouter import ROUTED_TRIES

    # the fake counts at once: decode2's tries must not outlast the group's wait on a loaded machine
    monkeypatch.setattr(pdrouter, "SERVED_SETTLE_S", 0.01)
    router = CacheAwareRouter(sticky="decode1")
    nodes, fakes = one_p_two_d(tmp_path, router)
    assert all(n.view.outcome is Outcome.ROLLED_BACK for n in nodes), [n.view for n in nodes]
    assert "decode2" not in router.served
    # every one of decode2's tries went to decode1 (decode1's own check may not run: the group can abort
    # on decode2's failure before decode1 reaches it)
    assert router.served.count("decode1") >= ROUTED_TRIES
    roles = ["prefill", "decode", "decode"]
    assert all(runs(f) == role_unit(OLD, role) for f, role in zip(fakes, roles, strict=True))
    said = " ".join(str(n.view.why) for n in nodes)
    assert "none of 12 routed completions" in said, said


# ---- a context SGLang refuses to start reaches no host


def test_a_context_above_the_models_own_is_refused_before_any_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-host apply refuses --context above the model's max_context (agent/apply.py allow_context, exit
    2); the [pd] apply never calls it (agent/group/pdapply.py:51-63): 200k on a 131,072-token model passes
    every refusal, reaches the hosts, and every unit restarts into SGLang's own refusal, then rolls back."""
    import agent.group.pdapply as pdapply
    from tests.pure.test_pd import example, host_of

    data = example()
    data["pd"]["decode"][0]["flags"]["max-running-requests"] = 1  # pools that hold 200k: only the context
    data["pd"]["prefill_in_flight"] = 1  # is wrong
    host = host_of(data)
    assert host.model.max_context == 131072

    def no_host(*_: object) -> None:
        raise AssertionError("a context SGLang refuses reached a host")

    monkeypatch.setattr(pdapply, "clients", no_host)
    with pytest.raises((UsageError, InventoryError)):
        pdapply.apply(host, Connection("pd"), Change(200_000, yes=True), Output())


def test_allow_longer_context_sets_sglangs_override_in_every_role(monkeypatch: pytest.MonkeyPatch) -> None:
    """--allow-longer-context: the same 200k passes the refusals and every role's unit carries SGLang's
    override (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1), as a one-host apply's unit does."""
    import agent.group.pdapply as pdapply
    from tests.pure.test_pd import example, host_of

    data = example()
    data["pd"]["decode"][0]["flags"]["max-running-requests"] = 1
    data["pd"]["prefill_in_flight"] = 1
    host = host_of(data)
    sent: list[list[str]] = []

    def stop_at_the_hosts(hosts: list[HostConfig], conn: object) -> None:
        sent.append([h.name for h in hosts])
        raise ConnectError("stopped here: every refusal passed")

    monkeypatch.setattr(pdapply, "clients", stop_at_the_hosts)
    planned: list[list[str]] = []
    real = pdapply.planned_units

    def keep(h: HostConfig, context: int) -> list[pdapply.Planned]:
        units = real(h, context)
        planned.append([u.text for u in units if u.part is not R])
        return units

    monkeypatch.setattr(pdapply, "planned_units", keep)
    with pytest.raises(ConnectError):
        pdapply.apply(host, Connection("pd"), Change(200_000, yes=True, allow_longer_context=True), Output())
    assert sent and planned and len(planned[0]) == 2
    assert all("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in text for text in planned[0])


# ---- a router is known by its command, whichever of sglang-router's commands starts it


ROUTER_WORDS = (
    "--port 30000 --pd-disaggregation --prefill http://127.0.0.1:30010 8998 --decode http://127.0.0.1:30020"
)


@pytest.mark.parametrize(
    "executable",
    [
        "/usr/bin/python3 -m sglang_router.launch_router",  # the default: known
        "/opt/sglang/.venv/bin/sglang-router launch",  # the package's own console script (sglang_router.cli)
        "/opt/sglang/.venv/bin/python -m sglang_router launch",  # its __main__
    ],
)
def test_a_router_is_known_without_a_kind_whatever_command_starts_it(tmp_path: Path, executable: str) -> None:
    """[pd.router] executable is free (agent/pd/spec.py:107); runs_router (agent/host/roles/pdrouter.py:37-39)
    knows only `sglang_router.launch_router`. A rollback or a recovery sent without the kind (the laptop's
    `recover`, recover_orphan, a by-hand `deployctl rollback`) then watches the router's start for a KV pool
    it never logs: the rollback fails (exit 5) with the router stopped. (The shipped test of this,
    test_pd_group.py::test_a_router_is_known_by_its_command..., passes either way: its fake router logs a
    pool, since the fake Script reads `--request-timeout-secs 100000` as a context.)"""
    host = Host(tmp_path, Script())  # a real router logs no KV pool and no "fired up" line
    old = f"[Unit]\nDescription=router\n\n[Service]\nExecStart={executable} {ROUTER_WORDS}\n"
    host.install(host.etc, old)
    new = old.replace("--port 30000", "--port 30000 --policy round_robin")
    applied = host.transaction(replace(host.request(NEW, unit_text=new), kind=ROUTER_KIND)).apply()
    assert applied.outcome is Outcome.APPLIED, applied.message
    back = replace(host.request(OLD), verb="rollback")  # no kind, as recover and rollback send it
    result = host.transaction(back, txn="20261203T130000Z-abcdef").rollback()
    assert result.outcome is Outcome.APPLIED, result.message
    assert runs(FakeNode(host)) == old


# ---- an engine unit stays an engine whatever a later line names


def test_an_engine_unit_whose_later_line_names_the_router_is_still_gated_on_its_pool(tmp_path: Path) -> None:
    """runs_router reads everything after the first `ExecStart=` (text.partition), not the command: an
    engine unit with a later line naming the router (an adopted unit's verbatim [Service] line or comment,
    templates/sglang-adopted.service.j2:35) is judged a router: no pool gate, no /server_info, and compare
    calls it up to date whenever it runs. Here a pool far below the target commits."""
    later = (
        "# behind the gateway: python3 -m sglang_router.launch_router --worker-urls http://127.0.0.1:30000\n"
    )
    host = Host(tmp_path, Script(pools={"100000": 110_000, "200000": 50_000}))  # the new start: 50k tokens
    host.install(host.etc, unit_text(OLD, later))
    req = host.request(NEW, unit_text=unit_text(NEW, later))  # target 200,000
    result = host.transaction(req).apply()
    assert result.outcome is not Outcome.APPLIED, result.message


ENGINE = "/usr/bin/python3 -m sglang.launch_server --port 30000"


@pytest.mark.parametrize(
    ("service", "router"),
    [
        (f"ExecStart=/usr/bin/python3 -m sglang_router.launch_router {ROUTER_WORDS}", True),
        (f"ExecStart=-/opt/v/bin/sglang-router launch {ROUTER_WORDS}", True),  # systemd's prefix
        (f"ExecStart=/opt/v/bin/smg launch {ROUTER_WORDS}", True),
        (f"ExecStart=/usr/bin/env PYTHONPATH=/x python3 -m sglang_router launch {ROUTER_WORDS}", True),
        (
            f"ExecStart=/usr/bin/python3 \\\n  -m sglang_router.launch_router {ROUTER_WORDS}",
            True,
        ),  # continued
        (f"ExecStart={ENGINE}", False),
        (f"ExecStart=/opt/v/bin/sglang-router server {ROUTER_WORDS}", False),  # launches an engine too
        (f"ExecStart={ENGINE}\nEnvironment=NOTE=python3 -m sglang_router.launch_router", False),
        (f"ExecStart={ENGINE}\n# then: sglang-router launch --worker-urls x", False),
        (f"ExecStart={ENGINE} --served-model-name sglang_router.launch_router", False),  # a value, not -m
        (f"Environment=X=1\nExecStart={ENGINE}\nExecStartPost=/opt/v/bin/sglang-router launch", False),
    ],
)
def test_a_unit_runs_the_router_by_its_execstart_command_alone(service: str, router: bool) -> None:
    """The [Service] ExecStart= as systemd reads it (continuations joined, comments and other keys
    skipped): sglang-router's module, package or console script with `launch` is a router; anything else,
    whatever a later line names, is an engine gated on its pool."""
    from agent.host.roles.pdrouter import runs_router

    assert runs_router(f"[Unit]\nDescription=x\n\n[Service]\n{service}\n") is router


# ---- a prefill (re)started by the recovery that opens an apply restarts its decodes


def test_a_prefill_started_by_the_recovery_before_the_compare_restarts_every_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """_asked (agent/group/pdapply.py:140-148) first finishes an earlier change whose agent died
    (recover_orphan: the prefill's old unit put back and started, or its kept unit started). Then every unit
    compares up to date, members() sees no change (pdapply.py:124-133) and the decodes, registered with the
    prefill's previous process, keep running: the failed pair of sglang#13054, with "nothing to do"."""
    from contextlib import contextmanager

    import agent.group.pdapply as pdapply
    from tests.pure.test_pd import example, host_of

    host = host_of(example())
    recovered: list[str] = []
    ran: list[list[str]] = []

    class Agent:
        def __init__(self, label: str) -> None:
            self.label = label

        def call(self, req: object) -> dict[str, object]:
            if getattr(req, "verb", "") == "compare":
                return {"up_to_date": True}
            return {"orphan": self.label == "prefill[0]" and not recovered, "unit_sha256": "a" * 64}

    @contextmanager
    def clients(hosts: list[HostConfig], conn: object):  # type: ignore[no-untyped-def]
        labels = [u.label for u in pdapply.planned_units(host, 32768)]
        yield [Agent(label) for label in labels]

    def recover_orphan(out: object, s: object, answer: dict[str, object]) -> bool:
        if answer.get("orphan"):
            recovered.append("prefill[0]")  # its recovery started the prefill's unit again
            return True
        return False

    def run(out: object, h: object, nodes: list[Node], order: object) -> int:
        ran.append([n.host.name for n in nodes])
        return 0

    monkeypatch.setattr(pdapply, "clients", clients)
    monkeypatch.setattr(pdapply, "recover_orphan", recover_orphan)
    monkeypatch.setattr(pdapply, "run_group", run)
    pdapply.apply(host, Connection("pd"), Change(32768, yes=True), Output())
    assert recovered == ["prefill[0]"]
    assert ran and any("decode" in name for name in ran[0]), "the prefill restarted; its decode did not"


def test_a_recovered_prefill_restarts_only_the_decodes_and_a_recovered_decode_nothing() -> None:
    """members(): a prefill the opening recovery started again is no member (its unit is up to date), but
    every decode is, with the reason; a decode recovered alone asks nothing of the others."""
    units = [Seen(P, "prefill[0]", False, recovered=True), Seen(D, "decode[0]", False),
             Seen(D, "decode[1]", False), Seen(R, "router", False)]  # fmt: skip
    chosen = members(units)
    assert [m.index for m in chosen] == [1, 2] and all(m.wave == 0 and m.routed for m in chosen)
    assert all("prefill[0] was started again by the recovery" in m.why for m in chosen), chosen
    assert members([Seen(P, "prefill[0]", False), Seen(D, "decode[0]", False, recovered=True)]) == []


# ---- drained through the router: out before the stop, back with its role before the routed check


def test_each_unit_leaves_the_router_before_its_stop_and_is_back_with_its_role_before_the_routed_check(
    tmp_path: Path,
) -> None:
    """1P1D, the router's unit unchanged: each unit is taken out of sglang-router before its stop (no new
    request reaches it), and put back with its role (a prefill with its bootstrap port) once its new server
    passed its checks: the decode's routed completion finds both listed, with their roles."""
    from agent.host.roles.router import Registration
    from tests.pure.test_router import ROUTER, FakeRouter

    urls = {"prefill": "http://127.0.0.1:30010", "decode": "http://127.0.0.1:30020"}
    nodes, fakes = pd_nodes(tmp_path, ["prefill", "decode"])
    router = FakeRouter()
    for url in urls.values():
        router.add(url)
    seen_at_the_check: list[dict[str, Registration]] = []
    for node, fake, (role, url) in zip(nodes, fakes, urls.items(), strict=True):
        fake.host.router = router
        port = 8998 if role == "prefill" else None
        node.request = replace(node.request, router_url=ROUTER, router_worker_url=url,
                               router_worker_type=role, router_bootstrap_port=port)  # fmt: skip
    nodes[1].request = replace(nodes[1].request, routed_url=ROUTER)
    fakes[1].host.probe.served = 0

    def smoke(s: Smoke) -> object:
        from agent.host.watch.probe import SmokeResult

        seen_at_the_check.append({u: router.regs[u] for u in router.urls()})
        fakes[1].host.probe.served = (fakes[1].host.probe.served or 0) + 1
        return SmokeResult(s.prompt_tokens, 0.1, "dog", True)

    fakes[1].host.probe.smoke = smoke  # type: ignore[method-assign]
    router.calls.clear()
    Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes),
                waves=(0, 1)).run()  # fmt: skip
    assert all(n.view.outcome is Outcome.APPLIED for n in nodes), [n.view.why for n in nodes]
    assert [c for c, _ in router.changes()][:2] == ["remove", "remove"]  # both out before any start
    want = {urls["prefill"]: Registration("prefill", 8998), urls["decode"]: Registration("decode")}
    assert seen_at_the_check and seen_at_the_check[0] == want
    assert {u: router.regs[u] for u in router.urls()} == want


def test_the_units_of_a_pd_change_are_drained_through_the_router_only_while_it_stays() -> None:
    """_nodes: each role's unit carries the router's URL (from its host), its own URL as the router knows
    it, its role and a prefill's bootstrap port; none when the router's own unit restarts too."""
    import agent.group.pdapply as pdapply
    from tests.pure.test_pd import example, host_of

    host = host_of(example())
    units = pdapply.planned_units(host, 32768)
    requests = [pdapply.request_of(u, "absent", 32768) for u in units]
    for router_changes in (False, True):
        chosen = members([Seen(u.part, u.label, u.part is not R or router_changes) for u in units])
        nodes = pdapply._nodes(host, units, [None] * len(units), requests, chosen)  # type: ignore[list-item]
        roles = [(n.request.router_worker_type, n.request.router_bootstrap_port) for n in nodes]
        if router_changes:
            assert all(n.request.router_url is None for n in nodes), roles
            continue
        assert roles == [("prefill", units[0].bootstrap_port), ("decode", None)]
        assert all(n.request.router_url == "http://127.0.0.1:30000" for n in nodes)
        assert [n.request.router_worker_url for n in nodes] == [u.url for u in units[:2]]


# ---- the KV checksum: on where the cards compute it, and a mismatch fails the change


def test_the_kv_checksum_is_rendered_in_every_role_on_cuda_and_skipped_with_its_reason_otherwise() -> None:
    import agent.group.pdapply as pdapply
    from agent.pd.plan import checksum_line
    from agent.pd.units import kv_checksum_skipped
    from tests.pure.test_pd import example, host_of

    host = host_of(example())
    assert kv_checksum_skipped(host) is None
    texts = [u.text for u in pdapply.planned_units(host, 32768) if u.part is not R]
    assert texts and all("--disaggregation-enable-kv-checksum" in t for t in texts)
    assert checksum_line(host).startswith("KV checksum: on in every role")
    for change, why in (({"kv_checksum": False}, "[pd] kv_checksum = false"), (None, "--device cpu")):
        data = example()
        if change:
            data["pd"].update(change)
        else:
            data["pd"]["decode"][0]["flags"]["device"] = "cpu"  # one role off the card: both go without it
        other = host_of(data)
        assert why in (kv_checksum_skipped(other) or ""), kv_checksum_skipped(other)
        assert checksum_line(other).startswith("KV checksum: skipped")
        texts = [u.text for u in pdapply.planned_units(other, 32768) if u.part is not R] if change else []
        assert all("kv-checksum" not in t for t in texts)


def test_a_kv_checksum_mismatch_the_decode_logged_rolls_the_group_back(tmp_path: Path) -> None:
    """1P1D with the checksum on: the routed completion is answered (the router retried it through another
    transfer), but the decode's journal has SGLang's `KV checksum mismatch req=...` line: the change fails
    and every unit goes back."""
    from agent.host.watch.probe import SmokeResult

    nodes, fakes = pd_nodes(tmp_path, ["prefill", "decode"])
    flag = "--disaggregation-mode decode --disaggregation-enable-kv-checksum"
    for node in nodes[1:]:
        text = node.request.unit_text or ""
        node.request = replace(node.request, unit_text=text.replace("--disaggregation-mode decode", flag),
                               routed_url="http://127.0.0.1:30000")  # fmt: skip
    decode = fakes[1].host
    decode.probe.served = 0

    def smoke(s: Smoke) -> SmokeResult:
        decode.probe.served = (decode.probe.served or 0) + 1
        decode.systemd.lines[decode.systemd.invocation].append(
            "[2026-12-06 10:00:00] KV checksum mismatch req=abc bootstrap_room=7 expected=0x1 got=0x0"
        )
        return SmokeResult(s.prompt_tokens, 0.1, "dog", True)

    decode.probe.smoke = smoke  # type: ignore[method-assign]
    Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes),
                waves=(0, 1)).run()  # fmt: skip
    assert all(n.view.outcome is Outcome.ROLLED_BACK for n in nodes), [n.view for n in nodes]
    assert "KV checksum mismatch" in " ".join(str(n.view.why) for n in nodes)


def test_a_decode_that_dies_at_its_first_transfer_fails_the_routed_check_with_sglangs_line(
    tmp_path: Path,
) -> None:
    """1P1D: the decode's new unit starts on another page size (a hand edit), passes its own checks, and
    dies at its first routed request with SGLang's `Page size mismatch` (the real decode's journal,
    tests/data/realpd/). sglang-router 0.3.2 holds that client (measured: the prefill keeps the request in
    its bootstrap queue), so the routed check's answer comes only with its timeout. The check ends with the
    decode's start instead, names parse-log's failure kind and the fix, and every unit goes back."""
    import threading

    from agent.host.watch.probe import ProbeError, SmokeResult
    from tests.pure.test_logs_pd import REAL as REAL_LOG

    journal = REAL_LOG.read_text().splitlines()
    second = journal[max(i for i, line in enumerate(journal) if line.startswith("Started ")) :]
    held, released = threading.Event(), threading.Event()
    nodes, fakes = pd_nodes(tmp_path, ["prefill", "decode"])
    nodes[1].request = replace(nodes[1].request, routed_url="http://127.0.0.1:30000")
    decode = fakes[1].host
    decode.probe.served = 0

    def smoke(s: Smoke) -> SmokeResult:
        decode.systemd.lines[decode.systemd.invocation] += second  # it logs the mismatch and exits
        decode.systemd.active, decode.systemd.sub = "failed", "failed"
        held.set()
        released.wait(30)  # the router holds the client until its timeout
        raise ProbeError("smoke test request failed: read timed out")

    decode.probe.smoke = smoke  # type: ignore[method-assign]
    try:
        Coordinator(nodes, lambda n, e: None, deliver=fake_deliver(fakes), follow=fake_follow(fakes),
                    waves=(0, 1)).run()  # fmt: skip
    finally:
        released.set()
    assert held.is_set()
    assert all(n.view.outcome is Outcome.ROLLED_BACK for n in nodes), [n.view for n in nodes]
    said = " ".join(str(n.view.why) for n in nodes)
    assert "pd_page_size_mismatch" in said and "Page size mismatch: prefill server has page_size=1" in said
    assert "the prefill runs --page-size 1, the decode --page-size 16" in said, said
    assert all(runs(f) == role_unit(OLD, role) for f, role in zip(fakes, ["prefill", "decode"], strict=True))
