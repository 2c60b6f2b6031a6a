"""Each [pd] role planned as the service it is: its weights per GPU at its own TP, a unit another host
reaches that binds loopback refused, and a role's plan that is not feasible said so (exit 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.pd.units import pd_units
from agent.plan.effective import effective
from tests.pure.test_pd import example, host_of


def tp4_prefill_tp8_decode(base_tp: int) -> dict[str, Any]:
    """A prefill at TP 4 on GPUs 0-3 and a decode at TP 8 on GPUs 8-15 of one host; the file's own
    [sglang.flags] layout TP `base_tp`, its weights per GPU stated for it."""
    data = example()
    data["gpus"]["indices"] = list(range(16))
    data["sglang"]["flags"]["tp-size"] = base_tp
    data["model"]["weights_gib_per_gpu"] = 16.0
    data["pd"]["prefill"][0].update(gpus=[0, 1, 2, 3], flags={"tp-size": 4, "chunked-prefill-size": 8192})
    data["pd"]["decode"][0].update(gpus=list(range(8, 16)), flags={"tp-size": 8, "max-running-requests": 8})
    return data


@pytest.mark.parametrize("base_tp", [1, 2, 4, 8])
def test_each_role_gets_its_weights_per_gpu_at_its_own_tp(base_tp: int) -> None:
    """16 GiB per GPU at the file's TP: the whole checkpoint is 16 x base_tp GiB, split over each role's own
    TP, exactly as `plan --set tp-size=N` restates a plain service (agent/plan/effective.py)."""
    host = host_of(tp4_prefill_tp8_decode(base_tp))
    prefill, decode = pd_units(host)
    assert prefill.host.model.weights_gib_per_gpu == pytest.approx(16.0 * base_tp / 4)
    assert decode.host.model.weights_gib_per_gpu == pytest.approx(16.0 * base_tp / 8)
    for unit, tp in ((prefill, 4), (decode, 8)):
        plain = effective(host, (("tp-size", tp),)).host.model.weights_gib_per_gpu
        assert unit.host.model.weights_gib_per_gpu == pytest.approx(plain)


@pytest.mark.parametrize(
    ("unit", "why"),
    [
        (
            {"url": "http://10.0.0.1:30010"},
            "the router reaches it at http://10.0.0.1:30010",
        ),  # the router reaches it at another address
        ({"target": "gpu2", "url": "http://gpu2:30010"}, "reaches it at"),
        (
            {"target": "gpu2", "url": "http://127.0.0.1:30010"},
            "the router runs on",
        ),  # refused for its url too
    ],
)
@pytest.mark.parametrize("bind", ["127.0.0.1", "localhost", "::1"])
def test_a_unit_reached_from_another_host_that_listens_on_loopback_is_refused(
    unit: dict[str, str], why: str, bind: str
) -> None:
    """[sglang] host (127.0.0.1 unless set) is every role's --host, and SGLang binds its bootstrap server
    there too (srt/managers/disagg_service.py): the router and a decode elsewhere cannot reach it. Refused in
    one line naming [sglang] host, before any host is asked; 0.0.0.0 or the host's address is not."""
    from agent.errors import InventoryError
    from agent.group.pdapply import refused_first
    from agent.pd.refusals import check

    data = example()
    data["sglang"]["host"] = bind
    data["pd"]["prefill"][0].update(unit)
    said = [r for r in check(host_of(data)).refusals if "[sglang] host" in r]
    assert said and said[0].startswith("pd.prefill.0: ") and why in said[0] and "\n" not in said[0], said
    with pytest.raises(InventoryError):
        refused_first(host_of(data), 32768)
    for reachable in ("0.0.0.0", "10.0.0.1"):
        data["sglang"]["host"] = reachable
        assert not [r for r in check(host_of(data)).refusals if "[sglang] host" in r]


def test_units_of_one_host_on_loopback_with_the_router_there_are_not_refused() -> None:
    data = example()
    data["sglang"]["host"] = "127.0.0.1"
    assert check_refusals(data) == []


def check_refusals(data: dict[str, Any]) -> list[str]:
    from agent.pd.refusals import check

    return list(check(host_of(data)).refusals)


def plan_in(tmp_path: Path, tp4: bool, *more: str) -> tuple[int, str]:
    """`deployctl plan` of the example (its prefill at TP 4 on its one GPU when tp4), offline: its exit
    code and text."""
    import io

    from agent.cli.main import main
    from agent.output import Output
    from tests.pure.test_pd import EXAMPLE

    text = EXAMPLE.read_text(encoding="utf-8")
    given = "flags = { tp-size = 1, chunked-prefill-size = 8192 }"
    assert given in text
    text = text.replace(given, given.replace("tp-size = 1", "tp-size = 4")) if tp4 else text
    (tmp_path / "pd-x.toml").write_text(text, encoding="utf-8")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["plan", "pd-x", "--offline", "--context", "32768", *more, "--units", str(tmp_path)], out)
    assert isinstance(out.stdout, io.StringIO)
    return code, out.stdout.getvalue()


@pytest.mark.parametrize(
    ("edit", "more", "roles", "why"),
    [
        (True, (), ["prefill[0]"], "tensor parallel 4"),
        (False, ("--mem-fraction-static", "0.99"), ["prefill[0]", "decode[0]"], "floor"),
    ],
)
def test_a_role_whose_plan_is_not_feasible_says_so_with_its_reason_and_exits_8(
    tmp_path: Path, edit: bool, more: tuple[str, ...], roles: list[str], why: str
) -> None:
    """A role's own plan not feasible (TP 4 on one GPU; a fraction above the memory floor): its line says
    NOT FEASIBLE with the planner's reason, never "holds", and plan exits 8, as a plain service's plan does;
    a role that is feasible still says holds."""
    code, text = plan_in(tmp_path, edit, *more)
    assert code == 8, text
    # a role's line (two spaces, its label); the host pool's line under a decode is indented further
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line[2] != " "}
    for label, line in lines.items():
        if label in roles:
            assert "NOT FEASIBLE: " in line and why in line.partition("NOT FEASIBLE: ")[2], line
            assert not line.endswith("holds"), line
        else:
            assert line.endswith(": holds"), line
    code, text = plan_in(tmp_path, False)
    assert code == 0 and "NOT FEASIBLE" not in text


def _two_hicache_prefills(tmp_path: Path, extra: str) -> Path:
    """units/pd-1p1d.toml with a second prefill (GPU 2) on the same host, HiCache on both prefills."""
    root = Path(__file__).resolve().parents[2]
    pd = (root / "units/pd-1p1d.toml").read_text().replace("indices = [0, 1]", "indices = [0, 1, 2]")
    one = "flags = { tp-size = 1, chunked-prefill-size = 8192 }"
    on = f"flags = {{ tp-size = 1, chunked-prefill-size = 8192, enable-hierarchical-cache = true{extra} }}"
    second = f"\n\n[[pd.prefill]]\ngpus = [2]\nport = 30011\nbootstrap_port = 8999\n{on}"
    (tmp_path / "pd-1p1d.toml").write_text(pd.replace(one, on + second))
    return tmp_path


def test_hicache_prefills_of_one_host_are_refused_with_the_auto_size_and_planned_with_sizes(
    tmp_path: Path,
) -> None:
    """Auto-sized, the two prefills (one wave) would each take 0.8 of the same free memory: refused, each
    naming both; with an explicit --hicache-size each keeps it, with its MemoryMax=."""
    from agent.inventory import load_service
    from agent.pd.plan import role_plans

    auto = role_plans(load_service("pd-1p1d", _two_hicache_prefills(_made(tmp_path / "a"), "")), 32768)
    refused = [r.plan for r in auto if r.unit.role.value == "prefill"]
    assert refused and all(not p.feasible and "prefill[0], prefill[1]" in (p.binding or "") for p in refused)
    decode = next(r.plan for r in auto if r.unit.role.value == "decode")
    assert "auto size" not in (decode.binding or "")
    sized = role_plans(
        load_service("pd-1p1d", _two_hicache_prefills(_made(tmp_path / "b"), ", hicache-size = 20")), 32768
    )
    for p in (r.plan for r in sized if r.unit.role.value == "prefill"):
        assert p.host is not None and p.host.size_gb == 20 and p.host.memory_max is not None
        assert "auto size" not in (p.binding or "")


def _made(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
