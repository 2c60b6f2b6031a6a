"""The fleet's pure parts: inventory groups, which starts recalibrate a host, the report's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import InventoryError, UsageError
from agent.exitcodes import ExitCode
from agent.fleet.calibrate import Measured, peer_key, peers_for
from agent.fleet.inventory import group_hosts
from agent.fleet.results import FleetReport, HostResult, PlanFigures, render_fleet, results_from_events
from agent.inventory import load_host

UNITS = Path(__file__).resolve().parents[2] / "units"


def _units(tmp_path: Path, groups: dict[str, str]) -> Path:
    for name, line in groups.items():
        text = (UNITS / "ct200-sim.toml").read_text().replace('target = "ct200-sim"', f'target = "{name}"')
        (tmp_path / f"{name}.toml").write_text(line + "\n" + text)  # each its own host
    return tmp_path


def test_groups_are_read_and_selected(tmp_path: Path) -> None:
    units = _units(
        tmp_path, {"b": 'groups = ["ct-fleet", "blackwell"]', "a": 'groups = ["ct-fleet"]', "c": ""}
    )
    assert load_host("b", units).groups == ["ct-fleet", "blackwell"]
    assert load_host("c", units).groups == []
    assert [h.name for h in group_hosts(units, "ct-fleet")] == ["a", "b"]
    assert [h.name for h in group_hosts(units, "blackwell")] == ["b"]
    with pytest.raises(UsageError, match=r"no host .* in group 'gpu'"):
        group_hosts(units, "gpu")


@pytest.mark.parametrize("bad", ['["a:b"]', '["all"]', '["9x"]', '["x", "x"]', '"ct-fleet"', '["a b"]'])
def test_a_bad_group_is_refused_naming_the_key(tmp_path: Path, bad: str) -> None:
    units = _units(tmp_path, {"h": f"groups = {bad}"})
    with pytest.raises(InventoryError, match=r"h\.toml: groups"):
        load_host("h", units)


def test_only_comparable_hosts_recalibrate(tmp_path: Path) -> None:
    units = _units(tmp_path, {"a": "", "b": ""})
    host = load_host("a", units)
    flags = dict(host.sglang.flags)
    start = {"kv_tokens": 1, "avail_mem_before_weights_gb": 92.8}
    same = Measured("b", peer_key(host, flags), start).to_fact()
    other_tp = Measured("c", peer_key(host, {**flags, "tp-size": 4}), start).to_fact()
    itself = Measured("a", peer_key(host, flags), start).to_fact()
    found = peers_for(host, flags, [other_tp, itself, same, {"junk": 1}])
    assert [m.host for m in found] == ["b"]
    other_version = load_host("a", units).model_copy(
        update={"sglang": host.sglang.model_copy(update={"version": "0.5.10"})}
    )
    assert peers_for(other_version, flags, [same]) == []


def _result(host: str, outcome: str, backup: str | None = "sglang.service.bak.1") -> HostResult:
    plan = PlanFigures(0.9, 64, 204_000, True, "calibrated", ("canary a",))
    return HostResult(host, outcome, "msg", 200_000, plan, 204_100, {"mem-fraction-static": 0.85},
                      {"mem-fraction-static": 0.9}, backup)  # fmt: skip


@pytest.mark.parametrize(
    ("outcomes", "code"),
    [
        ({"a": "applied", "b": "up_to_date"}, ExitCode.OK),
        ({"a": "applied", "b": "rolled_back"}, ExitCode.ROLLED_BACK),
        ({"a": "applied"}, ExitCode.ROLLED_BACK),  # b never ran: halted
        ({"a": "applied", "b": "unreachable"}, ExitCode.UNREACHABLE),
        ({"a": "rollback_failed", "b": "unreachable"}, ExitCode.ROLLBACK_FAILED),
        ({"a": "not_feasible", "b": "applied"}, ExitCode.ROLLED_BACK),
    ],
)
def test_the_fleet_exit_code(outcomes: dict[str, str], code: ExitCode) -> None:
    report = FleetReport("g", ("a", "b"), {h: _result(h, o) for h, o in outcomes.items()}, 200_000)
    assert report.exit_code() is code


def test_results_round_trip_through_events_and_render() -> None:
    applied, failed = _result("a", "applied"), _result("b", "rolled_back")
    events = [
        {"kind": "phase", "host": "a"},
        *({"kind": "result", "result": r.to_dict()} for r in (applied, failed)),
    ]
    found = results_from_events(events)
    assert found == {"a": applied, "b": failed}
    assert found["a"].changed and not found["a"].failed and not found["b"].changed and found["b"].failed
    text = render_fleet(FleetReport("g", ("a", "b", "c"), found, 200_000))
    assert "revert: deployctl rollback a --to sglang.service.bak.1" in text
    assert "rollback b" not in text  # a rolled-back host has nothing to revert
    assert "c                    not touched" in text and "halted: c not touched" in text
    assert "204,000" in text and "204,100" in text and "planned from canary a" in text
    # Every host ran, one failed (tolerated by --max-fail): finished, but the failure is said.
    text = render_fleet(FleetReport("g", ("a", "b"), found, 200_000))
    assert "halted" not in text and text.endswith("every host ran; failed: b\n")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["apply", "a:b", "--context", "200k", "--yes"], "not a valid group name"),
        (["apply", "nogroup", "--context", "200k", "--yes"], "in group 'nogroup'"),
        (["apply", "ct-fleet", "--context", "200k"], "--yes not given"),
        (["status", "nogroup"], "in group 'nogroup'"),
    ],
)
def test_bad_fleet_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    import io

    from agent.cli.main import main
    from agent.output import Output

    units = _units(tmp_path, {"a": 'groups = ["ct-fleet"]'})
    out = Output(stdout=io.StringIO(), stderr=io.StringIO(), isatty=False, stdin_isatty=False)
    code = main(["--units", str(units), "fleet", *args], out)
    err = out.stderr.getvalue()  # type: ignore[union-attr]
    assert code == ExitCode.USAGE
    assert err.startswith("deployctl: error: ") and says in err.splitlines()[0], err


def _fleet_main(units: Path, args: list[str]) -> tuple[int, str]:
    import io

    from agent.cli.main import main
    from agent.output import Output

    out = Output(stdout=io.StringIO(), stderr=io.StringIO(), isatty=False, stdin_isatty=False)
    code = main(["--units", str(units), "fleet", "apply", *args, "--yes", "--json"], out)
    return code, out.stderr.getvalue()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--batch", "0", "--batch '0' is not a host count from 1 (4) or a percentage from 1% to 100%"),
        ("--batch", "0%", "--batch '0%' is not"),
        ("--batch", "abc", "--batch 'abc' is not"),
        ("--batch", "150%", "--batch '150%' is not"),
        ("--batch", "-1", "--batch '-1' is not"),
        ("--batch", "2.5", "--batch '2.5' is not"),
        ("--canary", "0", "--canary '0' must be at least 1"),
        ("--canary", "-1", "--canary '-1' must be at least 1"),
        ("--canary", "abc", "--canary 'abc' is not a host count"),
        ("--canary", "2", "--canary 2 is more than the 1 host in group ct-fleet"),
        ("--max-fail", "101", "--max-fail '101' is not a percentage from 0 to 100"),
        ("--max-fail", "-5", "--max-fail '-5' is not"),
        ("--max-fail", "10%", "--max-fail '10%' is not"),
    ],
)
def test_a_bad_rollout_shape_is_one_line_and_exit_2(tmp_path: Path, flag: str, value: str, says: str) -> None:
    units = _units(tmp_path, {"a": 'groups = ["ct-fleet"]'})
    code, err = _fleet_main(units, ["ct-fleet", "--context", "200k", flag, value])
    assert code == ExitCode.USAGE
    assert err.startswith("deployctl: error: ") and says in err.splitlines()[0], err


def test_a_line_still_being_written_is_held_back_until_it_is_whole() -> None:
    import io

    from agent.fleet.runner import _complete_lines

    feed, pending = io.BytesIO(b'{"kind": "phase"}\n{"kind": "res'), bytearray()
    assert _complete_lines(feed, pending) == [{"kind": "phase"}]
    feed = io.BytesIO(b'ult"}\n')
    assert _complete_lines(feed, pending) == [{"kind": "result"}] and pending == b""


def testdowntime_of_is_the_agents_stop_to_answer_figure_when_it_gives_one() -> None:
    from agent.fleet.steps import downtime_of

    assert downtime_of({"start_seconds": 2.5, "downtime": {"seconds": 3.25, "phases": {}}}) == 3.25
    assert downtime_of({"start_seconds": 2.5}) == 2.5
    assert downtime_of({"start_seconds": 2.5, "downtime": {"seconds": None}}) == 2.5
    assert downtime_of({}) is None


def test_a_bad_context_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import io

    from agent.cli.main import main
    from agent.output import Output

    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert main(["fleet", "apply", "g", "--context", "lots", "--yes"], out) == ExitCode.USAGE
    assert out.stderr.getvalue().startswith("deployctl: error: --context")  # type: ignore[attr-defined]


def test_a_canary_bigger_than_the_group_is_refused_before_ansible_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.fleet import front
    from agent.fleet.runner import Run

    units = _units(tmp_path, {h: 'groups = ["g"]' for h in ("a", "b", "c")})
    calls: list[tuple[dict[str, object], int]] = []

    def fake_playbook(
        _name: str, _units: Path, extra: dict[str, object], forks: int, _on: object, check: bool = False
    ) -> Run:
        calls.append((dict(extra), forks))
        events = [{"kind": "result", "result": _result(h, "up_to_date").to_dict()} for h in "abc"]
        return Run(0, events, "")

    monkeypatch.setattr(front, "run_playbook", fake_playbook)
    code, err = _fleet_main(units, ["g", "--context", "200k", "--canary", "5"])
    assert code == ExitCode.USAGE and calls == []
    assert err.splitlines()[0] == "deployctl: error: --canary 5 is more than the 3 hosts in group g", err
    # The whole group as the canary is what was asked for: one batch, halted as a whole by a failure.
    code, err = _fleet_main(units, ["g", "--context", "200k", "--canary", "3", "--batch", "100%"])
    assert code == ExitCode.OK, err
    assert calls == [({"deployctl_group": "g", "deployctl_context": 200_000, "deployctl_canary": 3,
                       "deployctl_batch": "100%", "deployctl_max_fail": 0}, 3)]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("kv-cache-dtype=fp8", "--kv-cache-dtype 'fp8' is not one of"),
        ("context-lenght=5", "did you mean --context-length"),
        ("context-length=5", "the target context is --context"),
    ],
)
def test_a_bad_set_is_refused_before_ansible_runs(tmp_path: Path, value: str, says: str) -> None:
    units = _units(tmp_path, {"a": 'groups = ["ct-fleet"]'})
    code, err = _fleet_main(units, ["ct-fleet", "--context", "200k", "--set", value])
    assert code == ExitCode.USAGE
    assert err.startswith("deployctl: error: ") and says in err.splitlines()[0], err


def test_the_fleet_plans_each_host_with_the_set_flags() -> None:
    """--set kv-cache-dtype=fp8_e4m3 reaches each host's plan (250k fits only with it on ct200-sim)."""
    from agent.fleet.plugin import _set_flags
    from agent.fleet.steps import plan_host

    host = load_host("ct200-sim", UNITS)
    plain, _ = plan_host(host, 250_000, {}, [])
    fp8, _ = plan_host(host, 250_000, {}, [], _set_flags(host, {"kv-cache-dtype": "fp8_e4m3"}))
    assert not plain.feasible and fp8.feasible
    fixed, _ = plan_host(host, 200_000, {}, [], {"mem-fraction-static": "0.9"})
    assert fixed.mem_fraction_static == 0.9
    with pytest.raises(UsageError, match="did you mean"):
        _set_flags(host, {"kv-cache-dtyp": "fp8_e4m3"})


def test_a_fleet_apply_sends_the_pool_as_deployctl_apply_does_calibrated_or_cold(tmp_path: Path) -> None:
    """The gate takes a pool far from a calibrated prediction for an SGLang anomaly: the fleet sent the pool
    without saying it was calibrated, so its hosts never judged one (nor got the weight-cache daemon's
    unit)."""
    from agent.apply import calibrated_pool
    from agent.fleet.steps import apply_request
    from agent.inventory import load_host
    from agent.plan.choose import Target
    from agent.plan.from_facts import plan_for_host

    host = load_host("ct200", Path(__file__).resolve().parents[2] / "units")
    start = {
        "kv_tokens": 101_134, "avail_mem_before_weights_gb": 92.80, "avail_mem_before_pool_gb": 21.12,
        "available_gpu_mem_gb": 10.86, "graph_mem_gb": 3.08, "mem_fraction_static": 0.85,
        "max_running_requests": 64, "context_len": 32768,
    }  # fmt: skip
    for starts in ([start], []):
        plan = plan_for_host(host, Target(150_000), starts, host.sglang.flags)
        req = apply_request(host, 150_000, "[Service]\nExecStart=/bin/true\n", plan.flags(), plan, {})
        assert req.planned_pool == plan.predicted_pool_tokens
        assert req.pool_calibrated is calibrated_pool(plan) is bool(starts), plan.basis


def _cached(tmp_path: Path, draft: bool) -> Path:
    """Three hosts of group g with [weight_cache] on; with or without ct200-sim's DFLASH draft."""
    import re

    units = _units(tmp_path, {h: 'groups = ["g"]' for h in ("a", "b", "c")})
    for h in ("a", "b", "c"):
        path = units / f"{h}.toml"
        text = path.read_text() if draft else re.sub(r"(?ms)^\[draft\]\n.*?(?=^\[)", "", path.read_text())
        path.write_text(text + "\n[weight_cache]\nenabled = true\n")
    return units


@pytest.mark.parametrize(
    ("draft", "extra", "says"),
    [
        (True, [], "speculative decoding"),
        (False, ["--set", "quantization=awq"], "quantization 'awq'"),
    ],
)
def test_a_fleet_rollout_refuses_what_the_weight_cache_cannot_serve_before_any_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, draft: bool, extra: list[str], says: str
) -> None:
    """As `deployctl apply` refuses it: before Ansible runs, so no canary pays a restart and a rollback."""
    from agent.fleet import front

    calls: list[str] = []
    monkeypatch.setattr(front, "run_playbook", lambda *a, **k: calls.append("ran"))
    units = _cached(tmp_path, draft)
    for check in ([], ["--dry-run"]):
        code, err = _fleet_main(units, ["g", "--context", "100k", *extra, *check])
        assert code == ExitCode.USAGE and calls == [], err
        first = err.splitlines()[0]
        assert (
            first.startswith("deployctl: error: a: [weight_cache] enabled cannot serve a: ") and says in first
        )


def test_each_fleet_host_refuses_its_checkpoints_quantization_from_its_facts(tmp_path: Path) -> None:
    """The checkpoint's own quantization (config.json, known from the host's facts) is refused by the host's
    step before the plan: nothing but the facts request reached the host."""
    from types import SimpleNamespace

    from agent.fleet import hostrun

    host = load_host("a", _cached(tmp_path, draft=False))
    config = {"quantization_config": {"quant_method": "awq"}}
    answer = {"model_facts": {"model": {"config": config}, "device": "cuda"}}
    talk = SimpleNamespace(client=SimpleNamespace(host=host), answer=answer)
    result = hostrun._planned(talk, 100_000, [], lambda *_: None, False, {})  # type: ignore[arg-type]
    assert result.outcome == "error" and "quantization 'awq'" in result.message, result.message
