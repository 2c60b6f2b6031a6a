"""A dry run sends nothing but facts (and a [pd] apply's compare): an orphaned change (its agent died) is
only said to be pending, while a real apply still recovers it first."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import tomllib

import agent.deploy as deploy
import agent.orchestrate.session as session
from agent.inventory import HostConfig
from agent.orchestrate.asked import Change, Connection
from agent.output import Output

ROOT = Path(__file__).resolve().parents[2]


def _host() -> HostConfig:
    data = tomllib.loads((ROOT / "units" / "ct200.toml").read_text(encoding="utf-8"))
    return HostConfig.model_validate({"name": "ct200", **data})


class _Talk:
    answer: ClassVar[dict[str, object]] = {"orphan": True}


class _Client:
    @contextlib.contextmanager
    def converse(self, _first: Any) -> Iterator[_Talk]:
        yield _Talk()


def _run(monkeypatch: pytest.MonkeyPatch, *, dry_run: bool) -> tuple[list[str], int, str]:
    sent: list[str] = []
    planned: list[bool] = []

    class Done:
        message = "recovered"

    def follow(_out: Any, _s: Any, req: Any, _talk: Any = None) -> Done:
        sent.append(req.verb)
        return Done()

    @contextlib.contextmanager
    def fake_session(_conn: Any, host: HostConfig) -> Iterator[session.Session]:
        yield session.Session(host, _Client())  # type: ignore[arg-type]

    monkeypatch.setattr(session, "follow", follow)
    monkeypatch.setattr(deploy, "session", fake_session)
    monkeypatch.setattr(deploy, "_load_planner", lambda _h: None)
    monkeypatch.setattr(deploy, "_apply", lambda *a: planned.append(True) or 0)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    deploy.apply(Connection("ct200"), Change(32768, dry_run=dry_run), out, _host())
    assert isinstance(out.stderr, io.StringIO)
    return sent, len(planned), out.stderr.getvalue()


def test_a_one_host_dry_run_says_a_recovery_is_pending_and_sends_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent, planned, said = _run(monkeypatch, dry_run=True)
    assert sent == []
    assert planned == 1  # planned from the unit as it is
    assert "recovery is pending" in said


def test_a_one_host_apply_still_recovers_first(monkeypatch: pytest.MonkeyPatch) -> None:
    sent, planned, _ = _run(monkeypatch, dry_run=False)
    assert sent == ["recover"]
    assert planned == 1


def test_a_pd_dry_run_names_the_unit_whose_recovery_is_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdapply as pdapply
    from tests.pure.test_pd import example, host_of
    from tests.pure.test_pd_ops import FakeAgent, fake_clients

    host = host_of(example())
    units = pdapply.planned_units(host, 32768)

    class Orphaned(FakeAgent):
        def call(self, req: Any) -> dict[str, Any]:
            answer = super().call(req)
            return {**answer, "orphan": True} if req.verb == "facts" else answer

    agents = [FakeAgent(units[0].text), Orphaned(units[1].text), FakeAgent(units[2].text)]
    monkeypatch.setattr(pdapply, "clients", fake_clients(agents))
    monkeypatch.setattr(session, "follow", lambda *a: pytest.fail("a dry run sent a change"))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    deploy.apply(Connection("pd"), Change(32768, dry_run=True), out, host)
    assert isinstance(out.stderr, io.StringIO)
    said = out.stderr.getvalue()
    assert f"{units[1].label} " in said and "recovery is pending" in said, said
    assert {r.verb for a in agents for r in a.asked} <= {"facts", "compare"}


def test_a_nodes_dry_run_sends_no_recovery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A [nodes] group's dry run: a node whose earlier change's agent died is said to be pending, and
    nothing but facts is sent (the group's apply recovered it before the dry run was looked at)."""
    import agent.apply as planned
    import agent.group.apply as group_apply
    from agent.inventory import load_service
    from tests.pure.test_group_inventory import BASE, NODES, write

    host = load_service("k2", write(tmp_path, "k2", BASE + NODES))
    asked: list[str] = []

    class Agent:
        def call(self, req: Any) -> dict[str, object]:
            asked.append(req.verb)
            return {"orphan": True}

    @contextlib.contextmanager
    def fake_clients(hosts: Any, _conn: Any) -> Iterator[list[Agent]]:
        yield [Agent() for _ in hosts]

    monkeypatch.setattr(group_apply, "clients", fake_clients)
    monkeypatch.setattr(group_apply, "as_facts", lambda answer: answer)
    monkeypatch.setattr(session, "follow", lambda *a: pytest.fail("a dry run sent a recovery"))
    monkeypatch.setattr(planned, "prepare", lambda *a: None)  # a dry run's prepare prints and sends nothing
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = group_apply.apply(host, Connection("k2"), Change(32768, dry_run=True), out)
    assert isinstance(out.stderr, io.StringIO)
    assert code == 0 and set(asked) == {"facts"}
    assert out.stderr.getvalue().count("recovery is pending") == 3, out.stderr.getvalue()
