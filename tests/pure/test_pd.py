"""A [pd] service: its inventory, one plan and one unit per role, the router in PD mode, and a corpus of
seeded misconfigurations each refused before anything is touched (valid ones never refused)."""

from __future__ import annotations

import copy
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig, load_host
from agent.output import Output
from agent.pd.refusals import BACKEND_MODULES, DecodeNeed, PdHostFacts, check
from agent.pd.router import router_words, unnamed_bootstraps
from agent.pd.units import Role, pd_units

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "units" / "pd-1p1d.toml"


def example() -> dict[str, Any]:
    return tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))


def host_of(data: dict[str, Any]) -> HostConfig:
    return HostConfig.model_validate({"name": "pd", **data})


def run(argv: list[str]) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*argv, "--units", str(ROOT / "units")], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


# ---- the example plans and renders offline


def test_the_example_plans_one_plan_per_role() -> None:
    code, text, _ = run(["plan", "pd-1p1d", "--offline", "--context", "32768", "--json"])
    assert code == 0
    doc = json.loads(text)
    assert [r["role"] for r in doc["roles"]] == ["prefill", "decode"]
    decode = doc["roles"][1]
    # the decode's need: --max-running-requests 8 x (context + SGLang's 512 reserved tokens)
    assert decode["need_tokens"] == 8 * (32768 + 512)
    assert decode["plan"]["predicted_pool_low_tokens"] >= decode["need_tokens"] and decode["holds"]
    prefill = doc["roles"][0]
    assert prefill["need_tokens"] == 8192 + 2 * 32768  # the chunk and two in-flight transfers
    assert "first-token" in doc["trade"]


def test_the_text_plan_states_the_trade() -> None:
    code, text, _ = run(["plan", "pd-1p1d", "--offline", "--context", "32768"])
    assert code == 0
    assert "prefill[0]" in text and "decode[0]" in text and "+72 %" in text


def test_a_decode_that_cannot_hold_its_concurrency_is_refused() -> None:
    code, _, err = run(["plan", "pd-1p1d", "--offline", "--context", "131072"])
    assert code == ExitCode.USAGE
    assert "decode[0]: its pool holds about" in err and "lower its max-running-requests to" in err


def test_the_example_renders_each_role_and_the_router() -> None:
    code, text, _ = run(["render", "pd-1p1d", "--context", "32768", "--json"])
    assert code == 0
    units = {u["unit_name"]: u["unit"] for u in json.loads(text)["units"]}
    prefill, decode, router = (
        units["llama-pd-prefill-0.service"],
        units["llama-pd-decode-0.service"],
        units["llama-pd-router.service"],
    )
    assert "--disaggregation-mode prefill" in prefill and "--disaggregation-bootstrap-port 8998" in prefill
    assert "--disaggregation-mode decode" in decode and "bootstrap-port" not in decode
    assert 'CUDA_VISIBLE_DEVICES=0"' in prefill and 'CUDA_VISIBLE_DEVICES=1"' in decode
    assert "--prefill http://127.0.0.1:30010 8998" in router and "--decode http://127.0.0.1:30020" in router


def test_the_router_words_parse_with_sglang_router_itself() -> None:
    """The installed sglang-router 0.3.2 reads each prefill with its bootstrap port and each decode."""
    launch = pytest.importorskip("sglang_router.launch_router")
    data = example()
    data["pd"]["prefill"].append({"gpus": [2], "port": 30011, "bootstrap_port": 8999})
    data["pd"]["decode"].append({"gpus": [3], "port": 30021, "flags": {"max-running-requests": 4}})
    host = host_of(data)
    units = pd_units(host)
    parsed = launch.parse_router_args(router_words(host, units))
    assert parsed.pd_disaggregation
    assert parsed.prefill_urls == [(u.url, u.bootstrap_port) for u in units if u.role is Role.PREFILL]
    assert parsed.decode_urls == [u.url for u in units if u.role is Role.DECODE]


# ---- bad input: one line, exit 2


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d["pd"]["prefill"][0]["flags"].update({"disaggregation-mode": "decode"}), "[pd] sets it"),
        (lambda d: d["pd"]["decode"][0].update({"bootstrap_port": 9000}), "decode.0.bootstrap_port"),
        (lambda d: d["pd"]["router"]["flags"].update({"prefill": "http://x:1"}), "renders it from the roles"),
        (lambda d: d.update({"nodes": {"others": ["b"], "dist_init_addr": "a:5000"}}), "not with [pd]"),
        (lambda d: d["pd"].update({"transfer_backend": "tcp"}), "transfer_backend"),
        (lambda d: d["pd"].update({"decode": []}), "pd.decode"),
    ],
)
def test_a_bad_pd_section_is_one_line(tmp_path: Path, change: Any, said: str) -> None:
    data = example()
    change(data)
    (tmp_path / "bad.toml").write_text(_toml(data), encoding="utf-8")
    with pytest.raises(Exception) as caught:
        load_host("bad", tmp_path)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def _toml(data: dict[str, Any]) -> str:
    """A minimal TOML writer for the example's shapes (tables, arrays of tables, inline values)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    lines = []
    for key, v in data.items():
        if not isinstance(v, dict):
            lines.append(f"{key} = {value(v)}")
    for key, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{key}]")
            lines += [f"{json.dumps(k)} = {value(x)}" for k, x in v.items()]
    return "\n".join(lines) + "\n"


# ---- the corpus: generated valid services, each seeded with one misconfiguration


@st.composite
def valid_services(draw: st.DrawFn) -> dict[str, Any]:
    """1-3 prefills and 1-3 decodes over one or two hosts, each unit its own GPUs and ports."""
    data = example()
    hosts = draw(st.sampled_from([["gpu-pd"], ["gpu-pd", "gpu-b"]]))
    n_p, n_d = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    tp = draw(st.sampled_from([1, 2]))
    dtype = draw(st.sampled_from(["auto", "bf16", "fp8_e4m3"]))
    page = draw(st.sampled_from([1, 16, 64]))
    data["sglang"]["flags"] = {"page-size": page, "kv-cache-dtype": dtype}
    data["pd"]["transfer_backend"] = draw(st.sampled_from(["mooncake", "mooncake_tcp", "nixl", "mori"]))
    next_gpu: dict[str, int] = {h: 0 for h in hosts}
    port = iter(range(31000, 32000))
    boot = iter(range(9000, 9100))

    def unit(i: int, role: str) -> dict[str, Any]:
        target = hosts[i % len(hosts)]
        gpus = list(range(next_gpu[target], next_gpu[target] + tp))
        next_gpu[target] += tp
        p = next(port)
        made: dict[str, Any] = {"gpus": gpus, "port": p, "target": target, "flags": {"tp-size": tp}}
        made["url"] = f"http://{target}:{p}"
        if role == "prefill":
            made["bootstrap_port"] = next(boot)
        else:
            made["flags"]["max-running-requests"] = draw(st.integers(1, 64))
        return made

    data["pd"]["prefill"] = [unit(i, "prefill") for i in range(n_p)]
    data["pd"]["decode"] = [unit(i, "decode") for i in range(n_d)]
    data["pd"]["router"]["target"] = hosts[0]
    data["gpus"]["indices"] = list(range(max(next_gpu[hosts[0]], 1)))  # what the file holds on its host
    return data


def facts_for(data: dict[str, Any], **over: Any) -> dict[str, PdHostFacts]:
    module = BACKEND_MODULES.get(data["pd"]["transfer_backend"], "sglang")
    base = PdHostFacts("0.5.23", frozenset({module, "sglang"}), ("mlx5_0", "mlx5_1"))
    hosts = {u.get("target", "gpu-pd") for u in [*data["pd"]["prefill"], *data["pd"]["decode"]]}
    for unit in [*data["pd"]["prefill"], *data["pd"]["decode"]]:
        unit.setdefault("ib_device", "mlx5_0")  # a valid service chooses its RDMA device
    return {h: PdHostFacts(**{**base.__dict__, **over}) if h == "gpu-pd" else base for h in hosts}


def _first_prefill_on(data: dict[str, Any], host: str) -> dict[str, Any] | None:
    return next((u for u in data["pd"]["prefill"] if u["target"] == host), None)


def seed(kind: str, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, PdHostFacts], str]:
    """One misconfiguration of the given kind, the facts the check reads, and what its line must say."""
    data = copy.deepcopy(data)
    facts = facts_for(data)
    p0, d0 = data["pd"]["prefill"][0], data["pd"]["decode"][0]
    if kind == "page-size":
        d0["flags"]["page-size"] = 32
    elif kind == "kv-dtype-text":  # auto and bf16 are one dtype, two texts: SGLang compares the text
        data["sglang"]["flags"]["kv-cache-dtype"] = "auto"
        d0["flags"]["kv-cache-dtype"] = "bf16"
    elif kind == "shared-bootstrap":
        twin = copy.deepcopy(p0)
        twin.update({"port": 32500, "gpus": [40, 41], "url": f"http://{p0['target']}:32500"})
        data["pd"]["prefill"].append(twin)
    elif kind == "bootstrap-is-http":
        same = [u for u in data["pd"]["decode"] if u["target"] == p0["target"]]
        p0["bootstrap_port"] = same[0]["port"] if same else p0["port"]
    elif kind == "backend-missing":
        facts = facts_for(data, importable=frozenset({"sglang"}))
    elif kind in ("nixl-no-device", "fake-on-prefill"):
        data["pd"]["transfer_backend"] = "nixl" if kind == "nixl-no-device" else "fake"
        facts = facts_for(data)
        p0.pop("ib_device")
    elif kind == "models":
        d0["flags"]["model-path"] = "/models/another"
    elif kind == "releases":
        facts = facts_for(data, sglang_version="0.5.22")
    else:
        assert kind == "no-decode-target"
        del d0["flags"]["max-running-requests"]
    return data, facts, SAID[kind].format(port=p0["bootstrap_port"])


SAID = {
    "page-size": "--page-size differs",
    "kv-dtype-text": "--kv-cache-dtype differs",
    "shared-bootstrap": "share bootstrap port {port}",
    "bootstrap-is-http": "is an HTTP port of",
    "backend-missing": "transfer backend needs",
    "nixl-no-device": "NIXL with no RDMA device chosen",
    "fake-on-prefill": "SGLang's prefill refuses it",
    "models": "different models",
    "releases": "different SGLang releases",
    "no-decode-target": "max-running-requests: required",
}


KINDS = list(SAID)


@given(valid_services())
def test_a_valid_service_is_not_refused(data: dict[str, Any]) -> None:
    facts = facts_for(data)
    verdict = check(host_of(data), facts)
    assert verdict.refusals == ()


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40)
@given(data=valid_services())
def test_each_seeded_misconfiguration_is_refused_in_one_line(kind: str, data: dict[str, Any]) -> None:
    bad, facts, said = seed(kind, data)
    # Releases differ between hosts: a service on one host has one
    assume(kind != "releases" or len({u["target"] for u in bad["pd"]["prefill"] + bad["pd"]["decode"]}) > 1)
    refusals = check(host_of(bad), facts).refusals
    assert any(said in r for r in refusals), (kind, refusals)
    assert all("\n" not in r and ": " in r for r in refusals)


@given(valid_services(), st.integers(0, 3))
def test_a_router_that_does_not_name_a_bootstrap_port_is_refused(data: dict[str, Any], how: int) -> None:
    host = host_of(data)
    units = pd_units(host)
    words = router_words(host, units)
    assert unnamed_bootstraps(words, units) == []
    at = words.index("--prefill")
    broken = [
        words[: at + 2] + words[at + 3 :],  # the port left out: the router's "no bootstrap port"
        [*words[: at + 2], "none", *words[at + 3 :]],
        [*words[: at + 2], str(int(words[at + 2]) + 1), *words[at + 3 :]],
        [w for w in words if w != "--pd-disaggregation"],
    ][how]
    assert unnamed_bootstraps(broken, units)


def test_a_short_decode_pool_is_refused_and_a_fitting_one_is_not() -> None:
    host = host_of(example())
    short = DecodeNeed("decode[0]", 8, 32768, 512, 8 * (32768 + 512) - 1)
    assert check(host, decodes=[short]).refusals
    assert not check(host, decodes=[DecodeNeed("decode[0]", 8, 32768, 512, 8 * (32768 + 512))]).refusals


@pytest.mark.parametrize(("attention", "warned"), [("gqa", True), ("mla", False)])
def test_different_tp_sizes_warn_for_a_non_mla_model(attention: str, warned: bool) -> None:
    data = example()
    data["model"]["attention"] = attention
    if attention == "mla":
        data["model"].update({"kv_lora_rank": 512, "qk_rope_head_dim": 64})
    data["pd"]["decode"][0]["gpus"] = [1, 2]
    data["gpus"]["indices"] = [0, 1, 2]
    data["pd"]["decode"][0]["flags"]["tp-size"] = 2
    verdict = check(host_of(data))
    assert verdict.refusals == ()
    assert bool(verdict.warnings) is warned


def test_a_pd_service_never_reaches_a_host_through_a_one_host_session() -> None:
    """A command not built for a [pd] file that would open the one-host session: one line says which commands
    are built, and that this one is not (backups and facts ask each unit: tests/pure/test_pd_info.py)."""
    from agent.errors import UsageError
    from agent.orchestrate.asked import Connection
    from agent.orchestrate.session import session

    with pytest.raises(UsageError) as said, session(Connection("pd-1p1d", str(ROOT / "units"))):
        pass
    assert "only plan, render, apply, status, rollback, backups and facts are built so far" in str(said.value)


def test_a_unit_outside_the_files_gpus_is_refused() -> None:
    """The file's [gpus] indices are what the host's other services are checked against: a unit on that
    host outside them could share a GPU with another file unseen."""
    data = example()
    data["pd"]["decode"][0]["gpus"] = [5]
    assert any("pd.decode.0.gpus: GPU 5 is not in [gpus] indices" in r for r in check(host_of(data)).refusals)
    data["pd"]["decode"][0].update({"target": "gpu-b", "url": "http://gpu-b:30020"})  # another host: its own
    data["pd"]["prefill"][0]["url"] = "http://gpu-pd:30010"  # the decode dials it: not at its own loopback
    assert check(host_of(data)).refusals == ()


@settings(max_examples=25)
@given(st.integers(1, 96), st.sampled_from([4096, 16384, 32768, 65536]))
def test_a_decode_is_refused_exactly_when_its_plan_cannot_hold_its_need(running: int, context: int) -> None:
    """The refusal reads the decode's own plan: refused iff running x (context + 512) > the pool's low end."""
    from agent.pd.plan import decode_needs, role_plans

    data = example()
    data["pd"]["decode"][0]["flags"]["max-running-requests"] = running
    host = host_of(data)
    plans = role_plans(host, context)
    decode = next(p for p in plans if p.unit.role is Role.DECODE)
    refused = check(host, decodes=decode_needs(plans, context)).refusals
    assert decode.need_tokens == running * (context + 512)
    assert bool(refused) is (decode.plan.predicted_pool_low_tokens < decode.need_tokens)


@pytest.mark.parametrize(("reserved", "counted"), [(None, 512), (0, 0), (64, 64)])
def test_a_decode_reserves_what_its_flag_says_and_512_only_when_unset(
    reserved: int | None, counted: int
) -> None:
    """SGLang 0.5.23 reserves --num-reserved-decode-tokens per running request (512 by default): an explicit
    0 is 0, not the default."""
    from agent.pd.plan import need_of

    data = example()
    decode = data["pd"]["decode"][0]
    if reserved is not None:
        decode["flags"]["num-reserved-decode-tokens"] = reserved
    host = host_of(data)
    unit = next(u for u in pd_units(host) if u.role is Role.DECODE)
    running = decode["flags"]["max-running-requests"]
    assert need_of(host, unit, 32768)[0] == running * (32768 + counted)


def test_an_unset_chunk_counts_a_whole_prompt() -> None:
    from agent.pd.plan import need_of

    data = example()
    del data["pd"]["prefill"][0]["flags"]["chunked-prefill-size"]
    host = host_of(data)
    prefill = pd_units(host)[0]
    assert need_of(host, prefill, 32768)[0] == 32768 + 2 * 32768


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "pd-1p1d", "--offline", "--context", "32k", "--set", "page-size=16"],
        ["plan", "pd-1p1d", "--context", "32k", "--from-log", "examples/ct200-start.log"],
        ["render", "pd-1p1d", "--context", "32k", "--diff"],
        ["render", "pd-1p1d", "--context", "32k", "--max-running-requests", "4"],
    ],
)
def test_what_a_pd_service_does_not_take_is_one_line(argv: list[str]) -> None:
    code, _, err = run(argv)
    assert code == ExitCode.USAGE and "[pd] service" in err and len(err.strip().splitlines()) <= 2


def test_the_rdma_device_reaches_each_unit_and_a_units_own_wins() -> None:
    data = example()
    data["pd"].update({"transfer_backend": "nixl", "ib_device": "mlx5_0"})
    data["pd"]["decode"][0]["ib_device"] = "mlx5_1,mlx5_2"
    prefill, decode = pd_units(host_of(data))
    assert prefill.host.sglang.flags["disaggregation-ib-device"] == "mlx5_0"
    assert decode.host.sglang.flags["disaggregation-ib-device"] == "mlx5_1,mlx5_2"
    assert decode.host.sglang.flags["disaggregation-transfer-backend"] == "nixl"
    facts = {"gpu-pd": PdHostFacts("0.5.23", frozenset({"nixl"}), ("mlx5_0", "mlx5_1", "mlx5_2"))}
    assert check(host_of(data), facts).refusals == ()
