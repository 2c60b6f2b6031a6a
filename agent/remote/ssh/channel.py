"""Drive one exec channel: feed stdin, read stdout and stderr together, tell an exit from a dropped link."""

from __future__ import annotations

import select
import time

import paramiko

from agent.remote.transport import Source

CHUNK = 65536
SEND_POLL_S = 0.05  # while stdin is pending, wake up this often to see if the window opened
IDLE_POLL_S = 1.0


class ChannelTimeout(Exception):
    """The deadline passed before the command ended."""


class ChannelDropped(Exception):
    """The channel closed with no exit status while its transport died."""


def pump(
    chan: paramiko.Channel, input: bytes | None, deadline: float | None, keep_open: bool = False
) -> Source:
    """Yield stdout chunks as they come; return (rc, stderr). rc -1 means killed by a signal.

    stdin gets `input`, then EOF; with `keep_open` (and no input) stdin stays open: the caller sends on
    the channel itself (a conversation).
    """
    # Both streams share one flow-control window: stdout and stderr must be read in the same loop,
    # or a command that fills stderr stalls while we wait on stdout.
    stderr = bytearray()
    pending = memoryview(input) if input else None
    if pending is None and not keep_open:
        chan.shutdown_write()
    wakeup = chan.fileno()  # paramiko signals this pipe for stdout data, stderr data, EOF and close
    try:
        while not (chan.eof_received or chan.closed):
            if pending is not None and chan.send_ready():
                pending = _send(chan, pending)
            while chan.recv_stderr_ready():
                stderr += chan.recv_stderr(CHUNK)
            if chan.recv_ready():
                yield chan.recv(CHUNK)
                continue
            select.select([wakeup], [], [], _wait(deadline, pending is not None))
        # Data that arrived just before the EOF is still buffered: hand it over before finishing.
        while chan.recv_ready():
            yield chan.recv(CHUNK)
        rc = _exit_status(chan, deadline)
        while chan.recv_stderr_ready():
            stderr += chan.recv_stderr(CHUNK)
        return (rc, bytes(stderr))
    finally:
        chan.close()


def _send(chan: paramiko.Channel, pending: memoryview) -> memoryview | None:
    """Send what the window allows; None once all of stdin is sent and EOF is signalled."""
    try:
        sent = chan.send(bytes(pending[:CHUNK]))
    except OSError:
        return None  # the channel closed under us; the exit-status check below says why
    rest = pending[sent:]
    if rest:
        return rest
    chan.shutdown_write()
    return None


def _wait(deadline: float | None, sending: bool) -> float:
    limit = SEND_POLL_S if sending else IDLE_POLL_S
    if deadline is None:
        return limit
    left = deadline - time.monotonic()
    if left <= 0:
        raise ChannelTimeout()
    return min(limit, left)


def _exit_status(chan: paramiko.Channel, deadline: float | None) -> int:
    # EOF comes before exit-status on the wire, and a command may close stdout and keep running.
    while not chan.status_event.wait(_wait(deadline, False)):
        pass
    if chan.exit_status != -1:
        return int(chan.exit_status)
    transport = chan.get_transport()
    # The transport records why it stopped before it closes its channels, so check that first:
    # is_active() may still say True for a moment after the channel learned of the drop.
    if transport.saved_exception is not None or not transport.is_active():
        raise ChannelDropped()
    return -1  # closed cleanly without exit-status: OpenSSH sent exit-signal, which paramiko ignores
