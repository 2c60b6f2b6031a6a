"""SshTransport: the Transport port over paramiko, with known_hosts checks, ProxyJump and bounded retries."""

from __future__ import annotations

import contextlib
import logging
import secrets
import shlex
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import TracebackType

import paramiko
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from agent.errors import ConnectError, RemoteError
from agent.remote.ssh.auth import KeyAuth
from agent.remote.ssh.channel import ChannelDropped, ChannelTimeout, pump
from agent.remote.ssh.config import SshTarget, default_config_path, load_config, resolve
from agent.remote.ssh.failures import TransientConnectError, connect_error
from agent.remote.ssh.hostkeys import KnownHostsPolicy, load_known_hosts
from agent.remote.transport import CommandTimedOut, ConnectionLost, Result, Source, Stream, remote_command

KEEPALIVE_S = 15
# With keepalives flowing, data unacknowledged this long means the peer is gone: the kernel then
# fails the socket and the stream raises ConnectionLost instead of hanging for TCP's ~15 minutes.
TCP_USER_TIMEOUT_MS = 60_000
log = logging.getLogger("deployctl.ssh")


@dataclass(frozen=True)
class ConnectRetry:
    """How hard to try a connect: attempts in all, and the exponential backoff between them."""

    attempts: int = 3
    initial_delay_s: float = 0.5
    max_delay_s: float = 8.0
    timeout_s: float = 10.0  # per attempt: TCP connect, banner and authentication each


@dataclass(frozen=True)
class SshSettings:
    """How to reach a host and what to trust there: the ssh config and known_hosts files, trusting an
    unknown host key once, sudo for every command, the connect retries, and keys from ssh-agent."""

    config_path: Path | None = None  # None: ~/.ssh/config
    known_hosts: Path | None = None  # an explicit file replaces every UserKnownHostsFile, for all hops
    accept_new: bool = False
    sudo: bool = False
    retry: ConnectRetry = ConnectRetry()
    allow_agent: bool = True


class SshTransport:
    """One SSH connection (through any ProxyJump hops) to one host."""

    def __init__(
        self, target: str, settings: SshSettings = SshSettings(), *, name: str | None = None
    ) -> None:
        self._config = load_config(settings.config_path or default_config_path())
        resolved = resolve(target, self._config)
        if settings.known_hosts is not None:
            resolved = _with_known_hosts(resolved, settings.known_hosts)
        self.target = resolved
        self._final = resolved.hop()
        self.name = name or resolved.alias
        self.accept_new = settings.accept_new
        self.sudo = settings.sudo
        self.retry = settings.retry
        self.allow_agent = settings.allow_agent
        self._clients: list[paramiko.SSHClient] = []

    def describe(self) -> str:
        via = ",".join(hop.alias for hop in self.target.jumps)
        return self.target.describe() + (f" via {via}" if via else "")

    def connect(self) -> SshTransport:
        """Connect now if not yet connected; transient failures are retried, then reported in one line."""
        if not self._clients:
            self._clients = self._connect_with_retries()
        return self

    def _connect_with_retries(self) -> list[paramiko.SSHClient]:
        attempts = 0

        def attempt() -> list[paramiko.SSHClient]:
            nonlocal attempts
            attempts += 1
            return self._connect_chain()

        retrying = Retrying(
            retry=retry_if_exception_type(TransientConnectError),
            stop=stop_after_attempt(max(1, self.retry.attempts)),
            wait=wait_exponential(multiplier=self.retry.initial_delay_s, max=self.retry.max_delay_s),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except TransientConnectError as exc:
            if attempts == 1:
                raise
            raise ConnectError(f"{exc.message} (after {attempts} attempts)", hint=exc.hint) from exc

    def _log_retry(self, state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        upcoming = state.attempt_number + 1
        log.info("%s; retrying in %.1fs (attempt %d of %d)", failure, delay, upcoming, self.retry.attempts)

    def _connect_chain(self) -> list[paramiko.SSHClient]:
        hops = (*self.target.jumps, self._final)
        clients: list[paramiko.SSHClient] = []
        try:
            sock: socket.socket | paramiko.Channel = self._open_socket(hops[0])
            for i, hop in enumerate(hops):
                clients.append(self._handshake(hop, sock))
                if i + 1 < len(hops):
                    sock = self._open_hop_channel(clients[-1], hops[i + 1])
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        return clients

    def _label(self, hop: SshTarget) -> str:
        """How errors name a hop: the host's name, plus which jump host when it is not the last hop."""
        return self.name if hop is self._final else f"{self.name} (jump host {hop.alias})"

    def _open_socket(self, hop: SshTarget) -> socket.socket:
        try:
            sock = socket.create_connection((hop.hostname, hop.port), timeout=self.retry.timeout_s)
        except OSError as exc:
            raise connect_error(self._label(hop), hop, exc) from exc
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux only
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)
        return sock

    def _open_hop_channel(self, via: paramiko.SSHClient, hop: SshTarget) -> paramiko.Channel:
        try:
            return _active(via).open_channel(
                "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=self.retry.timeout_s
            )
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise connect_error(self._label(hop), hop, exc) from exc

    def _handshake(self, hop: SshTarget, sock: socket.socket | paramiko.Channel) -> paramiko.SSHClient:
        label = self._label(hop)
        client = paramiko.SSHClient()
        policy = self._host_key_policy(hop, client)
        client.set_missing_host_key_policy(policy)
        auth = KeyAuth(hop.user, hop.identity_files, use_agent=self.allow_agent and not hop.identities_only)
        timeout = self.retry.timeout_s
        try:
            client.connect(
                hop.hostname, hop.port, username=hop.user, sock=sock, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout, auth_strategy=auth,
            )  # fmt: skip
        except BaseException as exc:
            client.close()
            sock.close()
            revoked = policy.revoked_error(exc.key) if isinstance(exc, paramiko.BadHostKeyException) else None
            if revoked is not None:  # a revoked key where another was recorded: say revoked, not changed
                raise revoked from exc
            if isinstance(exc, paramiko.AuthenticationException):
                tried = auth.describe_tried()
                raise ConnectError(
                    f"{label}: authentication failed for {hop.describe()} (tried keys: {tried})",
                    hint="check IdentityFile in the ssh config, or add the key to ssh-agent",
                ) from exc
            if isinstance(exc, Exception):
                raise connect_error(label, hop, exc) from exc
            raise
        _active(client).set_keepalive(KEEPALIVE_S)
        return client

    def _host_key_policy(self, hop: SshTarget, client: paramiko.SSHClient) -> KnownHostsPolicy:
        """Load hop's known_hosts into client; the policy for keys not there, honouring HashKnownHosts."""
        revoked = load_known_hosts(client.get_host_keys(), hop.known_hosts)
        # SshTarget does not carry HashKnownHosts; the hop's alias is what resolve() looked up too.
        hashed = self._config.lookup(hop.alias).get("hashknownhosts", "no").lower() == "yes"
        return KnownHostsPolicy(self._label(hop), hop, self.accept_new, revoked=revoked, hash_names=hashed)

    def _session(self) -> paramiko.Channel:
        client = self.connect()._clients[-1]
        try:
            return _active(client).open_session(timeout=self.retry.timeout_s)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost("opening a session") from exc

    def _lost(self, doing: str) -> ConnectionLost:
        return ConnectionLost(f"{self.name}: connection to {self.target.address} lost while {doing}")

    def run(self, argv: Sequence[str], input: bytes | None = None, timeout: float | None = None) -> Result:
        source = self._drive(self._start(argv), argv, input, timeout)
        stdout = bytearray()
        while True:
            try:
                stdout += next(source)
            except StopIteration as end:
                rc, stderr = end.value
                return Result(tuple(argv), rc, bytes(stdout), stderr)

    def stream(self, argv: Sequence[str], input: bytes | None = None) -> Stream:
        return Stream(argv, self._drive(self._start(argv), argv, input, None))

    def converse(self, argv: Sequence[str], first: bytes, timeout: float | None = None) -> Stream:
        chan = self._start(argv)
        stdin = _ChannelInput(chan, lambda: self._lost(f"talking to {shlex.join(argv)}"))
        stdin.send(first)  # now, not when the output is first read: the command starts on it meanwhile
        return Stream(argv, self._drive(chan, argv, None, timeout, keep_open=True), stdin)

    def _start(self, argv: Sequence[str]) -> paramiko.Channel:
        chan = self._session()
        try:
            chan.exec_command(remote_command(argv, self.sudo))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise self._lost(f"starting {shlex.join(argv)}") from exc
        return chan

    def _drive(
        self, chan: paramiko.Channel, argv: Sequence[str], input: bytes | None, timeout: float | None,
        *, keep_open: bool = False,
    ) -> Source:  # fmt: skip
        deadline = None if timeout is None else time.monotonic() + timeout  # run() reads at once
        try:
            return (yield from pump(chan, input, deadline, keep_open))
        except ChannelTimeout as exc:
            raise CommandTimedOut(
                f"{self.name}: command {shlex.join(argv)} did not finish within {timeout:g}s"
            ) from exc
        except (ChannelDropped, paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(f"running {shlex.join(argv)}") from exc

    def put(self, data: bytes, path: str, mode: int) -> None:
        """Write data to path via SFTP: a temporary name in the same folder, chmod, then rename over path."""
        remote = PurePosixPath(path)
        tmp = str(remote.with_name(f".{remote.name}.{secrets.token_hex(4)}.tmp"))
        try:
            sftp = self.connect()._clients[-1].open_sftp()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(f"opening SFTP to write {path}") from exc
        try:
            with sftp.open(tmp, "wb") as out:
                out.chmod(mode)  # before the data, so the content is never readable with looser bits
                out.set_pipelined(True)
                out.write(data)
            sftp.posix_rename(tmp, path)
        except OSError as exc:
            _remove_quietly(sftp, tmp)
            reason = exc.strerror or str(exc)
            raise RemoteError(f"{self.name}: cannot write {path} on {self.target.address}: {reason}") from exc
        except (paramiko.SSHException, EOFError) as exc:
            raise self._lost(f"writing {path}") from exc
        finally:
            sftp.close()

    def close(self) -> None:
        for client in reversed(self._clients):
            client.close()
        self._clients = []

    def __enter__(self) -> SshTransport:
        return self.connect()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _ChannelInput:
    """A conversation's stdin on an exec channel; a dropped link raises ConnectionLost."""

    def __init__(self, chan: paramiko.Channel, lost: Callable[[], ConnectionLost]) -> None:
        self.chan = chan
        self.lost = lost

    def send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self.lost() from exc

    def end(self) -> None:
        with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
            self.chan.shutdown_write()  # a channel already gone needs no EOF


def _active(client: paramiko.SSHClient) -> paramiko.Transport:
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise paramiko.SSHException("SSH session not active")
    return transport


def _with_known_hosts(target: SshTarget, path: Path) -> SshTarget:
    jumps = tuple(replace(hop, known_hosts=(path,)) for hop in target.jumps)
    return replace(target, known_hosts=(path,), jumps=jumps)


def _remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    # The temporary file may never have been created, or the link is gone: nothing more to do then.
    with contextlib.suppress(OSError, paramiko.SSHException):
        sftp.remove(path)
