"""The laptop's handle on a host's agent: bring the bundle, call a verb, stream a transaction's events."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agent.errors import ConnectError, RemoteError
from agent.inventory import HostConfig
from agent.protocol.common import ProtocolError
from agent.protocol.events import Event, Stage
from agent.protocol.requests import Request, Smoke, Timeouts, conversation_bound_s
from agent.remote import bundle
from agent.remote.ssh.transport import ConnectRetry, SshSettings, SshTransport
from agent.remote.transport import LocalTransport, Result, Stream, Transport, tail_lines


def open_transport(host: HostConfig, accept_new_host_key: bool = False) -> Transport:
    """'local' runs the agent on this machine; anything else is an SSH target (alias or user@host[:port])."""
    if host.ssh.target == "local":
        return LocalTransport(sudo=host.ssh.sudo)
    retry = ConnectRetry(attempts=host.ssh.connect_attempts, timeout_s=host.ssh.connect_timeout_s)
    settings = SshSettings(accept_new=accept_new_host_key, sudo=host.ssh.sudo, retry=retry)
    ssh = SshTransport(host.ssh.target, settings, name=host.name)
    return ssh.connect()


def base_request(host: HostConfig, verb: str, **fields: Any) -> Request:
    """A Request for `verb` with everything the inventory says about this host's unit."""
    # A wildcard bind is reached on loopback of its own family: 0.0.0.0 takes IPv4 only, so 127.0.0.1; `::`
    # on Linux also takes IPv4 unless net.ipv6.bindv6only is set, and only ::1 works in both cases.
    http_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host.sglang.host, host.sglang.host)
    req = Request(
        verb=verb,
        unit=host.unit.name,
        unit_dir=host.unit.directory,
        state_dir=host.ssh.agent_dir,
        margin=host.planning.margin,
        http_host=http_host,
        port=host.sglang.port,
        smoke=_smoke(host),
        timeouts=Timeouts(**host.timeouts.model_dump()),
        keep_backups=host.unit.keep_backups,
        secret_names=tuple(host.unit.secret_environment),
        secrets_dir=host.unit.secrets_directory,
        keep_secret_env=tuple(host.unit.secret_environment_on_host),
        host_name=host.name,
        metrics_file=host.metrics.file_for(host.unit.name),
        prewarm=host.prewarm.enabled,
        prewarm_margin_gib=host.prewarm.margin_gib,
        drain=host.drain.enabled,
        drain_timeout_s=host.drain.timeout_s,
        drain_stop_allowance_s=host.drain.stop_allowance_s,
        router_url=host.router.url,
        router_worker_url=host.router.worker_url,
        router_timeout_s=host.router.timeout_s,
        **fields,
    )
    try:
        req.validate()
    except ProtocolError as exc:
        raise RemoteError(f"internal: invalid request: {exc}") from None
    return req


@dataclass
class AgentClient:
    transport: Transport
    host: HostConfig
    _argv: list[str] = field(default_factory=list)

    def ensure(self) -> list[str]:
        """How to call the agent: the bundle named by its sha256, which checks its own bytes on every run.

        Always `python -I`: isolated from the caller's folder, PYTHONPATH and user site, so no file
        planted where the operator stands (or in their environment) is imported, as root under sudo.
        """
        if not self._argv:
            if isinstance(self.transport, LocalTransport):
                self._argv = [sys.executable, "-I", "-m", "agent.host"]
            else:
                path, sha = self._bundle_path()
                self._argv = [self.host.ssh.python, "-I", path, "--sha256", sha]
        return self._argv

    def _bundle_path(self) -> tuple[str, str]:
        """Where the bundle lives on the host, and its sha256."""
        _, sha = bundle.build()
        return f"{self.host.ssh.agent_dir}/bin/{bundle.remote_name(sha)}", sha

    def refresh(self) -> None:
        """Install the bundle (missing, damaged or an other version on the host), checked before it is used.

        The bytes go over the command's stdin to a small writer (bundle.WRITER) run as the agent will be
        (through sudo when the inventory says so): no staging file under a name another user could plant
        something at, no SFTP, and the writer renames the file into place only once its checksum matches.
        """
        data, _ = bundle.build()
        path, sha = self._bundle_path()
        argv = [self.host.ssh.python, "-I", "-c", bundle.WRITER, path, sha]
        res = self.transport.run(argv, input=data, timeout=120)
        if not res.ok:
            raise RemoteError(
                f"{self.host.name}: cannot install the agent bundle at {path}: {_last(res.stderr)}"
            )

    def _bundle_broken(self, res: Result) -> bool:
        """After a failed call: is the bundle on the host missing or not the one we built?

        A damaged zipapp can fail in any way (Python even runs a truncated one as a script), so the
        failure itself says little: the file's checksum decides. A healthy call costs no extra trip.
        """
        if isinstance(self.transport, LocalTransport) or res.ok:
            return False
        if res.rc == bundle.BAD_BUNDLE:
            return True
        path, sha = self._bundle_path()
        have = self.transport.run(["sha256sum", path], timeout=30)
        return not (have.ok and have.stdout.split(b" ")[0].decode() == sha)

    def call(self, req: Request) -> dict[str, Any]:
        """A read-only verb: one JSON object back."""
        argv, payload = [*self.ensure(), req.verb], req.to_json().encode()
        res = self.transport.run(argv, input=payload, timeout=120)
        if self._bundle_broken(res):
            self.refresh()
            res = self.transport.run(argv, input=payload, timeout=120)
        if not res.ok:
            raise RemoteError(f"{self.host.name}: agent {req.verb} failed: {_last(res.stderr)}")
        lines = res.stdout.decode("utf-8", "replace").strip().splitlines()
        return _answer(self.host.name, req.verb, lines[-1] if lines else "")

    def events(self, req: Request) -> Iterator[Event]:
        """A changing verb: its events as they happen (ConnectionLost if the link drops)."""
        stream = self.transport.stream([*self.ensure(), req.verb], input=req.to_json().encode())
        with stream:
            yield from self._events(stream, stream.lines(), req.verb)

    def _events(self, stream: Stream, lines: Iterator[str], verb: str) -> Iterator[Event]:
        for line in lines:
            try:
                yield Event.from_json(line)
            except (ValueError, TypeError, ProtocolError):
                yield unreadable(line)  # never dropped silently: an older agent or a stray print
        result = stream.result()
        if result.rc not in (0, 2, 3, 4, 5, 6, 7):
            raise RemoteError(
                f"{self.host.name}: agent {verb} failed (rc {result.rc}): {_last(result.stderr)}"
            )

    @contextlib.contextmanager
    def converse(self, first: Request) -> Iterator[Conversation]:
        """One agent process: `first`'s answer, then at most one changing verb planned from it.

        A run that changes nothing (facts, then an apply that finds the unit up to date) so costs one
        SSH exec and one agent start instead of two of each.
        """
        conv = Conversation(self, first)
        try:
            yield conv
        finally:
            conv.close()


class Conversation:
    """An agent process asked a read-only verb, then (optionally) one changing verb, or EOF.

    The question is sent at once and its answer read when first asked for: the caller does its own work
    (apply loads the planner) while the host gathers the answer.
    """

    def __init__(self, client: AgentClient, first: Request) -> None:
        self.client = client
        self.first = first
        self._answer: dict[str, Any] | None = None
        self._sent = False
        self._start()

    def _start(self) -> None:
        argv = [*self.client.ensure(), "session"]
        first = self.first.to_json().encode() + b"\n"
        # A bound on the whole conversation: an agent that hangs (a stalled disk) never holds the laptop.
        self.stream = self.client.transport.converse(argv, first, timeout=conversation_bound_s(self.first))
        self.lines = self.stream.lines()

    @property
    def answer(self) -> dict[str, Any]:
        """The read-only verb's JSON answer (a missing or damaged bundle is replaced, once)."""
        if self._answer is None:
            got = self._read()
            if isinstance(got, Result) and self.client._bundle_broken(got):
                self.client.refresh()
                self._start()
                got = self._read()
            if isinstance(got, Result):
                host = self.client.host.name
                raise RemoteError(f"{host}: agent {self.first.verb} failed: {_last(got.stderr)}")
            self._answer = got
        return self._answer

    def _read(self) -> dict[str, Any] | Result:
        for line in self.lines:
            if line.startswith("{"):
                return _answer(self.client.host.name, self.first.verb, line)
        done = self.stream.result()
        self.stream.close()
        return Result(self.stream.argv, done.rc or 1, b"", done.stderr)  # no answer is a failure, whatever rc

    def events(self, req: Request) -> Iterator[Event]:
        """The changing verb's events, from the same agent process (ConnectionLost if the link drops)."""
        if self._sent:
            raise RuntimeError("a conversation takes one changing verb")
        _ = self.answer  # the agent reads the next request only after it answered the first
        self._sent = True
        self.stream.send(req.to_json().encode() + b"\n")
        self.stream.end_input()
        yield from self.client._events(self.stream, self.lines, req.verb)

    def close(self) -> None:
        """EOF to an agent still waiting, so it exits on its own; then let the channel go."""
        self.stream.end_input()
        if not self._sent:
            with contextlib.suppress(ConnectError, RemoteError):
                for _ in self.lines:  # nothing more comes: the agent exits at EOF
                    pass
        self.stream.close()


def _answer(host: str, verb: str, line: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError:
        raise RemoteError(f"{host}: agent {verb} gave no JSON: {_last(line.encode())}") from None
    if not isinstance(data, dict):
        raise RemoteError(f"{host}: agent {verb} gave no JSON object")
    return data


def _last(data: bytes) -> str:
    """A command's last three lines on one line, for an error message."""
    return " | ".join(tail_lines(data, 3)) or "no output"


def unreadable(line: str) -> Event:
    """A line from the agent that is not an event of this protocol, shown as a warning."""
    shown = line if len(line) <= 200 else line[:200] + "..."
    return Event("-", 0, "", Stage.WATCH.value, "warning", f"unreadable line from the agent: {shown}")


def _smoke(host: HostConfig) -> Smoke:
    """The smoke test on the wire: an empty `expect` there means "usage only" (a random-weight model)."""
    smoke = host.smoke.model_dump(exclude={"random_weights"})
    return Smoke(**{**smoke, "expect": "" if host.smoke.random_weights else host.smoke.expect})
