"""One contract, every transport: the same assertions for LocalTransport and SshTransport over loopback."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import RemoteError
from agent.remote.ssh.transport import ConnectRetry, SshSettings, SshTransport
from agent.remote.transport import CommandTimedOut, LocalTransport, RemoteCommandFailed, Transport
from tests.integration.sshd import Sshd, keygen, skip_unless_sshd, start_sshd

pytestmark = pytest.mark.integration

AWKWARD = ["a b", "'q'", '"dq"', "$HOME", "`id`", "$(id)", "new\nline", "100%", "", "-n", "*", "ünï ✓"]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sshd, Path]]:
    skip_unless_sshd()
    root = tmp_path_factory.mktemp("contract-sshd")
    server = start_sshd(root / "sshd", keygen(root / "client_key"))
    config = root / "config"
    host = f"Host box\n  HostName 127.0.0.1\n  Port {server.port}\n  User root\n"
    config.write_text(f"{host}  IdentityFile {server.client_key}\n")
    (root / "known_hosts").write_text(server.known_hosts_line())
    yield server, root
    server.stop()


@pytest.fixture(params=["local", "ssh"])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    if request.param == "local":
        chosen: Transport = LocalTransport()
    else:
        _, root = request.getfixturevalue("sshd")
        retry = ConnectRetry(attempts=2, initial_delay_s=0.05)
        known = root / "known_hosts"
        settings = SshSettings(config_path=root / "config", known_hosts=known, retry=retry, allow_agent=False)
        chosen = SshTransport("box", settings)
    yield chosen
    chosen.close()


def test_describe_is_not_empty(transport: Transport) -> None:
    assert transport.describe()


def test_argv_reaches_the_command_unchanged(transport: Transport) -> None:
    result = transport.run(["printf", "%s\\n", *AWKWARD])
    assert result.ok
    assert result.stdout.decode() == "".join(f"{arg}\n" for arg in AWKWARD)
    assert result.argv[2:] == tuple(AWKWARD)


def test_exit_code_and_separate_outputs(transport: Transport) -> None:
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (result.rc, result.ok, result.stdout, result.stderr) == (7, False, b"out\n", b"err\n")


def test_check_raises_with_command_code_and_stderr_tail(transport: Transport) -> None:
    script = "for i in $(seq 1 30); do echo line$i >&2; done; exit 3"
    with pytest.raises(RemoteCommandFailed) as caught:
        transport.run(["sh", "-c", script]).check()
    text = str(caught.value)
    assert caught.value.message == f"command sh -c '{script}' exited with code 3"
    assert text.endswith("\n".join(f"line{i}" for i in range(21, 31)))
    assert "line20\n" not in text


def test_missing_command_is_rc_127(transport: Transport) -> None:
    result = transport.run(["deployctl-no-such-command", "x"])
    assert result.rc == 127
    assert b"deployctl-no-such-command" in result.stderr


def test_large_stdin_and_both_outputs_do_not_deadlock(transport: Transport) -> None:
    payload = os.urandom(3_000_000)
    echoed = transport.run(["cat"], input=payload, timeout=60)
    assert echoed.stdout == payload
    # 4 MB on each stream is far past any pipe or SSH window: both must be read as they come.
    both = transport.run(["sh", "-c", "head -c 4000000 /dev/zero; head -c 4000000 /dev/zero >&2"], timeout=60)
    assert (len(both.stdout), len(both.stderr), both.rc) == (4_000_000, 4_000_000, 0)


def test_timeout_abandons_the_command(transport: Transport) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimedOut):
        transport.run(["sleep", "10"], timeout=0.5)
    assert time.monotonic() - started < 3


def test_stream_yields_lines_as_they_come_then_the_rc(transport: Transport) -> None:
    script = "echo one; sleep 0.6; echo two; printf 'no-newline'; echo oops >&2; exit 5"
    stream = transport.stream(["sh", "-c", script])
    arrivals: list[tuple[str, float]] = [(line, time.monotonic()) for line in stream]
    assert [line for line, _ in arrivals] == ["one", "two", "no-newline"]
    assert arrivals[1][1] - arrivals[0][1] > 0.4  # "one" came before the sleep ended, not at exit
    assert stream.rc == 5
    assert stream.result().stderr == b"oops\n"


def test_stream_feeds_stdin_and_replaces_bad_utf8(transport: Transport) -> None:
    stream = transport.stream(["cat"], input=b"first\nbad \xff byte\n")
    assert list(stream) == ["first", "bad \ufffd byte"]
    assert stream.rc == 0


# Answers each line it reads at once, so the second line can depend on the first answer.
ECHO_LINES = 'while read -r line; do echo "got $line"; done; echo eof; exit 3'


def test_converse_answers_before_the_next_input_is_sent(transport: Transport) -> None:
    stream = transport.converse(["sh", "-c", ECHO_LINES], b"facts\n")
    lines = stream.lines()
    assert next(lines) == "got facts"  # the first answer arrives while stdin is still open
    stream.send(b"apply planned\n")
    stream.end_input()
    assert list(lines) == ["got apply planned", "eof"]
    assert stream.rc == 3


def test_converse_ended_without_more_input_ends_the_command(transport: Transport) -> None:
    stream = transport.converse(["sh", "-c", ECHO_LINES], b"facts\n")
    lines = stream.lines()
    assert next(lines) == "got facts"
    stream.end_input()
    stream.end_input()  # twice is harmless
    assert list(lines) == ["eof"]
    with pytest.raises(RuntimeError):
        stream.send(b"too late\n")


def test_converse_with_a_missing_command_is_rc_127(transport: Transport) -> None:
    stream = transport.converse(["deployctl-no-such-command"], b"x\n")
    assert list(stream) == []
    assert stream.rc == 127


def test_rc_is_unknown_until_the_stream_ends(transport: Transport) -> None:
    stream = transport.stream(["echo", "hi"])
    with pytest.raises(RuntimeError):
        _ = stream.rc
    assert list(stream) == ["hi"]
    assert stream.rc == 0


def test_put_is_binary_safe_sets_the_mode_and_replaces(transport: Transport, tmp_path: Path) -> None:
    target = tmp_path / "bundle.pyz"
    target.write_bytes(b"old contents")
    data = bytes(range(256)) * 4096 + b"\r\n\x00"
    transport.put(data, str(target), 0o640)
    assert transport.run(["cat", str(target)]).stdout == data
    assert transport.run(["stat", "-c", "%a", str(target)]).stdout == b"640\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.pyz"]  # no temporary file left


def test_put_an_executable(transport: Transport, tmp_path: Path) -> None:
    script = tmp_path / "hello"
    transport.put(b'#!/bin/sh\necho hello "$1"\n', str(script), 0o755)
    assert transport.run([str(script), "wide world"]).stdout == b"hello wide world\n"


def test_put_into_a_missing_folder_is_one_remote_error(transport: Transport, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "file"
    with pytest.raises(RemoteError) as caught:
        transport.put(b"x", str(missing), 0o644)
    assert f"cannot write {missing}" in caught.value.message
    assert "No such file" in caught.value.message


def test_converse_past_its_timeout_is_stopped(transport: Transport) -> None:
    """An agent that never answers (a stalled disk on the host) cannot hold the laptop forever."""
    stream = transport.converse(["sh", "-c", "exec sleep 3600"], b"facts\n", timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(CommandTimedOut, match="did not finish within 1s"):
        list(stream)
    assert time.monotonic() - t0 < 60  # the bound, not the command's hour
