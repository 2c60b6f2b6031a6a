"""Socket and paramiko failures during connect, mapped to one-line ConnectErrors (transient or not)."""

from __future__ import annotations

import errno
import socket

import paramiko

from agent.errors import ConnectError
from agent.remote.ssh.config import SshTarget
from agent.remote.ssh.hostkeys import changed_key_error


class TransientConnectError(ConnectError):
    """A failure that may pass by itself (refused, timed out, reset): the only kind retried."""


def connect_error(label: str, hop: SshTarget, exc: BaseException) -> ConnectError:
    """The one mapping from socket and paramiko failures to a one-line ConnectError."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return changed_key_error(label, hop.address, hop.known_hosts, exc.key)
    if isinstance(exc, socket.gaierror):
        # EAI_AGAIN is a resolver that did not answer in time, not a name that does not exist.
        kind = TransientConnectError if exc.errno == socket.EAI_AGAIN else ConnectError
        return kind(f"{label}: cannot resolve host {hop.hostname!r}: {exc.strerror}")
    cause, transient = _cause(exc)
    kind = TransientConnectError if transient else ConnectError
    return kind(f"{label}: cannot connect to {hop.address}: {cause}")


_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset by peer",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network is unreachable",
    errno.ETIMEDOUT: "connection timed out",
    errno.ECONNABORTED: "connection aborted",
}


def _cause(exc: BaseException) -> tuple[str, bool]:
    """A short phrase for the cause, and whether it may pass by itself."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out", True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return _TRANSIENT_ERRNOS[exc.errno], True
    if isinstance(exc, paramiko.ChannelException):
        # The jump host could not open the forward: the next hop is down, refusing or unknown to it.
        return f"the jump host could not open a connection ({exc.text})", True
    if isinstance(exc, EOFError) or (isinstance(exc, paramiko.SSHException) and "banner" in str(exc)):
        return "connection closed during the SSH handshake", True
    if isinstance(exc, OSError):
        return exc.strerror or str(exc), False
    return f"SSH error: {exc}", False
