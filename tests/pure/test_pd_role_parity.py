"""What two roles must agree on beyond the flags' text: the KV pool's dtype under --kv-cache-dtype auto (each
takes its --dtype, SGLang's handshake compares only "auto"), and the page size a speculative draft's
attention backend forces (srt/arg_groups/overrides.py:1174-1187).
Generated over the spellings SGLang reads."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from agent.pd.pagesize import effective_page_size
from agent.pd.refusals import check
from tests.pure.test_pd import EXAMPLE, example, host_of
from tests.pure.test_pd_newcomer import decode_flags, refusals

# --dtype's words (srt/configs/model_config.py:2274-2280); its parser takes these and "auto" only
SAME = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32"}
WORDS = ["auto", "half", "float16", "float", "float32", "bfloat16"]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(WORDS), st.sampled_from(WORDS))
def test_the_pools_dtype_under_auto_is_compared_as_sglang_reads_dtype(a: str, b: str) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["pd"]["prefill"][0]["flags"]["dtype"] = a
        d["pd"]["decode"][0]["flags"]["dtype"] = b

    said = [s for s in refusals(mutate) if "--dtype differs" in s]
    assert bool(said) == (SAME.get(a, a) != SAME.get(b, b)), (a, b, said)


def test_a_named_kv_cache_dtype_is_not_refused_for_differing_dtype() -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["sglang"]["flags"]["kv-cache-dtype"] = "fp8_e4m3"
        d["pd"]["decode"][0]["flags"]["dtype"] = "float16"

    assert not [s for s in refusals(mutate) if "dtype" in s]


def test_one_role_without_dtype_against_one_that_names_it_is_refused() -> None:
    said = refusals(decode_flags(dtype="bfloat16"))
    assert any("prefill[0] has auto, decode[0] has bfloat16" in s for s in said), said


@given(st.sampled_from([None, 1, 8, 16, 32, 64, 128, 256]), st.sampled_from(["trtllm_mha", "fa3", "triton"]))
def test_a_draft_backend_forces_the_page_as_trtllm_mha_does(page: int | None, draft: str) -> None:
    flags: dict[str, object] = {"speculative-draft-attention-backend": draft}
    if page is not None:
        flags["page-size"] = page
    keeps = draft != "trtllm_mha" or page in (16, 32, 64, 128)
    assert effective_page_size(flags) == (("unset" if page is None else str(page)) if keeps else "64")


def test_a_draft_backend_that_keeps_the_page_is_not_refused() -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["sglang"]["flags"]["page-size"] = 16
        d["pd"]["decode"][0]["flags"]["speculative-draft-attention-backend"] = "trtllm_mha"

    assert not [s for s in refusals(mutate) if "page-size" in s]


# ---- what [pd] sets for every role, set again by hand

ROLES = st.sampled_from(["prefill", "decode"])


@settings(max_examples=20, deadline=None)
@given(ROLES, st.booleans(), st.booleans())
def test_the_kv_checksum_flag_in_any_roles_flags_is_refused(role: str, value: bool, on: bool) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["pd"]["kv_checksum"] = on
        d["pd"][role][0]["flags"]["disaggregation-enable-kv-checksum"] = value

    said = refusals(mutate)
    assert any(s.startswith(f"pd.{role}.0.flags.disaggregation-enable-kv-checksum: [pd]") for s in said), said


def test_the_kv_checksum_flag_in_the_files_flags_is_refused() -> None:
    said = refusals(lambda d: d["sglang"]["flags"].update({"disaggregation-enable-kv-checksum": True}))
    assert any(s.startswith("sglang.flags.disaggregation-enable-kv-checksum") for s in said), said


@settings(max_examples=20, deadline=None)
@given(ROLES, st.sampled_from(["0", "1", "0,1", "GPU-5f1c", "MIG-1", ""]))
def test_cuda_visible_devices_in_any_roles_environment_is_refused(role: str, value: str) -> None:
    said = refusals(lambda d: d["pd"][role][0].update(environment={"CUDA_VISIBLE_DEVICES": value}))
    assert said == (f"pd.{role}.0.environment.CUDA_VISIBLE_DEVICES: {role}[0]'s gpus set it; keep gpus and "
                    "leave it out",), said  # fmt: skip


def test_cuda_visible_devices_in_the_files_unit_environment_is_refused_once() -> None:
    def mutate(d: dict[str, Any]) -> None:
        del d["gpus"]["indices"]
        d["gpus"]["count"] = 2
        d["unit"]["environment"] = {"CUDA_VISIBLE_DEVICES": "0,1"}

    said = refusals(mutate)
    assert [s for s in said if "CUDA_VISIBLE_DEVICES" in s] == [
        "unit.environment.CUDA_VISIBLE_DEVICES: each unit's gpus set it; keep gpus and leave it out"
    ], said


# ---- the router's whole argv: words a person put in [pd.router] executable are read as the router reads them

EXE = ["/opt/sglang/.venv/bin/python", "-m", "sglang_router.launch_router"]
PREFILL, DECODE = "http://127.0.0.1:30010", "http://127.0.0.1:30020"
SMUGGLED = [
    ["--prefill", PREFILL],
    [f"--prefill={PREFILL}"],
    ["--prefill", PREFILL, "none"],
    ["--prefill", PREFILL, "8999"],
    ["--prefill", PREFILL, "8998"],  # right port, named twice
    ["--prefill", "http://127.0.0.1:30011", "8998"],  # no unit's
    ["--decode", DECODE],
    [f"--decode={DECODE}"],
    ["--decode", "http://10.0.0.9:30020"],
]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(SMUGGLED), st.sampled_from([[], ["--policy", "random"], ["--log-level", "info"]]))
def test_prefill_or_decode_words_in_the_routers_executable_are_refused(
    words: list[str], around: list[str]
) -> None:
    said = refusals(lambda d: d["pd"]["router"].update(executable=[*EXE, *around, *words]))
    assert any(s.startswith("router: ") and "[pd.router] executable" in s for s in said), said


def test_a_plain_router_executable_is_not_refused() -> None:
    assert not refusals(lambda d: d["pd"]["router"].update(executable=[*EXE, "--log-level", "info"]))


# ---- a role's flag SGLang reads as a number, written as something else: one line, exit 2, no host

NUMBERED = ["tp-size", "tensor-parallel-size", "pp-size", "page-size", "max-running-requests", "dp-size"]
NOT_INTEGERS = st.one_of(
    st.sampled_from(["two", "1.0", "1.5", "", "0x2", "1e3", "2 4"]),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)) | st.just(1.0),
)


@settings(max_examples=40, deadline=None)
@given(ROLES, st.sampled_from(NUMBERED), NOT_INTEGERS)
def test_a_numbered_role_flag_that_is_no_integer_is_refused_before_any_unit(
    role: str, name: str, value: object
) -> None:
    data = example()
    data["pd"][role][0]["flags"].pop("tp-size", None)
    data["pd"][role][0]["flags"][name] = value
    said = check(host_of(data)).refusals
    assert len(said) == 1 and said[0].startswith(f"pd.{role}.0.flags.{name}: --{name}"), said


@pytest.mark.parametrize(
    "command",
    [["plan", "pd", "--offline", "--context", "32k"], ["render", "pd", "--context", "32k"], ["status", "pd"]],
)
def test_a_tp_size_written_as_text_is_one_line_and_exit_2(tmp_path: Path, command: list[str]) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "flags = { tp-size = 1, chunked-prefill-size = 8192 }", 'flags = { tp-size = "two" }'
    )
    (tmp_path / "pd.toml").write_text(text)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*command, "--units", str(tmp_path)], out)
    assert isinstance(out.stderr, io.StringIO)
    errors = [line for line in out.stderr.getvalue().splitlines() if line.startswith("deployctl: error:")]
    assert code == ExitCode.USAGE and len(errors) == 1 and "tp-size 'two' is not an integer" in errors[0], (
        errors
    )
