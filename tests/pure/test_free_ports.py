"""Test hosts share this machine's network: their ports must not be ones an outgoing connection can take.

A CI run saw real SGLang find its own HTTP port taken ("[Errno 98] address already in use") after a restart:
the port came from binding port 0, i.e. from the kernel's ephemeral range, where every outgoing TCP
connection on the machine (SGLang's own torch store and gloo links during start-up among them) picks its
local port.
"""

from __future__ import annotations

import socket
from pathlib import Path

from tests.testhost.instance import free_ports


def _ephemeral() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    low, _ = _ephemeral()
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(1024 <= p < low for p in ports), ports
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_handed_out() -> None:
    taken = []
    for port in free_ports(200):
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        taken.append(sock)
    try:
        held = {s.getsockname()[1] for s in taken}
        assert not held & set(free_ports(200))
    finally:
        for sock in taken:
            sock.close()
