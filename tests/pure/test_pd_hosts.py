"""One host however it is spelled, loopback however a URL writes it, and what a [pd] file holds on each
host: the rules of agent/protocol/addresses.py as properties, the refusals and inventory checks on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import InventoryError
from agent.inventory import load_service
from agent.pd.refusals import check
from agent.protocol.addresses import host_key, loopback, same_host
from tests.pure.test_pd import EXAMPLE, example, host_of
from tests.pure.test_review40_findings import OTHER

NAMES = st.sampled_from(["gpu-pd", "node7.lab.example", "10.0.0.5"])


@st.composite
def spelled(draw: st.DrawFn, name: str) -> str:
    """One SSH target of `name`: any user@, any :port, any case, a trailing dot."""
    user = draw(st.sampled_from(["", "root@", "sglang@"]))
    host = "".join(c.upper() if draw(st.booleans()) else c for c in name) + draw(st.sampled_from(["", "."]))
    port = draw(st.sampled_from(["", ":22", ":2222"]))
    return f"{user}{host}{port}"


@given(NAMES.flatmap(lambda n: st.tuples(st.just(n), spelled(n), spelled(n))))
def test_every_spelling_of_a_host_is_one_host(case: tuple[str, str, str]) -> None:
    name, a, b = case
    assert host_key(a) == name and same_host(a, b)


def test_ipv6_targets_keep_their_address_and_other_hosts_differ() -> None:
    assert host_key("root@[fd00::5]:22") == host_key("fd00::5") == "fd00::5"
    assert not same_host("gpu-pd", "gpu-pd2") and not same_host("root@gpu-a", "root@gpu-b")


LOOPBACKS = st.one_of(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(1, 254)).map(
        lambda t: "127.{}.{}.{}".format(*t)
    ),
    st.sampled_from(["[::1]", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]"]),
    st.sampled_from(["localhost", "LocalHost", "LOCALHOST"]),
)
OTHERS = st.sampled_from(["gpu-b", "10.0.0.7", "[fd00::7]", "127.example.com", "localhost-b", "[::2]"])


@given(LOOPBACKS, st.sampled_from(["http", "https"]))
def test_a_decode_on_another_host_at_any_loopback_spelling_is_refused(address: str, scheme: str) -> None:
    data = example()
    data["pd"]["decode"][0].update(target="gpu-b", url=f"{scheme}://{address}:30020")
    data["pd"]["prefill"][0]["url"] = "http://gpu-pd:30010"
    said = check(host_of(data)).refusals
    assert loopback(address) and any("pd.decode.0.url: the router runs on another host" in s for s in said)


@given(OTHERS)
def test_an_address_other_hosts_reach_is_no_loopback(address: str) -> None:
    assert not loopback(address)


@settings(max_examples=30)
@given(spelled("gpu-pd"))
def test_a_twin_prefill_on_any_spelling_of_its_host_clashes(target: str) -> None:
    data = example()
    data["pd"]["prefill"].append({**data["pd"]["prefill"][0], "target": target, "url": "http://gpu-pd:30010"})
    said = check(host_of(data)).refusals
    for clash in ("both listen on port 30010", "share GPU 0", "share bootstrap port 8998"):
        assert any(f"prefill[0] and prefill[1] on 'gpu-pd' {clash}" in s for s in said), said


@settings(max_examples=30)
@given(spelled("gpu-pd"))
def test_a_decode_on_its_prefills_host_spelled_otherwise_may_dial_its_loopback(target: str) -> None:
    data = example()
    data["pd"]["decode"][0]["target"] = target
    assert check(host_of(data)).refusals == ()


def test_a_prefill_at_loopback_is_refused_for_each_decode_on_another_host() -> None:
    data = example()
    data["pd"]["decode"][0].update(target="gpu-b", url="http://gpu-b:30020")
    data["pd"]["decode"].append({**data["pd"]["decode"][0], "target": "gpu-pd", "port": 30021, "url": None})
    data["pd"]["decode"][1].pop("url")
    data["pd"]["decode"][1]["gpus"] = [0]
    said = [s for s in check(host_of(data)).refusals if "bootstrap host" in s]
    assert len(said) == 1 and "decode[0] on 'gpu-b'" in said[0] and said[0].startswith("pd.prefill.0.url")


@given(st.integers(1, 65535), st.sampled_from(["http", "https"]), st.booleans())
def test_a_url_names_its_units_own_port(port: int, scheme: str, written: bool) -> None:
    data = example()
    url = f"{scheme}://127.0.0.1:{port}" if written else f"{scheme}://127.0.0.1"
    data["pd"]["decode"][0]["url"] = url
    said = [s for s in check(host_of(data)).refusals if s.startswith("pd.decode.0.url")]
    named = port if written else (443 if scheme == "https" else 80)
    assert bool(said) == (named != 30020), said
    if named == 30010:
        assert "prefill[0]'s" in said[0]


@pytest.mark.parametrize(
    ("router", "refused"),
    [
        ({"unit": "llama-pd-decode-0.service"}, True),
        ({"unit": "llama-pd-decode-0.service", "target": "gpu-b", "url": "http://gpu-b:30000"}, False),
    ],
)
def test_the_routers_unit_name_is_its_hosts_only(router: dict[str, Any], refused: bool) -> None:
    data = example()
    data["pd"]["router"].update(router)
    for unit in (*data["pd"]["prefill"], *data["pd"]["decode"]):
        unit.setdefault("url", f"http://gpu-pd:{unit['port']}")
    said = [s for s in check(host_of(data)).refusals if "both unit" in s]
    assert bool(said) == refused, said


def _files(tmp_path: Path, pd: str, other: str) -> Path:
    (tmp_path / "pd.toml").write_text(pd)
    (tmp_path / "other.toml").write_text(other)
    return tmp_path


ROUTER_ON_B = '[pd.router]\ntarget = "root@GPU-B:22"\nurl = "http://gpu-b:30000"\nport = 30000\n'


def test_the_routers_port_on_its_own_host_is_held_against_that_hosts_files(tmp_path: Path) -> None:
    pd = EXAMPLE.read_text(encoding="utf-8").replace("[pd.router]\nport = 30000\n", ROUTER_ON_B)
    assert ROUTER_ON_B in pd
    units = _files(tmp_path, pd, OTHER.replace('target = "gpu-pd"', 'target = "gpu-b"').replace("2]", "0]"))
    with pytest.raises(InventoryError, match="both listen on port 30000 on host 'gpu-b'"):
        load_service("pd", units)
    (tmp_path / "other.toml").write_text(OTHER.replace('"gpu-pd"', '"gpu-b"').replace("30000", "30099"))
    assert load_service("pd", units).pd is not None  # another port there: no clash


@pytest.mark.parametrize(
    ("port", "clash"),
    [("30010", "port 30010"), ("8998", "port 8998"), ("30020", "port 30020"), ("30099", None)],
)
def test_a_roles_ports_are_held_against_its_hosts_files(tmp_path: Path, port: str, clash: str | None) -> None:
    other = OTHER.replace('target = "gpu-pd"', 'target = "sglang@gpu-pd"').replace("30000", port)
    units = _files(tmp_path, EXAMPLE.read_text(encoding="utf-8"), other)
    if clash is None:
        assert load_service("other", units).sglang.port == 30099
        return
    with pytest.raises(InventoryError, match=f"both listen on {clash} on host 'gpu-pd'"):
        load_service("other", units)
