"""A run that crashes still writes its metrics: the README's DeployctlRunFailed alert needs `agent_error`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.host import runner
from agent.host.change import orphans
from agent.host.state import StateDir
from agent.protocol.requests import Request

TXN = "20261203T120000Z-abcdef"


class BrokenBus:
    """systemd's bus as a bug or a dead dbus-daemon leaves it: every use raises."""

    def __enter__(self) -> BrokenBus:
        raise RuntimeError("the bus went away")

    def __exit__(self, *exc: object) -> None:
        return None


def test_an_agent_error_writes_its_outcome_to_the_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOYCTL_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(runner, "Systemd", BrokenBus)
    monkeypatch.setattr(orphans, "Systemd", BrokenBus)
    prom = tmp_path / "textfiles" / "deployctl_sglang.service.prom"
    req = replace(
        Request(verb="recover", state_dir=str(tmp_path / "state"), unit_dir=str(tmp_path / "units")),
        host_name="h1",
        metrics_file=str(prom),
    )
    state = StateDir(req.state_dir)
    state.txn_dir(TXN).mkdir(parents=True)
    (state.txn_dir(TXN) / "request.json").write_text(req.to_json())

    with pytest.raises(RuntimeError, match="the bus went away"):
        runner.run(req.state_dir, TXN)

    text = prom.read_text()
    assert 'deployctl_last_run_outcome{host="h1",unit="sglang.service",outcome="agent_error"} 1' in text
    assert 'deployctl_last_run_exit_code{host="h1",unit="sglang.service"} 1' in text
    assert '"outcome": "agent_error"' in state.events_path(TXN).read_text()
