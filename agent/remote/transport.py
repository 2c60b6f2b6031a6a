"""The transport port: run argv, stream its output and put files on a host, locally or over SSH."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import tempfile
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol

from agent.errors import ConnectError, RemoteError

SUDO_PREFIX = ("sudo", "-n", "--")  # -n: fail instead of prompting; nobody is there to answer
STDERR_TAIL_LINES = 10
MISSING_COMMAND_RC = 127  # what a POSIX shell returns for a command it cannot find

# A command's stdout in chunks; its return value is (rc, stderr) once the command has ended.
Source = Generator[bytes, None, tuple[int, bytes]]


@dataclass(frozen=True)
class Result:
    """What a finished command left: its argv, exit code and both outputs."""

    argv: tuple[str, ...]
    rc: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def check(self) -> Result:
        """Return self if the command succeeded, else raise RemoteCommandFailed."""
        if not self.ok:
            raise RemoteCommandFailed(self)
        return self


class RemoteCommandFailed(RemoteError):
    """A command exited non-zero; the message shows the command, its code and the end of its stderr."""

    def __init__(self, result: Result) -> None:
        self.result = result
        super().__init__(f"command {shlex.join(result.argv)} exited with code {result.rc}")
        # DeployError squeezes the message onto one line; the stderr tail keeps its lines in str().
        self.stderr_tail = "\n".join(tail_lines(result.stderr, STDERR_TAIL_LINES))

    def __str__(self) -> str:
        if not self.stderr_tail:
            return self.message
        return f"{self.message}; stderr ends with:\n{self.stderr_tail}"


class CommandTimedOut(RemoteError):
    """A command ran past its timeout and was abandoned."""


class ConnectionLost(ConnectError):
    """The connection died while a command ran: its exit status is unknown."""


def tail_lines(data: bytes, lines: int) -> list[str]:
    """The last lines of a command's output, decoded leniently (it may not be UTF-8)."""
    return data.decode("utf-8", errors="replace").strip().splitlines()[-lines:]


def command_argv(argv: Sequence[str], sudo: bool) -> list[str]:
    """The argv to execute: the one place where sudo is applied."""
    if not argv:
        raise ValueError("empty argv")
    return [*SUDO_PREFIX, *argv] if sudo else list(argv)


def remote_command(argv: Sequence[str], sudo: bool) -> str:
    """The one place where argv becomes a shell string, for SSH's exec request."""
    return shlex.join(command_argv(argv, sudo))


class Input(Protocol):
    """A running command's stdin, kept open: more to send after reading its first answer."""

    def send(self, data: bytes) -> None: ...

    def end(self) -> None: ...


class Stream:
    """A running command: iterate for its stdout lines; rc and stderr are set once iteration ends.

    A stream from `converse` also has its stdin open: `send` more, then `end_input`.
    """

    def __init__(self, argv: Sequence[str], source: Source, stdin: Input | None = None) -> None:
        self.argv = tuple(argv)
        self._source = source
        self._stdin = stdin
        self._ended: tuple[int, bytes] | None = None

    def send(self, data: bytes) -> None:
        if self._stdin is None:
            raise RuntimeError("this stream's stdin is closed")
        self._stdin.send(data)

    def end_input(self) -> None:
        """EOF on the command's stdin (once; later calls do nothing)."""
        stdin, self._stdin = self._stdin, None
        if stdin is not None:
            stdin.end()

    def __iter__(self) -> Iterator[str]:
        return self.lines()

    def lines(self) -> Iterator[str]:
        """Yield stdout lines without their newline, as they arrive; raises ConnectionLost on a drop."""
        pending = b""
        while True:
            try:
                chunk = next(self._source)
            except StopIteration as end:
                self._ended = end.value
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")

    @property
    def rc(self) -> int:
        return self.result().rc

    def result(self) -> Result:
        """The finished command's Result (stdout is not kept: it went to the iterator)."""
        if self._ended is None:
            raise RuntimeError("the stream has not ended yet")
        rc, stderr = self._ended
        return Result(self.argv, rc, b"", stderr)

    def close(self) -> None:
        """Stop reading and let the command go (closes the channel or pipe)."""
        self.end_input()
        self._source.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Transport(Protocol):
    """How the laptop side reaches a host: the only port deploy code uses."""

    def describe(self) -> str: ...

    def run(
        self, argv: Sequence[str], input: bytes | None = None, timeout: float | None = None
    ) -> Result: ...

    def stream(self, argv: Sequence[str], input: bytes | None = None) -> Stream: ...

    def converse(self, argv: Sequence[str], first: bytes, timeout: float | None = None) -> Stream: ...

    def put(self, data: bytes, path: str, mode: int) -> None: ...

    def close(self) -> None: ...


class LocalTransport:
    """This machine, through subprocess (argv lists, never a shell)."""

    def __init__(self, sudo: bool = False) -> None:
        self.sudo = sudo

    def describe(self) -> str:
        return "local"

    def run(self, argv: Sequence[str], input: bytes | None = None, timeout: float | None = None) -> Result:
        full = command_argv(argv, self.sudo)
        try:
            done = subprocess.run(
                full, input=input, capture_output=True, timeout=timeout, check=False, cwd="/"
            )
        except FileNotFoundError:
            return _missing(argv)
        except subprocess.TimeoutExpired as exc:
            raise CommandTimedOut(f"command {shlex.join(argv)} did not finish within {timeout:g}s") from exc
        return Result(tuple(argv), done.returncode, done.stdout, done.stderr)

    def stream(self, argv: Sequence[str], input: bytes | None = None) -> Stream:
        return Stream(argv, self._source(argv, input))

    def _source(self, argv: Sequence[str], input: bytes | None) -> Source:
        proc = self._spawn(argv, keep_stdin=input is not None)  # on first read, not before
        if isinstance(proc, Result):
            return (proc.rc, proc.stderr)
        return (yield from _pump(proc, input))

    def converse(self, argv: Sequence[str], first: bytes, timeout: float | None = None) -> Stream:
        proc = self._spawn(argv, keep_stdin=True)
        if isinstance(proc, Result):
            return Stream(argv, _ended(proc))
        assert proc.stdin is not None  # PIPE above
        stdin = _PipeInput(proc.stdin)
        stdin.send(first)
        return Stream(argv, _pump(proc, None, timeout), stdin)

    def _spawn(self, argv: Sequence[str], keep_stdin: bool) -> subprocess.Popen[bytes] | Result:
        try:
            return subprocess.Popen(
                command_argv(argv, self.sudo),
                cwd="/",  # never the operator's folder: nothing of it is found by what runs as root
                stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError:
            return _missing(argv)

    def put(self, data: bytes, path: str, mode: int) -> None:
        target = Path(path)
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        except OSError as exc:
            raise RemoteError(f"cannot write {path}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise RemoteError(f"cannot write {path}: {exc.strerror}") from exc
            raise

    def close(self) -> None:
        pass


def _missing(argv: Sequence[str]) -> Result:
    # The shell on an SSH host reports a missing command as 127; say the same locally.
    return Result(tuple(argv), MISSING_COMMAND_RC, b"", f"{argv[0]}: command not found\n".encode())


def _ended(result: Result) -> Source:
    """A command that could not start, as a Source: no stdout, then its rc and stderr."""
    yield from ()
    return (result.rc, result.stderr)


def _pump(proc: subprocess.Popen[bytes], input: bytes | None, timeout: float | None = None) -> Source:
    """Yield a child's stdout as it comes; return (rc, stderr). `input` (if any) is fed, then EOF.

    Past `timeout` the child is killed (its stdout then ends) and CommandTimedOut raised.
    """
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPE in _spawn
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        proc.kill()

    timer = threading.Timer(timeout or 0.0, stop)
    if timeout is not None:
        timer.start()
    # stdin and stderr get their own threads so a full pipe on one side never stalls the other.
    stderr: list[bytes] = []
    helpers = [threading.Thread(target=_drain, args=(proc.stderr, stderr), daemon=True)]
    if input is not None:
        helpers.append(threading.Thread(target=_feed, args=(proc.stdin, input), daemon=True))
    for helper in helpers:
        helper.start()
    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            yield chunk
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if proc.stdin is not None and input is None:  # a conversation's stdin, if still open
            with contextlib.suppress(OSError):
                proc.stdin.close()
    timer.cancel()
    for helper in helpers:
        helper.join()
    if fired.is_set():
        raise CommandTimedOut(f"the agent did not finish within {timeout or 0:g}s: stopped it")
    return (rc, b"".join(stderr))


class _PipeInput:
    """A child's stdin for a conversation. The child reads each request whole before it answers, so
    writing in this thread cannot stall against its output."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.pipe = pipe

    def send(self, data: bytes) -> None:
        with contextlib.suppress(BrokenPipeError):  # the child exited early; its rc tells the story
            self.pipe.write(data)
            self.pipe.flush()

    def end(self) -> None:
        with contextlib.suppress(OSError):
            self.pipe.close()


def _drain(pipe: IO[bytes], into: list[bytes]) -> None:
    into.append(pipe.read())
    pipe.close()


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except BrokenPipeError:
        pass  # the command exited without reading all of its input; its rc tells the story
