"""Mistakes a newcomer makes in a [pd] file, each refused in one line that names the fix before any host is
touched: a page size an attention backend forces, a DP-attention decode's per-rank concurrency, the router's
port on a unit's, router flags sglang-router does not take, an NPU-only backend on an NVIDIA card, and
`plan --set mem-fraction-static` applied to every role."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from agent.pd import plan as pd_plan
from agent.pd.refusals import check
from tests.pure.test_pd import EXAMPLE, example, host_of

Mutate = Callable[[dict[str, Any]], None]


def refusals(mutate: Mutate, context: int = 32768) -> tuple[str, ...]:
    data = example()
    mutate(data)
    host = host_of(data)
    said = check(host).refusals
    if said:
        return said
    plans = pd_plan.role_plans(host, context)
    return check(host, decodes=pd_plan.decode_needs(plans, context)).refusals


def plan_cli(tmp_path: Path, edit: Callable[[str], str], *extra: str) -> tuple[int, str, str]:
    (tmp_path / "pd.toml").write_text(edit(EXAMPLE.read_text(encoding="utf-8")))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["plan", "pd", "--offline", "--context", "32k", *extra, "--units", str(tmp_path)], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def decode_flags(**flags: object) -> Mutate:
    def mutate(data: dict[str, Any]) -> None:
        data["pd"]["decode"][0]["flags"].update({k.replace("_", "-"): v for k, v in flags.items()})

    return mutate


# ---- (a) the page size an attention backend forces


def test_a_decode_whose_backend_forces_page_64_is_refused_against_a_page_1_prefill() -> None:
    said = refusals(decode_flags(attention_backend="flashmla"))
    assert len(said) == 1 and "--page-size differs" in said[0], said
    assert "decode[0] has 64" in said[0] and "flashmla" in said[0] and "prefill[0] has 1" in said[0]


@pytest.mark.parametrize(
    ("page", "backend", "forced"),
    [(16, "trtllm_mla", "64"), (1, "cutedsl_mla", "64"), (8, "trtllm_mha", "64"), (1, "hpc_ops", "64")],
)
def test_each_forcing_backend_on_the_decode_is_compared_at_its_forced_page(
    page: int, backend: str, forced: str
) -> None:
    def mutate(data: dict[str, Any]) -> None:
        data["sglang"]["flags"]["page-size"] = page
        data["pd"]["decode"][0]["flags"]["decode-attention-backend"] = backend

    said = refusals(mutate)
    assert said and f"decode[0] has {forced}" in said[0] and backend in said[0], said


@pytest.mark.parametrize(("page", "backend"), [(64, "flashmla"), (32, "trtllm_mla"), (128, "trtllm_mha")])
def test_a_page_the_backend_accepts_on_every_role_is_not_refused(page: int, backend: str) -> None:
    def mutate(data: dict[str, Any]) -> None:
        data["sglang"]["flags"]["page-size"] = page
        data["pd"]["decode"][0]["flags"]["attention-backend"] = backend

    assert refusals(mutate) == ()


# ---- (b) a DP-attention decode holds max-running-requests / dp-size per rank


@pytest.mark.parametrize(
    "flags",
    [
        {"enable-dp-attention": True, "dp-size": 2},
        {"attn-dp-size": 2},
    ],
)
def test_a_dp_attention_decodes_need_is_per_rank(flags: dict[str, object]) -> None:
    def mutate(data: dict[str, Any]) -> None:
        data["gpus"]["indices"] = [0, 1, 2]
        data["pd"]["decode"][0].update(gpus=[1, 2])
        data["pd"]["decode"][0]["flags"].update({"tp-size": 2, "max-running-requests": 16, **flags})

    data = example()
    mutate(data)
    host = host_of(data)
    decode = next(p for p in pd_plan.role_plans(host, 32768) if p.unit.role.value == "decode")
    assert decode.need_tokens == 8 * (32768 + 512), decode.need  # 16 // 2 per DP rank
    (need,) = pd_plan.decode_needs([decode], 32768)
    assert need.running == 8 and need.need == decode.need_tokens


# ---- (c) the router's port on a unit's HTTP port of the same host


def test_the_router_port_on_a_units_port_is_refused_before_any_host(tmp_path: Path) -> None:
    code, _, err = plan_cli(tmp_path, lambda t: t.replace("port = 30020", "port = 30000"))
    assert code == ExitCode.USAGE, err
    assert "router's port 30000" in err and "move one" in err


# ---- (d) router flags sglang-router does not take


def test_a_router_flag_sglang_router_does_not_take_is_refused() -> None:
    pytest.importorskip("sglang_router")
    said = refusals(lambda d: d["pd"]["router"]["flags"].update(polcy="random"))
    assert len(said) == 1 and "router" in said[0] and "--polcy" in said[0], said
    assert "[pd.router] flags" in said[0]


def test_a_router_flag_value_outside_its_choices_is_refused() -> None:
    pytest.importorskip("sglang_router")
    said = refusals(lambda d: d["pd"]["router"]["flags"].update(policy="fastest"))
    assert said and "fastest" in said[0], said


def test_the_router_flags_of_the_table_pass_where_sglang_router_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agent.pd.routerflags as routerflags

    monkeypatch.setattr(routerflags, "installed_parser", lambda _version: None)
    assert refusals(lambda d: d["pd"]["router"]["flags"].update(policy="random")) == ()
    said = refusals(lambda d: d["pd"]["router"]["flags"].update(polcy="random"))
    assert said and "--polcy" in said[0] and "not a flag of sglang-router 0.3.2" in said[0], said


# ---- (e) an NPU-only backend on an NVIDIA card


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["sglang"]["flags"].update({"attention-backend": "ascend"}),
        lambda d: d["pd"]["decode"][0]["flags"].update({"decode-attention-backend": "ascend"}),
        lambda d: d["pd"].update(transfer_backend="ascend"),
    ],
)
def test_an_ascend_backend_on_an_nvidia_card_is_refused(mutate: Mutate) -> None:
    said = refusals(mutate)
    assert said and "ascend" in said[0] and "NVIDIA" in said[0], said


# ---- (f) plan --set mem-fraction-static on a [pd] file


@pytest.mark.parametrize("how", [["--set", "mem-fraction-static=0.7"], ["--mem-fraction-static", "0.7"]])
def test_plan_set_mem_fraction_static_applies_to_every_role(tmp_path: Path, how: list[str]) -> None:
    code, out, err = plan_cli(tmp_path, lambda t: t, *how, "--json")
    assert code == 0, err
    roles = json.loads(out)["roles"]
    assert [r["plan"]["mem_fraction_static"] for r in roles] == [0.7, 0.7], roles
