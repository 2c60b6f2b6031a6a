"""Every wait has a bound: a stalled disk, a FIFO, a journalctl or an SSH peer that never answers.

Each stall here is one that never ends on its own (a reader blocked until the test releases it, a FIFO
without a writer, a process that sleeps an hour); the code under test must come back at its own bound,
which the test sets small. The test's own guard (GUARD_S) only turns a hang of the old code into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.host import model_facts
from agent.host import prewarm as prewarm_mod
from agent.host.prewarm import WeightFile, prewarm
from agent.host.watch.journal import Journal, JournalError
from agent.inventory import load_host
from agent.protocol.requests import RESTART_JOB_TIMEOUT_S, conversation_bound_s
from agent.remote.client import AgentClient, base_request
from agent.remote.transport import CommandTimedOut, LocalTransport, Stream

UNITS = Path(__file__).resolve().parents[2] / "units"
GUARD_S = 60.0  # far beyond every bound below: only a wait without one reaches it


def finishes(call: Callable[[], Any]) -> Any:
    """call()'s result, or a failure if it is still waiting after GUARD_S."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(GUARD_S)
    assert not t.is_alive(), "still waiting: this wait has no bound"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def stalled() -> Iterator[threading.Event]:
    """A gate that a stalled reader waits at until the test ends (a hung NFS mount that comes back)."""
    gate = threading.Event()
    yield gate
    gate.set()


def test_a_stalled_prewarm_listing_is_abandoned_at_the_limit(
    monkeypatch: pytest.MonkeyPatch, stalled: threading.Event
) -> None:
    def hung_listing(folders: object) -> list[WeightFile]:
        stalled.wait()  # getdents(2) on a mount whose server is gone
        return []

    monkeypatch.setattr(prewarm_mod, "weight_files", hung_listing)
    done = finishes(lambda: prewarm({"model-path": "/models/x"}, margin=0, timeout_s=0.2))
    assert done.read_bytes == 0 and "stopped at its limit of 0.2 s" in str(done.skip)


def test_a_stalled_prewarm_read_is_abandoned_at_the_limit_with_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stalled: threading.Event
) -> None:
    shard = tmp_path / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\1" * (1 << 20))
    files = [
        WeightFile(str(shard), 1 << 20, 0),
        WeightFile("/models/x/model-00002-of-00002.safetensors", 1 << 30, 0),
    ]
    monkeypatch.setattr(prewarm_mod, "weight_files", lambda folders: files)
    real_open = os.open

    def open_stalls_on_the_second(path: str, *args: Any, **kw: Any) -> int:
        if path == files[1].path:
            stalled.wait()  # open(2) on the hung mount
        return real_open(path, *args, **kw)

    monkeypatch.setattr(prewarm_mod.os, "open", open_stalls_on_the_second)
    monkeypatch.setattr(prewarm_mod, "mem_available", lambda: 1 << 40)
    done = finishes(lambda: prewarm({"model-path": str(tmp_path)}, margin=0, timeout_s=0.5))
    assert done.read_bytes == 1 << 20 and "stopped at its limit" in str(done.skip)


def test_a_fifo_named_like_a_weight_file_is_never_opened_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "model-00001-of-00001.safetensors"
    os.mkfifo(fifo)
    monkeypatch.setattr(prewarm_mod, "weight_files", lambda folders: [WeightFile(str(fifo), 1 << 20, 0)])
    monkeypatch.setattr(prewarm_mod, "mem_available", lambda: 1 << 40)
    try:
        done = finishes(lambda: prewarm({"model-path": str(tmp_path)}, margin=0, timeout_s=GUARD_S / 2))
        assert done.read_bytes == 0 and done.skip is None
    finally:  # a reader of the old code still waits in open(): a writer's open lets it go (ENXIO if none)
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def fake_journalctl(tmp_path: Path) -> str:
    """A journalctl that answers the newest-record query, then prints one line and hangs for an hour."""
    script = tmp_path / "journalctl"
    record = json.dumps(
        {
            "MESSAGE": "Load weight begin",
            "__CURSOR": "c1",
            "__REALTIME_TIMESTAMP": "1",
            "_SYSTEMD_INVOCATION_ID": "ab1",
        }
    )
    script.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do [ "$a" = -n ] && {{ echo \'{record}\'; exit 0; }}; done\n'
        f"echo '{record}'\n"
        "exec sleep 3600\n"
    )
    script.chmod(0o755)
    return str(script)


def test_a_stalled_journalctl_head_read_fails_at_the_call_timeout(tmp_path: Path) -> None:
    journal = Journal(journalctl=fake_journalctl(tmp_path), call_timeout_s=0.5)
    with pytest.raises(JournalError, match=r"did not finish in 0\.5 s"):
        finishes(lambda: journal.last_invocation_lines("sglang.service", 20000))


@pytest.mark.parametrize("fifo_name", ["config.json", "model-00001-of-00001.safetensors", "elsewhere.fifo"])
def test_facts_never_wait_on_a_fifo_the_model_folder_or_its_index_names(
    tmp_path: Path, fifo_name: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    shard = "model-00001-of-00001.safetensors"
    index = {"weight_map": {"w": shard if fifo_name != "elsewhere.fifo" else "../elsewhere.fifo"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    if fifo_name != shard:
        (tmp_path / shard).write_bytes(struct.pack("<Q", 2) + b"{}")
    fifo = (tmp_path / fifo_name) if fifo_name != "elsewhere.fifo" else tmp_path.parent / "elsewhere.fifo"
    (tmp_path / fifo_name).unlink(missing_ok=True)
    os.mkfifo(fifo)
    try:
        fact = finishes(lambda: model_facts.model_fact(str(tmp_path)))
        if fifo_name == "config.json":
            assert fact is None  # no config.json to plan from
        else:
            assert fact is not None and fact["weights_bytes"] is None  # a shard it cannot read: unknown
    finally:  # a reader of the old code still waits in open(): a writer's open lets it go
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        fifo.unlink()


def test_a_conversation_with_an_agent_that_never_answers_ends_at_its_timeout() -> None:
    stream = LocalTransport().converse(["sh", "-c", "exec sleep 3600"], b"facts\n", timeout=0.5)
    with pytest.raises(CommandTimedOut, match=r"did not finish within 0\.5s"):
        finishes(lambda: list(stream))


class BoundRecorder(LocalTransport):
    """Answers at once, and keeps the timeout the client gave the conversation."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def converse(self, argv: Sequence[str], first: bytes, timeout: float | None = None) -> Stream:
        self.timeouts.append(timeout)
        return super().converse(["sh", "-c", 'echo \'{"unit_text": "x"}\'; cat >/dev/null'], first, timeout)


def test_every_conversation_of_the_laptop_has_a_bound_from_the_hosts_timeouts() -> None:
    host = load_host("ct200-sim", UNITS)
    transport = BoundRecorder()
    client = AgentClient(transport, host)
    client.ensure = lambda: ["deployctl-agent"]  # type: ignore[method-assign]  # no bundle: a fake agent
    req = base_request(host, "facts")
    with client.converse(req) as talk:
        assert talk.answer == {"unit_text": "x"}
    t = req.timeouts
    one_start = RESTART_JOB_TIMEOUT_S + t.weights_s + t.pool_s + t.ready_s
    assert transport.timeouts == [conversation_bound_s(req)]
    # every phase of the longest change at its own limit: pre-warm, the wait for another service's start on
    # the host (host/change/pinning.py), three starts (a recovery's restore, the new unit, the rollback),
    # the smoke test, and the answer before them
    assert (
        conversation_bound_s(req) >= t.weights_s + 4 * one_start - RESTART_JOB_TIMEOUT_S + req.smoke.timeout_s
    )
    assert conversation_bound_s(req) < float("inf")
