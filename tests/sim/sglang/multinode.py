"""Multi-node serving as SGLang 0.5.23 does it (--nnodes, --node-rank, --dist-init-addr).

Node 0 listens at --dist-init-addr as torch's TCPStore does and waits for the other nodes; each of them
connects (retrying) and says its rank. The connections stay open for the server's life: start-up goes in
lockstep over them (SGLang min-reduces the free memory over all ranks before it sizes the pool), and a node
that goes away is seen as gloo sees it, a connection closed by the peer. There is no heartbeat once serving
(SGLang issues #3099, #4780): node 0 notices a lost node only in its next collective.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

# torch/csrc/distributed/c10d gloo backend: the line a rank raises when its peer's socket closes
GLOO_CLOSED = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "


class PeerLost(Exception):
    """The other side of a node link closed: gloo's "Connection closed by peer"."""

    def __init__(self, peer: str) -> None:
        super().__init__(peer)
        self.peer = peer


class RendezvousFailed(Exception):
    """The rendezvous did not complete; the message is torch's error line."""


def gloo_error(peer: str) -> str:
    """gloo's error for a closed peer, as `[host]:port`."""
    host, _, port = peer.rpartition(":")
    return f"{GLOO_CLOSED}[{host}]:{port}"


def parse_addr(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as SGLang's NetworkAddress.parse reads --dist-init-addr."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class Link:
    """One node-to-node connection and the peer's address as gloo names it."""

    sock: socket.socket
    reader: BinaryIO
    peer: str

    def send(self, message: str) -> None:
        self.sock.sendall(message.encode() + b"\n")

    def receive(self) -> str:
        """The next message; PeerLost when the other side closed (or reset) the connection."""
        try:
            line = self.reader.readline()
        except OSError:
            line = b""
        if not line:
            raise PeerLost(self.peer)
        return line.decode().strip()


def link(sock: socket.socket, addr: tuple[str, int]) -> Link:
    return Link(sock, sock.makefile("rb"), f"{addr[0]}:{addr[1]}")


class Leader:
    """Node 0: the store's server side."""

    def __init__(self, addr: tuple[str, int], nnodes: int, timeout: float) -> None:
        self.nnodes, self.timeout = nnodes, timeout
        self.links: list[Link] = []
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        try:
            self.server = socket.create_server(addr, family=family)
        except OSError as exc:
            raise RendezvousFailed(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                f"network address. port: {addr[1]}, useIpv6: false, code: -{exc.errno}, name: EADDRINUSE, "
                "message: address already in use"
            ) from exc

    def gather(self, per_node: int) -> None:
        """Wait for the other nodes; RendezvousFailed with torch's store error when they do not all come."""
        deadline = time.monotonic() + self.timeout
        while len(self.links) < self.nnodes - 1:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                self.server.settimeout(left)
                sock, addr = self.server.accept()
                sock.settimeout(max(left, 1.0))
                peer = link(sock, addr)
                if peer.receive().startswith("rank "):
                    sock.settimeout(None)
                    self.links.append(peer)
            except (TimeoutError, PeerLost):
                if time.monotonic() < deadline:
                    continue
                joined, total = (len(self.links) + 1) * per_node, self.nnodes * per_node
                self.server.close()
                raise RendezvousFailed(
                    "torch.distributed.DistStoreError: Timed out after "
                    f"{round(self.timeout)} seconds waiting for clients. {joined}/{total} clients joined."
                ) from None
        self.server.close()  # a node that comes late finds no one and times out connecting

    def barrier(self, name: str, value: int = 0) -> int:
        """Wait for every node at `name`; the minimum of their values goes back to all (an all-reduce MIN)."""
        least = value
        for peer in self.links:
            while not (message := peer.receive()).startswith(f"at {name} "):
                pass
            least = min(least, int(message.split()[-1]))
        for peer in self.links:
            peer.send(f"go {name} {least}")
        return least

    def lost(self) -> bool:
        """Whether a node's connection has closed, looked at when a collective needs every node (nothing is
        sent between the nodes while serving, so a peek finds either nothing or the end)."""
        for peer in self.links:
            try:
                if peer.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return True
            except BlockingIOError:
                continue
            except OSError:
                return True
        return False

    def warmed_up(self) -> None:
        """The warmup's forward pass ran on every node (what a node >= 1 counts DIE_AFTER_S from)."""
        for peer in self.links:
            with contextlib.suppress(OSError):
                peer.send("warmed_up")

    def shutdown(self) -> None:
        """The ShutdownReq broadcast (tokenizer_manager.py sigterm_watchdog): every node's schedulers stop."""
        for peer in self.links:
            try:
                peer.send("shutdown")
                peer.sock.close()
            except OSError:
                pass


class Follower:
    """A node >= 1: the store's client side."""

    def __init__(self, addr: tuple[str, int], rank: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection(addr, timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise RendezvousFailed(
                        "torch.distributed.DistNetworkError: The client socket has timed out after "
                        f"{round(timeout * 1000)}ms while trying to connect to ({addr[0]}, {addr[1]})."
                    ) from None
                time.sleep(0.2)
        sock.settimeout(None)
        self.leader = link(sock, addr)
        self.leader.send(f"rank {rank}")

    def barrier(self, name: str, value: int = 0) -> int:
        self.leader.send(f"at {name} {value}")
        while not (message := self.leader.receive()).startswith(f"go {name} "):
            pass
        return int(message.split()[-1])

    def follow(self, on_warmed_up: Callable[[], None]) -> bool:
        """Block until node 0 ends: True for its ShutdownReq broadcast, False for a closed connection."""
        try:
            while (message := self.leader.receive()) != "shutdown":
                if message == "warmed_up":
                    on_warmed_up()
        except PeerLost:
            return False
        return True
