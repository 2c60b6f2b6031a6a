"""The inventory of a multi-node service, as one inventory per node: its SSH target and its --node-rank.

Every node runs the same unit but for --node-rank. Only node 0 serves HTTP (SGLang 0.5.23
entrypoints/engine.py: node ranks >= 1 run the schedulers and a placeholder /health that always answers
200), so the smoke test, the drain and the router belong to node 0 alone.
"""

from __future__ import annotations

from agent.inventory import HostConfig


def node_count(host: HostConfig) -> int:
    return len(host.node_targets)


def node_host(host: HostConfig, rank: int) -> HostConfig:
    """The inventory as node `rank` sees it (rank 0 for a single-host service is the host itself)."""
    if host.nodes is None:
        return host
    flags = {
        **host.sglang.flags,
        "nnodes": node_count(host),
        "node-rank": rank,
        "dist-init-addr": host.nodes.dist_init_addr,
    }
    update: dict[str, object] = {
        "name": f"{host.name}.rank{rank}",
        "ssh": host.ssh.model_copy(update={"target": host.node_targets[rank]}),
        "sglang": host.sglang.model_copy(update={"flags": flags, "port": _port(host, rank)}),
    }
    if rank > 0:  # nothing to smoke-test, drain or route: its /health is a placeholder
        update["smoke"] = host.smoke.model_copy(update={"enabled": False, "load": 0})
        update["drain"] = host.drain.model_copy(update={"enabled": False})
        update["router"] = type(host.router)()
    return host.model_copy(update=update)


def _port(host: HostConfig, rank: int) -> int:
    return host.port_on(host.node_targets[rank])


def node_hosts(host: HostConfig) -> list[HostConfig]:
    return [node_host(host, rank) for rank in range(node_count(host))]
