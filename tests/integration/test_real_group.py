"""The real SGLang 0.5.23 as one server over two test hosts (--nnodes 2 --tp-size 2, gloo over loopback):
adopted from its two hand-written units, then changed in one coordinated restart of both nodes.

Two things beyond the one-node recipe (measured, docs/testing.md): SGLANG_CPU_OMP_THREADS_BIND, which SGLang
asserts once there are more ranks than NUMA nodes (srt/utils/numa_utils.py), and TORCHDYNAMO_DISABLE=1: at
tp > 1 the vocabulary embedding is a torch.compile'd function, and dynamo asks the triton stand-in for its
backends (torch/utils/_triton.py), which no stand-in answers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.exitcodes import ExitCode
from agent.sglang.flags import parse_unit_flags
from tests import realhost
from tests.realhost import UNIT, UNIT_PATH, RealHost
from tests.testhost import HostSetup, TestHost, TestHostUnavailable, free_ports

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = [pytest.mark.integration, pytest.mark.real_sglang]
TARGETS = ("real-n0", "real-n1")
GROUP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0-1|0-1", "TORCHDYNAMO_DISABLE": "1", "OMP_NUM_THREADS": "1"}


@dataclass
class Pair:
    nodes: list[RealHost]  # by rank; each with its own port and the one units folder

    def stop(self) -> None:
        for node in self.nodes:
            node.host.stop()
        shutil.rmtree(self.nodes[0].work, ignore_errors=True)


def node_unit(rank: int, port: int, rendezvous: int) -> str:
    flags = f"--nnodes 2 --node-rank {rank} --tp-size 2 --dist-init-addr 127.0.0.1:{rendezvous}"
    text = realhost.hand_unit(port, env=GROUP_ENV)
    return text.replace(f"--port {port}", f"--port {port} \\\n    {flags}")


def boot_pair() -> Pair:
    why = realhost.missing()
    if why:
        raise TestHostUnavailable(why)
    work = Path(tempfile.mkdtemp(prefix="deployctl-realpair-"))
    units = work / "units"
    units.mkdir()
    *ports, rendezvous = free_ports(3)
    hosts: list[TestHost] = []
    try:
        for rank in range(2):
            files = {UNIT_PATH: (node_unit(rank, ports[rank], rendezvous).encode(), 0o644)}
            setup = HostSetup(files, enable_units=[UNIT], mount_agent=False, binds_ro=realhost.binds())
            hosts.append(TestHost.create(setup))
        config = "".join(
            f"Host {t}\n  HostName 127.0.0.1\n  Port {h.ssh_port}\n  User root\n  IdentityFile "
            f"{h.ssh_key_path}\n  UserKnownHostsFile {h.known_hosts_path}\n  IdentitiesOnly yes\n"
            for t, h in zip(TARGETS, hosts, strict=True)
        )
        (work / "ssh_config").write_text(config)
        env = {"DEPLOYCTL_UNITS": str(units), "DEPLOYCTL_SSH_CONFIG": str(work / "ssh_config")}
        nodes = [
            RealHost(
                h, work, units, work / "ssh_config", h.read(UNIT_PATH).decode(), ports[r], TARGETS[r], env
            )
            for r, h in enumerate(hosts)
        ]
        nodes[0].wait_ready()  # node 0 serves once node 1 joined its rendezvous
        return Pair(nodes)
    except BaseException:
        for h in hosts:
            h.stop()
        shutil.rmtree(work, ignore_errors=True)
        raise


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    try:
        p = boot_pair()
    except TestHostUnavailable as exc:
        pytest.skip(f"real SGLang unavailable: {exc}")
    try:
        yield p
    finally:
        p.stop()


def test_two_real_nodes_are_adopted_and_changed_in_one_restart_of_both(pair: Pair) -> None:
    n0, n1 = pair.nodes
    r = n0.deployctl("adopt", "pair", "--ssh", TARGETS[0], "--node", TARGETS[1])
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    path = n0.units_dir / "pair.toml"
    data = tomllib.loads(path.read_text())
    assert data["nodes"]["others"] == [TARGETS[1]] and data["nodes"]["ports"] == [n1.port]
    path.write_text(path.read_text() + "\n[smoke]\nrandom_weights = true\n")
    before = [n.invocation() for n in pair.nodes]
    t0 = time.monotonic()
    r = n0.deployctl("apply", "pair", "--context", "4096", "--set", "max-total-tokens=20000", "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    seconds = time.monotonic() - t0
    after = [n.invocation() for n in pair.nodes]
    assert all(a != b for a, b in zip(after, before, strict=True)) and len(n1.backups()) == 1
    for rank, node in enumerate(pair.nodes):
        flags = parse_unit_flags(node.unit_text())
        assert (flags["node-rank"], flags["max-total-tokens"]) == (str(rank), "20000")
        assert "KV Cache is allocated" in node.journal(invocation=after[rank])  # every rank's own pool line
    assert n0.pool() == 20000 and "smoke" in r.stdout + r.stderr
    said = [line for line in (r.stdout + r.stderr).splitlines() if "left after the stop" in line]
    print(f"two-node real apply: {seconds:.1f} s; {said or 'no process left after a stop'}")
