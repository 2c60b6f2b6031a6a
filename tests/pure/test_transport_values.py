"""Result, Stream and the one quoting function, without processes."""

from __future__ import annotations

import shlex

import pytest

from agent.remote.transport import RemoteCommandFailed, Result, Source, Stream, command_argv, remote_command


def test_quoting_happens_once_and_round_trips() -> None:
    argv = ["printf", "%s\n", "a b", "$HOME", "`id`", "it's", ""]
    assert shlex.split(remote_command(argv, sudo=False)) == argv


def test_sudo_is_a_prefix_that_never_prompts() -> None:
    assert command_argv(["systemctl", "daemon-reload"], sudo=True) == [
        "sudo",
        "-n",
        "--",
        "systemctl",
        "daemon-reload",
    ]
    assert shlex.split(remote_command(["echo", "-n"], sudo=True)) == ["sudo", "-n", "--", "echo", "-n"]
    with pytest.raises(ValueError):
        command_argv([], sudo=False)


def test_check_passes_success_through_and_raises_on_failure() -> None:
    ok = Result(("true",), 0, b"", b"")
    assert ok.check() is ok
    failed = Result(("sh", "-c", "exit 2"), 2, b"", b"".join(b"e%d\n" % i for i in range(15)))
    with pytest.raises(RemoteCommandFailed) as caught:
        failed.check()
    assert caught.value.result is failed
    assert str(caught.value) == "command sh -c 'exit 2' exited with code 2; stderr ends with:\n" + "\n".join(
        f"e{i}" for i in range(5, 15)
    )


def _chunks(*parts: bytes) -> Source:
    yield from parts
    return (3, b"warn\n")


def test_stream_splits_lines_across_chunks_and_keeps_multibyte_characters() -> None:
    snowman = "☃".encode()
    stream = Stream(["x"], _chunks(b"on", b"e\ntw", snowman[:1], snowman[1:] + b"o\n\nlast"))
    assert list(stream) == ["one", "tw☃o", "", "last"]
    assert (stream.rc, stream.result().stderr) == (3, b"warn\n")
