"""SGLang 0.5.23's PD hook refuses some role flags at the start (srt/arg_groups/pd_disaggregation_hook.py):
each is refused before plan plans; the plan per role counts a prefill's unset chunk at SGLang's default; a
decode with no pool is told what fits; the KV checksum line names the pairs SGLang admits unverified."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.host.roles import pdrouter
from agent.pd.plan import checksum_line, unverified_pairs
from agent.pd.refusals import DecodeNeed, _short
from agent.pd.starthook import start_refusals
from agent.pd.units import pd_units
from tests.pure.test_pd import example, host_of
from tests.pure.test_pd_newcomer import Mutate, refusals


def both(**flags: object) -> Mutate:
    """The flags on both roles, each on two GPUs of its own where tp-size is 2."""

    def mutate(d: dict[str, Any]) -> None:
        d["gpus"]["indices"] = [0, 1, 2, 3]
        d["pd"]["prefill"][0]["gpus"], d["pd"]["decode"][0]["gpus"] = [0, 1], [2, 3]
        for name in ("prefill", "decode"):
            d["pd"][name][0]["flags"].update({k.replace("_", "-"): v for k, v in flags.items()})

    return mutate


def role(which: str, env: dict[str, str] | None = None, **flags: object) -> Mutate:
    def mutate(d: dict[str, Any]) -> None:
        d["pd"][which][0]["flags"].update({k.replace("_", "-"): v for k, v in flags.items()})
        if env:
            d["pd"][which][0]["environment"] = env

    return mutate


def backend(name: str, then: Mutate) -> Mutate:
    def mutate(d: dict[str, Any]) -> None:
        d["pd"]["transfer_backend"] = name
        then(d)

    return mutate


PC = "prefill_complete"
REFUSED = [
    # _validate_prefill_complete (:199-242), on the policy every role shares
    (both(disaggregation_decode_allocation_policy=PC, tp_size=2), "attention tensor parallelism"),
    (both(disaggregation_decode_allocation_policy=PC, tp_size=2, attn_dp_size=2), "attention tensor"),
    (both(disaggregation_decode_allocation_policy=PC, tp_size=2, enable_dp_attention=True, dp_size=2),
     "tensor"),
    (backend("nixl", both(disaggregation_decode_allocation_policy=PC)), "other than Mooncake (nixl)"),
    (both(disaggregation_decode_allocation_policy=PC, pp_size=2), "pipeline or attention context"),
    (both(disaggregation_decode_allocation_policy=PC, enable_pdmux=True), "PD multiplexing"),
    (both(disaggregation_decode_allocation_policy=PC, enable_hisparse=True), "HiSparse"),
    (both(disaggregation_decode_allocation_policy=PC, disaggregation_decode_host_receive_threshold=0.5),
     "decode host KV buffering"),
    (both(disaggregation_decode_allocation_policy=PC, enable_hierarchical_cache=True), "decode HiCache"),
    (both(disaggregation_decode_allocation_policy=PC, enable_hierarchical_cache=True,
          hicache_write_policy="write_back"), "decode radix cache or decode HiCache"),
    (both(disaggregation_decode_allocation_policy=PC), None),  # TP1 Mooncake: taken
    # host receive (:64-75)
    (role("decode", disaggregation_decode_host_receive_threshold=1.5), "between 0 and 1"),
    (role("decode", disaggregation_decode_host_receive_threshold=0.5,
          disaggregation_decode_retraction_backup="cpu_tensor"), "requires host_pool retraction"),
    (role("decode", disaggregation_decode_host_receive_threshold=0.5, enable_hisparse=True),
     "--enable-hisparse"),
    (role("decode", disaggregation_decode_host_receive_threshold=0.5,
          disaggregation_decode_retraction_backup="host_pool"), None),
    # a decode's radix cache (:98-109), role switching (:164-196)
    (role("decode", disaggregation_decode_enable_radix_cache=True, enable_hisparse=True), "incompatible"),
    (role("decode", enable_pd_role_switch=True, speculative_algorithm="EAGLE"), "speculative decoding"),
    (role("prefill", enable_pd_role_switch=True, ep_size=2), "expert parallelism"),
    (role("prefill", enable_pd_role_switch=True), None),
    # the environment (:153-162, :273-283)
    (backend("mori", role("decode", {"SGLANG_DISAGG_STAGING_BUFFER": "1"})), "mooncake or nixl"),
    (role("prefill", {"SGLANG_RUST_SERVER": "true"}), None),  # the default bootstrap port: aliased
    (role("prefill", {"SGLANG_DISAGG_STAGING_BUFFER": "1"}), None),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "said"), REFUSED)
def test_each_start_refusal_of_sglangs_pd_hook_is_refused_and_its_neighbour_is_not(
    mutate: Mutate, said: str | None
) -> None:
    found = refusals(mutate)
    if said is None:
        assert not found, found
    else:
        assert any(said in s and "pd_disaggregation_hook.py" in s for s in found), found


def test_the_rust_servers_bootstrap_port_is_its_http_port_or_the_default() -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["pd"]["prefill"][0].update(bootstrap_port=8999, environment={"SGLANG_RUST_SERVER": "1"})

    assert any("SGLANG_RUST_SERVER" in s for s in refusals(mutate))


@settings(max_examples=40, deadline=None)
@given(
    value=st.floats(-5, 5, allow_nan=False),
    backup=st.sampled_from([None, "cpu_tensor", "host_pool", "none"]),
)
def test_a_decodes_host_receive_threshold_is_refused_exactly_where_sglang_refuses_it(
    value: float, backup: str | None
) -> None:
    flags: dict[str, object] = {"disaggregation_decode_host_receive_threshold": value}
    if backup is not None:
        flags["disaggregation_decode_retraction_backup"] = backup
    found = [s for s in refusals(role("decode", **flags)) if "host" in s and "hook" in s]
    dies = not 0 <= value <= 1 or (value < 1 and backup == "cpu_tensor")
    assert bool(found) == dies, (value, backup, found)


def test_a_decode_whose_weights_leave_no_pool_is_told_more_gpus_not_zero_requests() -> None:
    none = _short(DecodeNeed("decode[0]", 8, 32000, 512, -1200))
    assert "max-running-requests" not in none and "do not fit" in none and "tp-size" in none
    tiny = _short(DecodeNeed("decode[0]", 8, 32000, 512, 20000))
    assert "to 0" not in tiny and "less than one request" in tiny
    some = _short(DecodeNeed("decode[0]", 8, 32000, 512, 70000))
    assert "lower its max-running-requests to 2" in some


@pytest.mark.parametrize(
    ("attention", "kv_heads", "tp", "skipped"),
    [("gqa", 8, (1, 2), True), ("gqa", 8, (2, 2), False), ("gqa", 8, (8, 16), False),
     ("gqa", 4, (2, 1), True), ("mla", 1, (1, 2), False)],
)  # fmt: skip
def test_the_kv_checksum_line_names_pairs_sglang_admits_unverified(
    attention: str, kv_heads: int, tp: tuple[int, int], skipped: bool
) -> None:
    # srt/disaggregation/utils.py:263-284 signs per-rank item lengths; decode.py:2580-2597 skips another's
    data = example()
    data["gpus"]["indices"] = list(range(sum(tp)))
    data["model"].update(attention=attention, kv_heads=kv_heads)
    if attention == "mla":
        data["model"].update(kv_lora_rank=512, qk_rope_head_dim=64)
    for name, width, first in (("prefill", tp[0], 0), ("decode", tp[1], tp[0])):
        data["pd"][name][0].update(gpus=list(range(first, first + width)))
        data["pd"][name][0]["flags"]["tp-size"] = width
    host = host_of(data)
    line = checksum_line(host)
    assert line.startswith("KV checksum: on in every role")
    assert ("skipped between prefill[0] (TP" in line) is skipped and bool(unverified_pairs(host)) is skipped


def test_the_routed_checks_checksum_gate_says_skipped_where_sglang_skipped_it() -> None:
    said: list[str] = []
    journal = [
        "[x] KV checksum skipped: prefill layout signature 0x3 differs from this decode's 0x5 (TP width, "
        "PP stage, or page size); its requests are admitted unverified."
    ]
    p = SimpleNamespace(
        req=SimpleNamespace(kind="decode", routed_url="http://127.0.0.1:30000"),
        files=SimpleNamespace(read=lambda unit: "[Service]\nExecStart=/x -m sglang.launch_server\n"),
        unit="d.service",
        journal=SimpleNamespace(invocation_tail=lambda unit, inv, n: journal),
        log=SimpleNamespace(emit=lambda stage, kind, text: said.append(text)),
    )
    flags = {"disaggregation-enable-kv-checksum": True}
    assert pdrouter.checksum_said(p, "inv", flags) is None  # type: ignore[arg-type]
    assert said and "skipped" in said[0] and "matched" not in said[0], said


ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "DSPARK", "NGRAM", "STANDALONE", "DFLASH", "UNO", "ngram", "eagle"]


@settings(max_examples=40, deadline=None)
@given(algo=st.sampled_from(ALGORITHMS), radix=st.booleans(), which=st.sampled_from(["prefill", "decode"]))
def test_a_decodes_radix_cache_refuses_speculation_but_dspark_and_the_eagle_family(
    algo: str, radix: bool, which: str
) -> None:
    # speculative_hook.py:163-172 compares the upper-cased algorithm after NEXTN's alias to EAGLE
    data = example()
    role(which, disaggregation_decode_enable_radix_cache=radix, speculative_algorithm=algo)(data)
    host = host_of(data)
    found = [s for s in start_refusals(host, pd_units(host)) if "speculative_hook.py" in s]
    dies = which == "decode" and radix and algo.upper() not in ("EAGLE", "EAGLE3", "NEXTN", "DSPARK")
    assert bool(found) == dies, (algo, radix, which, found)


def test_dspark_with_pipeline_parallelism_is_refused_on_a_decode_only() -> None:
    # speculative_hook.py:713-718
    def mutate(which: str) -> Mutate:
        def inner(d: dict[str, Any]) -> None:
            d["gpus"]["indices"] = [0, 1, 2, 3]
            d["pd"]["prefill"][0]["gpus"], d["pd"]["decode"][0]["gpus"] = [0, 1], [2, 3]
            d["pd"][which][0]["flags"].update({"speculative-algorithm": "DSPARK", "pp-size": 2})

        return inner

    def said(which: str) -> list[str]:
        data = example()
        mutate(which)(data)
        host = host_of(data)
        return [s for s in start_refusals(host, pd_units(host)) if "DSpark" in s]

    assert said("decode") and not said("prefill")


@pytest.mark.parametrize("backend_name", ["mooncake", "mooncake_tcp", "mori", "ascend", "nixl"])
@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_role_switching_is_refused_exactly_on_a_backend_that_can_never_switch(
    backend_name: str, which: str
) -> None:
    # base/conn.py:160 False by default; mooncake/conn.py:258 and mori/conn.py:375 True; ascend is Mooncake's
    data = example()
    backend(backend_name, role(which, enable_pd_role_switch=True))(data)
    host = host_of(data)
    found = [s for s in start_refusals(host, pd_units(host)) if "can never switch" in s]
    assert bool(found) == (backend_name == "nixl"), found
