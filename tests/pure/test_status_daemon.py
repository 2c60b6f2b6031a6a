"""`deployctl status` of an engine with a weight-cache daemon: the daemon's state is shown, and an engine
that is down while its daemon runs (a daemon crash stopped it, or a person did) is said to serve nothing."""

from __future__ import annotations

import itertools

import pytest

from agent.orchestrate.session import status_text

STATES = ["active", "activating", "reloading", "inactive", "failed", "deactivating"]


def _answer(engine: str, daemon: str | None) -> dict[str, object]:
    answer: dict[str, object] = {"state": {"active_state": engine, "sub_state": "x"}, "last_txn": None}
    if daemon is not None:
        answer["daemon"] = {"unit": "sglang-weight-cache.service", "active_state": daemon, "sub_state": "y"}
    return answer


@pytest.mark.parametrize(("engine", "daemon"), list(itertools.product(STATES, [*STATES, None])))
def test_a_stopped_engine_beside_a_running_daemon_is_flagged(engine: str, daemon: str | None) -> None:
    text = status_text("ct200", "sglang.service", _answer(engine, daemon))  # type: ignore[arg-type]
    flagged = "serves nothing" in text
    assert flagged == (daemon == "active" and engine in ("inactive", "failed", "deactivating"))
    if flagged:
        assert "systemctl start sglang.service" in text
    assert ("weight-cache daemon sglang-weight-cache.service: " in text) == (daemon is not None)


def test_no_daemon_line_without_a_daemon_unit() -> None:
    text = status_text("ct200", "sglang.service", _answer("active", None))  # type: ignore[arg-type]
    assert text.splitlines() == ["ct200 sglang.service: active/x"]
