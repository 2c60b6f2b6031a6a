"""adopt of a multi-node service written by hand (one unit per node) into one inventory with [nodes]:
rendering it back gives every node its own hand-written command; a node that differs is refused."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agent.adopt import (
    Node,
    check_node_targets,
    choose_unit,
    inventory_text,
    nodes_inventory_text,
    pick_node_unit,
)
from agent.cli.main import main
from agent.errors import UsageError
from agent.exitcodes import ExitCode
from agent.group.nodes import node_hosts
from agent.host.adopt import _describe
from agent.inventory import NODE_FLAGS, load_service
from agent.output import Output
from agent.protocol.answers import InspectAnswer
from agent.render import render_unit, template_dir
from agent.sglang.flags import FlagValue, parse_flag_words, split_words, unit_lines
from agent.sglang.unitfile import read_unit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TARGETS = ("k2-a", "k2-b", "k2-c")
# One node's unit as written by hand; every node runs it with its own --node-rank (and maybe --port).
NODE = """[Unit]
Description=Kimi K2 over three hosts
After=network-online.target

[Service]
User=sglang
Environment=NCCL_SOCKET_IFNAME=eth0 HF_TOKEN=hf_s3cr3t
ExecStart=/opt/sglang/.venv/bin/python -m sglang.launch_server \\
    --model-path /models/Kimi-K2 --tp-size 24 --nnodes 3 --node-rank {rank} \\
    --dist-init-addr 10.0.0.1:20000 --trust-remote-code --host 0.0.0.0 --port {port} \\
    --mem-fraction-static 0.85
Restart=always
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
"""


def hand(rank: int, port: int = 30000) -> str:
    return NODE.format(rank=rank, port=port)


def argv_of(text: str) -> tuple[str, ...]:
    """ExecStart= as systemd reports it: unquoted, %% expanded."""
    values = [v for s, k, v in unit_lines(text) if (s, k) == ("Service", "ExecStart")]
    return tuple(split_words(values[0], dollars=False))


def answer(tmp_path: Path, text: str, name: str = "sglang.service") -> InspectAnswer:
    """The node's `inspect` answer (every node's unit file sits in the same folder, as on real hosts)."""
    unit = tmp_path / name
    unit.write_text(text)
    argv = argv_of(text)
    return {"candidates": [name], "units": {name: _describe(name, str(unit), (), [(argv[0], argv)])}}


def nodes_of(tmp_path: Path, texts: list[str]) -> list[Node]:
    return [
        Node(target, choose_unit(answer(tmp_path, text), None))
        for target, text in zip(TARGETS, texts, strict=False)
    ]


def adopt(tmp_path: Path, texts: list[str]) -> str:
    return nodes_inventory_text(
        "k2", True, nodes_of(tmp_path, texts), [{"name": "H200", "total_mib": "143771"}]
    )


def flags_of(text: str) -> dict[str, FlagValue]:
    return parse_flag_words(argv_of(text)[3:])


@pytest.mark.parametrize("ports", [(30000, 30000, 30000), (30000, 30001, 30002)])
def test_adopt_then_render_gives_every_node_its_hand_written_command(
    tmp_path: Path, ports: tuple[int, int, int]
) -> None:
    texts = [hand(rank, port) for rank, port in enumerate(ports)]
    toml = adopt(tmp_path, texts)
    data = tomllib.loads(toml)
    assert data["ssh"]["target"] == "k2-a"
    assert data["nodes"]["others"] == ["k2-b", "k2-c"] and data["nodes"]["dist_init_addr"] == "10.0.0.1:20000"
    assert data["nodes"].get("ports") == (None if len(set(ports)) == 1 else [30001, 30002])
    assert not set(data["sglang"]["flags"]) & {*NODE_FLAGS, "port"}
    units = tmp_path / "units"
    units.mkdir()
    (units / "k2.toml").write_text(toml)
    nodes = node_hosts(load_service("k2", units))
    assert [n.ssh.target for n in nodes] == list(TARGETS)
    for node, text in zip(nodes, texts, strict=True):
        rendered = render_unit(node, {}, template_dir())
        # the same flags with the same values (the node's own --nnodes, --node-rank, --dist-init-addr and
        # --port come last), the same executable, environment and user
        assert flags_of(rendered) == flags_of(text)
        assert argv_of(rendered)[:3] == argv_of(text)[:3]
        new, old = read_unit(rendered), read_unit(text)
        assert new.environment == old.environment and new.user == old.user
        # each node's own secret value moves, on that node, into its root-only file at the first apply
        assert node.unit.secret_environment_on_host == old.secret_environment == ["HF_TOKEN"]
        assert "EnvironmentFile=/etc/deployctl/secrets/sglang.service.env" in rendered
    assert "hf_s3cr3t" not in toml


def test_node_rank_0_may_leave_out_its_rank_and_nccl_init_addr_is_dist_init_addr(tmp_path: Path) -> None:
    first = hand(0).replace(" --node-rank 0", "").replace("--dist-init-addr", "--nccl-init-addr")
    toml = adopt(tmp_path, [first, hand(1), hand(2)])
    units = tmp_path / "units"
    units.mkdir()
    (units / "k2.toml").write_text(toml)
    rank0 = node_hosts(load_service("k2", units))[0]
    rendered = flags_of(render_unit(rank0, {}, template_dir()))
    # SGLang's defaults and aliases: the same server, written out in full
    assert rendered == {**flags_of(hand(0))}


def test_a_gpu_count_without_nvidia_smi_is_per_node(tmp_path: Path) -> None:
    toml = nodes_inventory_text("k2", False, nodes_of(tmp_path, [hand(0), hand(1), hand(2)]))
    assert tomllib.loads(toml)["gpus"]["count"] == 8 and "--tp-size / --nnodes" in toml


def _swap(old: str, new: str, rank: int = 1) -> list[str]:
    texts = [hand(r) for r in range(3)]
    texts[rank] = texts[rank].replace(old, new)
    return texts


@pytest.mark.parametrize(
    ("texts", "said"),
    [
        (
            _swap("--mem-fraction-static 0.85", "--mem-fraction-static 0.9"),
            r"node k2-b \(rank 1\) differs from node rank 0 \(k2-a\): --mem-fraction-static 0.9 here, 0.85 "
            "on rank 0",
        ),
        (
            _swap(" --trust-remote-code", "", 2),
            r"node k2-c \(rank 2\) differs .*--trust-remote-code missing here, given on rank 0",
        ),
        (_swap("eth0", "eth1", 2), "node k2-c .*: Environment NCCL_SOCKET_IFNAME eth1 here, eth0 on rank 0"),
        (_swap("User=sglang\n", ""), r"node k2-b .*: User= missing here, sglang on rank 0"),
        (_swap("Restart=always", "Restart=on-failure"), r"directive \[Service\] Restart=on-failure here"),
        (_swap("/opt/sglang/.venv", "/opt/other/.venv"), "executable /opt/other/.venv/bin/python -m"),
        (_swap("HF_TOKEN=hf_s3cr3t", "HF_KEY=x"), "secret variables HF_KEY here, HF_TOKEN on rank 0"),
        (_swap("--node-rank 1", "--node-rank 2"), r"node k2-b \(sglang.service\): --node-rank 2, but it is "),
        (_swap(" --node-rank 1", ""), "node k2-b .*: --node-rank missing, but it is given as node rank 1"),
        (_swap("10.0.0.1:20000", "10.0.0.2:20000", 2), "--dist-init-addr 10.0.0.2:20000, node rank 0 has 10"),
        (
            _swap("--nnodes 3", "--nnodes 4", 0),
            r"node k2-a .*: --nnodes 4, but 3 nodes are given \(--ssh and 2",
        ),
        ([hand(0), hand(1)], r"node k2-a .*: --nnodes 3, but 2 nodes are given \(--ssh and 1 --node\)"),
        (_swap(" --dist-init-addr 10.0.0.1:20000", "", 0), "node k2-a .*: no --dist-init-addr"),
        (
            [t.replace("10.0.0.1:20000", "10.0.0.1") for t in _swap("", "")],
            r"\[nodes\] dist_init_addr: .*HOST:PORT",
        ),
        (_swap("--port 30000", "--port 70000", 2), r"\[nodes\] ports\.1: "),
        (_swap("--tp-size 24", "--tp-size 24 --api-key sk-1"), "node k2-b: .*secret flags"),
    ],
)
def test_a_node_that_differs_is_refused_in_one_line_naming_it(
    tmp_path: Path, texts: list[str], said: str
) -> None:
    with pytest.raises(UsageError, match=said) as exc:
        adopt(tmp_path, texts)
    assert "\n" not in exc.value.message and "sk-1" not in exc.value.message


def test_a_node_whose_unit_has_another_name_is_refused(tmp_path: Path) -> None:
    nodes = nodes_of(tmp_path, [hand(0), hand(1), hand(2)])
    other = choose_unit(answer(tmp_path, hand(2), "sglang-k2.service"), None)
    with pytest.raises(UsageError, match=r"node k2-c \(rank 2\) differs .*: unit sglang-k2.service here"):
        nodes_inventory_text("k2", False, [*nodes[:2], Node("k2-c", other)])
    with pytest.raises(
        UsageError, match=r"node k2-c: no loaded unit sglang.service \(the unit of node rank 0\)"
    ):
        pick_node_unit(answer(tmp_path, hand(2), "sglang-k2.service"), "sglang.service", "k2-c")


def test_one_node_of_several_alone_is_refused_with_the_options_it_needs(tmp_path: Path) -> None:
    unit = choose_unit(answer(tmp_path, hand(0)), None)
    with pytest.raises(UsageError) as exc:
        inventory_text("k2", "k2-a", False, unit)
    assert exc.value.message == (
        "sglang.service runs node rank 0 of 3 (--nnodes 3): adopt reads every node, --ssh TARGET0 "
        "(node rank 0) --node TARGET1 --node TARGET2, in rank order"
    )
    # a single-node unit that says --nnodes 1 is adopted as before
    one = hand(0).replace("--nnodes 3 --node-rank 0", "--nnodes 1")
    assert "nnodes = 1" in inventory_text("k2", "k2-a", False, choose_unit(answer(tmp_path, one), None))


def test_node_targets_are_distinct_from_ssh_and_each_other() -> None:
    with pytest.raises(UsageError, match="--node k2-a: it is --ssh, node rank 0"):
        check_node_targets("k2-a", ["k2-b", "k2-a"])
    with pytest.raises(UsageError, match="--node k2-b is given twice"):
        check_node_targets("k2-a", ["k2-b", "k2-b"])


class FakeClient:
    """The agent on each node: answers inspect and facts, and records every verb asked."""

    answers: ClassVar[dict[str, InspectAnswer]] = {}
    verbs: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, _transport: object, host: Any) -> None:
        self.target = host.ssh.target

    def call(self, req: Any) -> dict[str, Any]:
        self.verbs.append((self.target, req.verb))
        if req.verb == "facts":
            return {"gpus": [{"name": "H200", "total_mib": "143771"}] * 8}
        return dict(self.answers[self.target])


class FakeTransport:
    def close(self) -> None:
        pass


def test_the_command_reads_every_node_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent.remote.client as client

    FakeClient.verbs = []
    FakeClient.answers = {}
    for rank, target in enumerate(TARGETS):
        folder = tmp_path / target
        folder.mkdir()
        FakeClient.answers[target] = answer(folder, hand(rank))
    monkeypatch.setattr(client, "AgentClient", FakeClient)
    monkeypatch.setattr(client, "open_transport", lambda host, accept=False: FakeTransport())
    out = io.StringIO()
    argv = ["adopt", "k2", "--ssh", "k2-a", "--node", "k2-b", "--node", "k2-c", "--units", str(tmp_path)]
    # the hosts' unit files sit in folders of their own here: the unit folder differs, and is refused
    assert main(argv, Output(out, err := io.StringIO())) == ExitCode.USAGE
    assert "unit folder" in err.getvalue()
    for rank, target in enumerate(TARGETS):
        FakeClient.answers[target] = answer(tmp_path, hand(rank))
    FakeClient.verbs = []
    assert main(argv, Output(out, io.StringIO())) == 0
    assert FakeClient.verbs == [
        ("k2-a", "inspect"),
        ("k2-a", "facts"),
        ("k2-b", "inspect"),
        ("k2-c", "inspect"),
    ]
    assert "from k2-a (node rank 0) and k2-b, k2-c into" in out.getvalue()
    host = load_service("k2", tmp_path)
    assert host.node_targets == TARGETS and host.gpus.count == 8
    # one node alone is refused before anything is written
    (tmp_path / "k2.toml").unlink()
    err = io.StringIO()
    assert main([*argv[:4], "--units", str(tmp_path)], Output(out, err)) == ExitCode.USAGE
    assert "--node TARGET1 --node TARGET2" in err.getvalue() and not (tmp_path / "k2.toml").exists()
