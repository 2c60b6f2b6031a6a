"""`deployctl backups` and `deployctl facts` of a [pd] file, against fake agents: each unit asked as its own
unit over one connection per host, and printed per unit as the one-host commands print them (facts: with
the transfer facts of host/roles/pdfacts.py)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent.cli.main import main
from agent.inventory import HostConfig
from agent.output import Output
from agent.protocol.requests import Request
from tests.pure.test_pd import ROOT, example, host_of

MODEL = {
    "format": "deployctl-facts/1",
    "model": {
        "path": "/models/llama",
        "config": {"architectures": ["LlamaForCausalLM"]},
        "weights_bytes": 2**31,
    },
    "sglang": {"version": "0.5.23"},
    "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559.0} for i in (0, 1)],
    "flags": {"tp-size": 1},
    "draft": None,
}
PD = {
    "importable": ["mooncake"],
    "rdma_devices": ["mlx5_0"],
    "engine": {
        "backend": "mooncake",
        "verdict": "not_importable",
        "detail": "ImportError: libibverbs.so.1: cannot open shared object file: No such file or directory",
    },
}


def backup(name: str, changes: list[list[Any]]) -> dict[str, Any]:
    return {"name": name, "taken": "2026-12-06T10:00:00Z", "size": 900, "same_as_installed": False,
            "changes": changes}  # fmt: skip


class Host:
    """One host's agent: it answers for every unit on it, by the request's unit name."""

    def __init__(self) -> None:
        self.asked: list[Request] = []

    def call(self, req: Request) -> dict[str, Any]:
        self.asked.append(req)
        if req.verb == "backups":
            return {
                "backups": [backup(f"{req.unit}.20261206", [["api-key", "old", "new"], ["page-size", 1, 16]])]
            }
        if req.verb == "facts":
            return {"model_facts": json.loads(json.dumps(MODEL)), "pd": PD}
        raise AssertionError(f"{req.verb} sent to {req.unit}")


def fake(monkeypatch: pytest.MonkeyPatch, n_hosts: int = 1) -> list[Host]:
    import agent.group.pdinfo as pdinfo

    agents = [Host() for _ in range(n_hosts)]

    @contextlib.contextmanager
    def clients(hosts: Sequence[HostConfig], _conn: object) -> Iterator[list[Host]]:
        assert len(hosts) == n_hosts, [h.ssh.target for h in hosts]  # one connection per host
        yield agents

    monkeypatch.setattr(pdinfo, "clients", clients)
    return agents


def cli(*argv: str) -> tuple[int, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*argv, "--units", str(ROOT / "units")], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue() + out.stderr.getvalue()


def test_backups_lists_each_units_backups_grouped_by_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    (agent,) = fake(monkeypatch)
    code, text = cli("backups", "pd-1p1d")
    assert code == 0, text
    assert [(r.verb, r.unit) for r in agent.asked] == [
        ("backups", "llama-pd-prefill-0.service"),
        ("backups", "llama-pd-decode-0.service"),
        ("backups", "llama-pd-router.service"),
    ]
    heads = [line for line in text.splitlines() if "backup(s), newest first" in line]
    assert [h.split()[0] for h in heads] == ["prefill[0]", "decode[0]", "router"]
    assert "llama-pd-decode-0.service.20261206" in text.split("decode[0]")[1].split("router")[0]
    assert "--page-size: 1 in the backup, 16 installed" in text
    assert "old" not in text and "new installed" not in text  # a secret flag's values are not printed


def test_backups_json_is_one_object_per_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch)
    code, text = cli("backups", "pd-1p1d", "--json")
    doc = json.loads(text)
    assert code == 0 and doc["service"] == "pd-1p1d"
    assert [u["label"] for u in doc["units"]] == ["prefill[0]", "decode[0]", "router"]
    assert doc["units"][2]["unit"] == "llama-pd-router.service"
    assert doc["units"][0]["backups"][0]["name"] == "llama-pd-prefill-0.service.20261206"


def test_facts_prints_each_roles_facts_and_its_transfer_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    (agent,) = fake(monkeypatch)
    code, text = cli("facts", "pd-1p1d")
    assert code == 0, text
    assert [(r.verb, r.unit) for r in agent.asked] == [
        ("facts", "llama-pd-prefill-0.service"),
        ("facts", "llama-pd-decode-0.service"),
    ]  # the router serves no model: not asked
    heads = [line for line in text.splitlines() if line.startswith("facts for")]
    assert [h.split()[2] for h in heads] == ["prefill[0]", "decode[0]"]
    assert "  model    /models/llama: LlamaForCausalLM, weights 2.00 GiB" in text
    assert "  transfer installed: mooncake" in text
    assert "  rdma     mlx5_0" in text
    assert "mooncake: installed but not importable: ImportError: libibverbs.so.1" in text


def test_facts_json_carries_each_roles_document_and_pd_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch)
    code, text = cli("facts", "pd-1p1d", "--json")
    doc = json.loads(text)
    assert code == 0 and [u["label"] for u in doc["units"]] == ["prefill[0]", "decode[0]"]
    assert doc["units"][1]["facts"]["format"] == "deployctl-facts/1"
    assert doc["units"][1]["pd"]["engine"]["verdict"] == "not_importable"


def test_two_hosts_are_asked_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdinfo as pdinfo
    from agent.orchestrate.asked import Connection

    data = example()
    data["pd"]["decode"][0]["target"] = "other-host"
    host = host_of(data)
    agents = fake(monkeypatch, n_hosts=2)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert pdinfo.backups(host, Connection("pd"), out) == 0
    assert [r.unit for r in agents[0].asked] == ["llama-pd-prefill-0.service", "llama-pd-router.service"]
    assert [r.unit for r in agents[1].asked] == ["llama-pd-decode-0.service"]


def test_a_role_with_no_model_facts_is_said_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    (agent,) = fake(monkeypatch)
    monkeypatch.setattr(agent, "call", lambda req: {"model_facts": None, "pd": None})
    code, text = cli("facts", "pd-1p1d")
    assert code == 0
    assert "prefill[0]" in text and "no installed unit with a local model folder" in text
    assert "transfer not read" in text
