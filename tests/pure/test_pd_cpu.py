"""The real tier's [pd] file (tests/realpd.py: the real 1P1D on a test host's CPU) as `deployctl render`
renders it, offline: each unit carries the switches the CPU pair needs, and the router's unit its own
environment (where the router's package lives)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.exitcodes import ExitCode
from agent.output import Output
from tests import realpd
from tests.realpd import DECODE, PREFILL, ROUTER, Ports

PORTS = Ports(prefill=38100, bootstrap=38110, decode=38101, router=38120)


def render(units: Path, text: str) -> tuple[int, str, str]:
    (units / f"{realpd.SERVICE}.toml").write_text(text)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    argv = ["render", realpd.SERVICE, "--context", realpd.CONTEXT, "--json", "--units", str(units)]
    code = main(argv, out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def rendered(tmp_path: Path, text: str) -> dict[str, str]:
    code, stdout, stderr = render(tmp_path, text)
    assert code == 0, stderr
    return {u["unit_name"]: u["unit"] for u in json.loads(stdout)["units"]}


def environment(unit: str) -> dict[str, str]:
    pairs = [line[len('Environment="') : -1] for line in unit.splitlines() if line.startswith("Environment=")]
    return dict(pair.split("=", 1) for pair in pairs)


def test_each_unit_carries_the_switches_the_cpu_pair_needs(tmp_path: Path) -> None:
    units = rendered(tmp_path, realpd.inventory(PORTS))
    assert set(units) == {PREFILL, DECODE, ROUTER}
    prefill, decode = environment(units[PREFILL]), environment(units[DECODE])
    for env in (prefill, decode):
        assert env["SGLANG_HOST_IP"] == "127.0.0.1" and env["SGLANG_USE_CPU_ENGINE"] == "1"
        assert env["LD_LIBRARY_PATH"] == f"{realpd.HOST_PD}/lib"
        assert env["PYTHONPATH"].split(":") == ["/opt/deployctl-real-site", f"{realpd.HOST_PD}/site"]
    for switch in (
        "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER",
        "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX",
    ):
        assert switch in prefill and switch not in decode  # the prefill's own
    for name in (PREFILL, DECODE):
        assert "--disaggregation-transfer-backend mooncake_tcp" in units[name]
        assert "--device cpu" in units[name] and "--page-size 1 " in units[name]
    assert "--disaggregation-decode-retraction-backup cpu_tensor" in units[DECODE]
    assert "retraction" not in units[PREFILL]
    assert "--disaggregation-bootstrap-port 38110" in units[PREFILL]
    assert environment(units[ROUTER]) == {"PYTHONPATH": f"{realpd.HOST_PD}/site"}
    assert "--prefill http://127.0.0.1:38100 38110" in units[ROUTER]
    assert "--health-check-interval-secs 5" in units[ROUTER]


def test_the_pair_on_another_page_size_is_refused_before_any_unit_is_rendered(tmp_path: Path) -> None:
    code, stdout, stderr = render(tmp_path, realpd.inventory(PORTS, {"page-size": 16}))
    assert code == ExitCode.USAGE and not stdout
    assert "page-size" in stderr.splitlines()[0]


@pytest.mark.parametrize(
    ("environment_toml", "said"),
    [
        ('{ "BAD-NAME" = "1" }', "pd.router.environment.BAD-NAME: a variable name must match"),
        ('{ RUST_LOG = "a\\nb" }', "control characters"),
    ],
)
def test_a_router_environment_systemd_cannot_take_is_refused(
    tmp_path: Path, environment_toml: str, said: str
) -> None:
    text = realpd.inventory(PORTS).replace(
        f'environment = {{ "PYTHONPATH" = "{realpd.HOST_PD}/site" }}', f"environment = {environment_toml}"
    )
    code, stdout, stderr = render(tmp_path, text)
    assert code == ExitCode.USAGE and not stdout
    assert said in stderr.splitlines()[0]


def test_a_router_environment_is_quoted_like_the_servers(tmp_path: Path) -> None:
    """systemd would expand % specifiers and read quotes: the router's values are escaped as a server's."""
    text = realpd.inventory(PORTS).replace(
        f'environment = {{ "PYTHONPATH" = "{realpd.HOST_PD}/site" }}',
        'environment = { RUST_LOG = "info,smg=debug %h \\"q\\"" }',
    )
    units = rendered(tmp_path, text)
    assert 'Environment="RUST_LOG=info,smg=debug %%h \\"q\\""' in units[ROUTER].splitlines()


def test_plan_of_the_real_pairs_file_plans_each_cpu_unit_from_the_files_ram(tmp_path: Path) -> None:
    """It stopped at the CPU planner's refusal (no start, no MemAvailable: a [pd] plan asks no host):
    offline, each CPU unit is planned cold from [gpus] memory_gib as the host's RAM, shared by the units
    of that host."""
    (tmp_path / f"{realpd.SERVICE}.toml").write_text(realpd.inventory(PORTS))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    argv = [
        "plan",
        realpd.SERVICE,
        "--offline",
        "--context",
        realpd.CONTEXT,
        "--json",
        "--units",
        str(tmp_path),
    ]
    code = main(argv, out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    assert code == 0, out.stderr.getvalue()
    roles = json.loads(out.stdout.getvalue())["roles"]
    assert [r["role"] for r in roles] == ["prefill", "decode"]
    assert all(r["holds"] and r["feasible"] for r in roles), roles
    decode = roles[1]
    assert decode["need_tokens"] == 2 * (4096 + 512)
    assert decode["plan"]["basis"] == "architecture"  # cold: no start of its own yet
    assert any("8.00 GiB" in n and "2 units" in n for n in decode["plan"]["notes"]), decode["plan"]["notes"]
