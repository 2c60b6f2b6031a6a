"""A real 1P1D from deployctl's own units (tests/realpd.py): the real SGLang 0.5.23 as a prefill and a decode
on the test host's CPU, the KV moved by Mooncake over TCP, sglang-router 0.3.2 in PD mode in front, each
rendered by `deployctl render` of one [pd] file and run by the host's systemd.

One test, one pair: every real start costs 20-54 s on two cores. The prefill and the decode start together
(a decode needs its prefill only at its first request: it learns the bootstrap address from the router),
the router once both serve.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from agent.exitcodes import ExitCode
from tests import realhost, realpd
from tests.realpd import DECODE, PREFILL, ROUTER, PdHost
from tests.testhost import TestHostUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.real_sglang]

KV_BYTES_PER_TOKEN = 512  # the toy model's cell: 2 layers x (K, V) x 2 KV heads x 32 x bf16
PROMPT = list(range(100, 400))  # 300 token ids of the tiny model's 2,048
NEW = 8
REQUEST = {
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
}
_TRANSFERRED = re.compile(r"^sglang:kv_transfer_total_mb_sum(?:\{[^}]*\})? (\S+)$", re.M)


@pytest.fixture
def pd() -> Iterator[PdHost]:
    booted = realpd.booted()
    try:
        host = booted.__enter__()
    except TestHostUnavailable as exc:
        pytest.skip(f"real PD unavailable: {exc}")
    try:
        yield host
    finally:
        booted.__exit__(None, None, None)


def _parse_log(log: str, *args: str) -> str:
    r = subprocess.run(
        [realhost.DEPLOYCTL, "parse-log", "-", *args], input=log, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == ExitCode.OK, r.stderr
    return r.stdout


def _routed(pd: PdHost) -> float:
    """A routed /generate: 200, the whole prompt counted, every new token made; the KV moved P -> D."""
    status, out = realpd.http(pd.ports.router, "/generate", REQUEST)
    assert status == 200 and isinstance(out, dict), out
    meta = out["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(PROMPT), NEW), meta
    _, metrics = realpd.http(pd.ports.prefill, "/metrics")
    found = _TRANSFERRED.search(str(metrics))
    assert found, "the prefill exports no kv_transfer_total_mb"
    return float(found[1]) * 2**20  # bytes the prefill's Mooncake sender moved


def _status(port: int) -> int:
    try:
        return realpd.http(port, "/generate", REQUEST, timeout=30)[0]
    except OSError:  # timed out
        return 0


def _wait_for(pd: PdHost, invocation: str, line: str, timeout: float = 60) -> str:
    """The invocation's journal once it holds the line (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while line not in (log := pd.journal(DECODE, invocation)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return log


def test_a_real_1p1d_routes_then_a_decode_on_another_page_size_dies_and_parse_log_names_it(
    pd: PdHost,
) -> None:
    t0 = time.monotonic()
    pd.write_inventory()
    units = pd.render()
    assert set(units) == {PREFILL, DECODE, ROUTER}
    for name in (PREFILL, DECODE):
        assert '"SGLANG_HOST_IP=127.0.0.1"' in units[name]
        assert "--disaggregation-transfer-backend mooncake_tcp" in units[name]
    assert '"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1"' in units[PREFILL]
    assert "--disaggregation-decode-retraction-backup cpu_tensor" in units[DECODE]
    ports = pd.ports
    assert f"--prefill http://127.0.0.1:{ports.prefill} {ports.bootstrap}" in units[ROUTER]
    pd.install(units)
    pd.systemctl("start", "--no-block", PREFILL)
    pd.systemctl("start", "--no-block", DECODE)
    prefill_s = pd.wait_ready(PREFILL, ports.prefill)
    decode_s = pd.wait_ready(DECODE, ports.decode)
    pd.systemctl("start", ROUTER)
    router_s = pd.wait_routed()
    moved = _routed(pd)
    assert moved >= len(PROMPT) * KV_BYTES_PER_TOKEN  # every prompt token's KV went through Mooncake
    served_s = time.monotonic() - t0

    # The same decode on --page-size 16: deployctl refuses to render it...
    pd.write_inventory({"page-size": 16})
    refused = pd.deployctl("render", realpd.SERVICE, "--context", realpd.CONTEXT)
    assert refused.returncode == ExitCode.USAGE and "page-size" in refused.stderr.splitlines()[0]
    # ...so it is written by hand, as an operator would: it starts, and dies at its first routed request.
    bad = units[DECODE].replace("--page-size 1 ", "--page-size 16 ")
    assert bad != units[DECODE]
    pd.install({DECODE: bad})
    pd.systemctl("restart", DECODE)
    invocation = pd.invocation(DECODE)
    pd.wait_ready(DECODE, ports.decode)
    pd.wait_routed()
    # The client is answered by nobody: the router holds it while the prefill keeps it in its bootstrap
    # queue (measured). So it is sent aside, and the decode's journal is watched.
    answered: list[int] = []
    sender = threading.Thread(target=lambda: answered.append(_status(ports.router)), daemon=True)
    sender.start()
    log = _wait_for(pd, invocation, "kill_process_tree called")  # the decode server's last line: it exits
    said = (
        "RuntimeError: Page size mismatch: prefill server has page_size=1, "
        "but decode server has page_size=16."
    )
    assert said in log and 200 not in answered
    doc = json.loads(_parse_log(log, "--json"))
    assert doc["failure"]["kind"] == "pd_page_size_mismatch" and said in doc["failure"]["line"]
    assert "--page-size 1" in doc["fix"] and "--page-size 16" in doc["fix"]
    text = _parse_log(pd.journal(DECODE))  # the unit's whole journal: the failed start is the evidence
    assert "ready, then failed: pd_page_size_mismatch" in text and "what to do:" in text
    print(
        f"real 1P1D: prefill {prefill_s:.1f} s, decode {decode_s:.1f} s (together), router {router_s:.1f} s, "
        f"{moved:.0f} B moved for {len(PROMPT)} tokens, served at {served_s:.1f} s, "
        f"total {time.monotonic() - t0:.1f} s"
    )
