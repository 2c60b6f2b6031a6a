"""Review of the [pd] service (refusals, units, router, rollback): each test states what should hold and is
marked xfail(strict) while it does not. Pure: the inventory, the refusals and the CLI in-process, no host."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.errors import UsageError
from agent.exitcodes import ExitCode
from agent.output import Output
from tests.pure.test_pd import EXAMPLE, example, host_of
from tests.pure.test_pd_newcomer import decode_flags, refusals


def _cli(units: Path, *argv: str) -> tuple[int, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*argv, "--units", str(units)], out)
    assert isinstance(out.stderr, io.StringIO)
    return code, out.stderr.getvalue()


# ---- high


def test_the_routers_unit_named_as_a_roles_unit_on_its_host_is_refused() -> None:
    said = refusals(lambda d: d["pd"]["router"].update(unit="llama-pd-prefill-0.service"))
    assert any("llama-pd-prefill-0.service" in s for s in said), said


def test_roles_whose_kv_dtype_differs_through_dtype_under_auto_are_refused() -> None:
    # kv-cache-dtype auto on both: SGLang's handshake compares the text "auto" (common/conn.py:1327-1335)
    # while each pool takes its model dtype (mem_cache/kv_cache_dtype.py:49-59): fp16 KV read as bf16
    said = refusals(decode_flags(dtype="float16"))
    assert any("dtype" in s for s in said), said


def test_a_decode_on_another_host_than_a_prefill_named_at_loopback_is_refused() -> None:
    # sglang-router passes the prefill URL's host as bootstrap_host (sglang_router/mini_lb.py:392-410); the
    # decode dials it (srt/disaggregation/decode.py:153-155): 127.0.0.1 on the decode's host is no prefill
    said = refusals(lambda d: d["pd"]["decode"][0].update(target="gpu-b", url="http://gpu-b:30020"))
    assert said


# ---- medium


def test_the_kv_checksum_on_one_role_only_is_refused() -> None:
    # aux buffers pair up positionally: on one engine only they misalign (common/conn.py:617-634)
    def mutate(d: dict[str, Any]) -> None:
        d["pd"]["kv_checksum"] = False
        d["pd"]["prefill"][0]["flags"]["disaggregation-enable-kv-checksum"] = True

    assert refusals(mutate)


def test_a_roles_cuda_visible_devices_against_its_gpus_is_refused() -> None:
    said = refusals(lambda d: d["pd"]["decode"][0].update(environment={"CUDA_VISIBLE_DEVICES": "0"}))
    assert said


def test_units_of_one_host_spelled_differently_that_share_gpu_and_ports_are_refused() -> None:
    def mutate(d: dict[str, Any]) -> None:
        twin = {**d["pd"]["prefill"][0], "target": "root@gpu-pd", "url": "http://gpu-pd:30010"}
        d["pd"]["prefill"].append(twin)  # GPU 0, port 30010, bootstrap 8998: all prefill[0]'s

    said = refusals(mutate)
    assert said


def test_a_units_url_naming_another_units_port_is_refused() -> None:
    said = refusals(lambda d: d["pd"]["decode"][0].update(url="http://127.0.0.1:30010"))
    assert said


def test_rollback_does_not_choose_units_whose_page_sizes_differ() -> None:
    from agent.group.pdrollback import chosen_backups

    def rows(name: str, changes: list[list[object]]) -> dict[str, Any]:
        row = {"name": name, "taken": name, "size": 1, "same_as_installed": False, "changes": changes}
        return {"backups": [row]}

    # apply 1 set page 16 on both roles; apply 2 changed the decode's concurrency only
    listings = [
        rows("llama-pd-prefill-0.service.bak.1", [["page-size", 1, 16]]),
        rows("llama-pd-decode-0.service.bak.2", [["max-running-requests", 8, 16]]),
        {"backups": []},
    ]
    try:
        picked = chosen_backups(host_of(example()), listings)  # type: ignore[arg-type]
    except UsageError:
        return  # refused before any host: fine
    labels = {c.label for c in picked}
    assert not {"prefill[0]", "decode[0]"} <= labels, [(c.label, c.backup, c.changes) for c in picked]


# ---- low


def test_a_tp_size_that_is_not_a_number_is_a_usage_error(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "flags = { tp-size = 1, max-running-requests = 8 }",
        'flags = { tp-size = "two", max-running-requests = 8 }',
    )
    (tmp_path / "pd.toml").write_text(text)
    code, err = _cli(tmp_path, "plan", "pd", "--offline", "--context", "32k")
    assert code == ExitCode.USAGE, err


def test_a_router_argv_naming_a_prefill_without_its_bootstrap_port_is_refused() -> None:
    exe = [
        "/opt/sglang/.venv/bin/python",
        "-m",
        "sglang_router.launch_router",
        "--prefill",
        "http://127.0.0.1:30010",
    ]
    said = refusals(lambda d: d["pd"]["router"].update(executable=exe))
    assert said


def test_a_unit_on_another_host_at_ipv6_loopback_is_refused() -> None:
    said = refusals(lambda d: d["pd"]["decode"][0].update(target="gpu-b", url="http://[::1]:30020"))
    assert said


def test_a_draft_backend_that_forces_page_64_is_compared_at_64() -> None:
    said = refusals(decode_flags(speculative_draft_attention_backend="trtllm_mha"))
    assert any("page-size" in s for s in said), said


OTHER = """[ssh]
target = "gpu-pd"
[gpus]
indices = [2]
memory_gib = 79.2
name = "NVIDIA H100 80GB HBM3"
[model]
path = "/models/Llama-3.1-8B-Instruct"
attention = "gqa"
layers = 32
kv_heads = 8
head_dim = 128
dtype_bytes = 2
weights_gib_per_gpu = 14.96
max_context = 131072
[unit]
name = "other.service"
[sglang]
version = "0.5.23"
port = 30000
"""


def test_the_routers_port_is_held_against_the_hosts_other_files(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "port = 30000                # the router's", "port = 30001                # the router's"
    )
    (tmp_path / "pd.toml").write_text(text)
    (tmp_path / "other.toml").write_text(OTHER)  # a plain service on the router's port 30000
    code, err = _cli(tmp_path, "render", "pd", "--context", "32k")
    assert code == ExitCode.USAGE, err


def test_a_dry_run_sends_no_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.group.pdapply as pdapply
    import agent.orchestrate.session as session
    from agent.deploy import apply
    from agent.orchestrate.asked import Change, Connection
    from tests.pure.test_pd_ops import FakeAgent, fake_clients

    host = host_of(example())
    units = pdapply.planned_units(host, 32768)

    class Orphaned(FakeAgent):
        def call(self, req: Any) -> dict[str, Any]:
            answer = super().call(req)
            return {**answer, "orphan": True} if req.verb == "facts" else answer

    agents = [Orphaned(units[0].text), FakeAgent(units[1].text), FakeAgent(units[2].text)]
    monkeypatch.setattr(pdapply, "clients", fake_clients(agents))
    sent: list[str] = []

    class Done:
        message = "recovered"

    def follow(_out: Any, _s: Any, req: Any, _talk: Any = None) -> Done:
        sent.append(req.verb)
        return Done()

    monkeypatch.setattr(session, "follow", follow)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    apply(Connection("pd"), Change(32768, dry_run=True), out, host)
    assert sent == [], sent
