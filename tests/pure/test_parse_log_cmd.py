"""`deployctl parse-log`: file and stdin input, JSON and human output, unreadable files."""

# ruff: noqa: E501 - verbatim SGLang log lines are longer than code lines

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from agent.cli.commands import parse_log
from agent.errors import UsageError
from agent.exitcodes import ExitCode
from agent.output import Output

LOG = (
    "[2026-10-30 12:00:00] server_args=ServerArgs(model_path='/m', mem_fraction_static=0.86, context_length=200000)\n"
    "[2026-10-30 12:00:02 TP0] Load weight begin. avail mem=93.47 GB\n"
    "[2026-10-30 12:00:02 TP1] Load weight begin. avail mem=93.40 GB\n"
    "Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:30<00:30,  1.05it/s]\r"
    "Loading safetensors checkpoint shards: 100% Completed | 64/64 [01:00<00:00,  1.05it/s]\n"
    "[2026-10-30 12:01:10 TP0] Load weight end. elapsed=68.1 s, type=KimiK25ForConditionalGeneration, "
    "avail mem=19.90 GB, mem usage=73.58 GB.\n"
    "[2026-10-30 12:01:10 TP1] Load weight end. elapsed=68.2 s, type=KimiK25ForConditionalGeneration, "
    "avail mem=19.81 GB, mem usage=73.58 GB.\n"
    "[2026-10-30 12:01:11 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 210000, KV size: 13.75 GB\n"
    "[2026-10-30 12:01:11 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 210000, KV size: 13.75 GB\n"
    "[2026-10-30 12:01:21 TP0] max_total_num_tokens=210000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=64, context_len=200000, available_gpu_mem=4.12 GB\n"
    "[2026-10-30 12:01:30] The server is fired up and ready to roll!\n"
)


def _out() -> Output:
    return Output(stdout=io.StringIO(), stderr=io.StringIO())


def _run(file: str, *, as_json: bool) -> tuple[int, str]:
    out = _out()
    rc = parse_log.run(argparse.Namespace(file=file, json=as_json, start=None), out)
    assert isinstance(out.stdout, io.StringIO)
    return rc, out.stdout.getvalue()


def test_json_summary(tmp_path: Path) -> None:
    path = tmp_path / "start.log"
    path.write_text(LOG, encoding="utf-8")
    rc, text = _run(str(path), as_json=True)
    assert rc == 0
    assert text.count("\n") == 1
    d = json.loads(text)
    assert d == {
        "kv_tokens": 210000,
        "kv_size_gb": 13.75,
        "draft_kv_tokens": None,
        "max_total_num_tokens": 210000,
        "context_len": 200000,
        "max_running_requests": 64,
        "avail_mem_before_weights_gb": 93.40,
        "avail_mem_after_weights_gb": 19.81,
        "avail_mem_before_pool_gb": 19.81,
        "available_gpu_mem_gb": 4.12,
        "mem_fraction_static": 0.86,
        "ready": True,
        "failure": None,
        "fix": None,
        "stopped": False,
        "startup_timings": None,
        "start": 1,
        "starts": [
            {
                "number": 1,
                "first_line": 1,
                "outcome": "ready",
                "ready": True,
                "mem_fraction_static": 0.86,
                "kv_tokens": 210000,
                "failure": None,
            }
        ],
    }
    assert list(d) == sorted(d)


def test_human_summary(tmp_path: Path) -> None:
    path = tmp_path / "start.log"
    path.write_text(LOG, encoding="utf-8")
    rc, text = _run(str(path), as_json=False)
    assert rc == 0
    assert "pool:          210,000 tokens (13.75 GiB)" in text
    assert "draft pool:    none" in text
    assert "context:       200,000 tokens" in text
    assert "before weights 93.40 GiB, after weights 19.81 GiB" in text
    assert "mem fraction:  0.86" in text
    assert "ready:         yes" in text
    assert "failure:       none" in text


def test_human_summary_names_the_failure(tmp_path: Path) -> None:
    line = "[2026-10-30 12:01:11 TP0] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    path = tmp_path / "failed.log"
    path.write_text(line + "\n", encoding="utf-8")
    rc, text = _run(str(path), as_json=False)
    assert rc == 0
    assert "failure:       not_enough_memory" in text
    assert line in text
    assert "pool:          ?" in text and "ready:         no" in text


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "broken.log"
    path.write_bytes(b"\xff\xfe garbage \xc3\n" + LOG.encode() + b"\x80\x81\n")
    rc, text = _run(str(path), as_json=True)
    assert rc == 0
    assert json.loads(text)["kv_tokens"] == 210000


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LOG.encode())))
    rc, text = _run("-", as_json=True)
    assert rc == 0 and json.loads(text)["ready"] is True


@pytest.mark.parametrize("name", ["missing.log", "a-directory"])
def test_unreadable_file_is_a_usage_error(tmp_path: Path, name: str) -> None:
    (tmp_path / "a-directory").mkdir()
    with pytest.raises(UsageError) as info:
        _run(str(tmp_path / name), as_json=True)
    assert info.value.exit_code == ExitCode.USAGE
    assert info.value.message.startswith(f"cannot read {tmp_path / name}: ")


def test_configure_defaults_to_stdin() -> None:
    parser = argparse.ArgumentParser()
    parse_log.configure(parser)
    assert vars(parser.parse_args([])) == {"file": "-", "start": None, "json": False}
    assert vars(parser.parse_args(["x.log", "--json"])) == {"file": "x.log", "start": None, "json": True}
