"""Several services on one host: each inventory file is one SGLang unit on the host its ssh.target names.

Their GPUs ([gpus] indices), units, ports and metrics files must not clash; each renders its own
CUDA_VISIBLE_DEVICES, plans on its own GPUs, and takes its own lock.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from agent.errors import InventoryError, UsageError
from agent.exitcodes import ExitCode
from agent.fleet.inventory import all_hosts, group_hosts
from agent.host import model_facts, runner
from agent.host.change.transaction import Result
from agent.inventory import HostConfig, load_host, load_service
from agent.plan.choose import Target
from agent.plan.facts import service_gpus
from agent.plan.from_facts import plan_from_host_facts
from agent.protocol.events import Outcome
from agent.protocol.requests import Request
from agent.remote.client import base_request
from agent.render import render_unit, template_dir

UNITS = Path(__file__).resolve().parents[2] / "units"


def service_file(gpus: str, unit: str, port: int, target: str = "gpu1", tp: int | None = None) -> str:
    """ct200-sim as one service of a shared host: its [gpus] table replaced by `gpus` (TOML lines)."""
    text = (UNITS / "ct200-sim.toml").read_text()
    text = re.sub(r"(?ms)^\[gpus\]\n.*?\n\n", f"[gpus]\n{gpus}\nmemory_gib = 95.6\n\n", text)
    text = re.sub(r'(?m)^target = "ct200-sim".*$', f'target = "{target}"', text)
    text = re.sub(r'(?m)^name = "sglang.service"$', f'name = "{unit}"', text)
    text = re.sub(r"(?m)^port = \d+$", f"port = {port}", text)
    if tp is not None:
        text = re.sub(r"(?m)^tp-size = \d+$", f"tp-size = {tp}", text)
    return text


def write(units: Path, **files: str) -> Path:
    for name, text in files.items():
        (units / f"{name}.toml").write_text(text)
    return units


def two_services(
    tmp_path: Path, a_gpus: str = "indices = [0, 1, 2, 3]", b_gpus: str = "indices = [4, 5, 6, 7]"
) -> Path:
    return write(
        tmp_path,
        a='groups = ["pool"]\n' + service_file(a_gpus, "sglang-a.service", 30001, tp=4),
        b='groups = ["pool"]\n' + service_file(b_gpus, "sglang-b.service", 30002, tp=4),
    )


# -- [gpus] indices -------------------------------------------------------------------------------
def test_indices_give_the_count(tmp_path: Path) -> None:
    host = load_host("a", write(tmp_path, a=service_file("indices = [6, 7]", "e.service", 1, tp=2)))
    assert host.gpus.count == 2 and host.gpus.indices == [6, 7] and host.gpu_set == (6, 7)
    whole = load_host("b", write(tmp_path, b=service_file("count = 8", "s.service", 2)))
    assert whole.gpus.indices is None and whole.gpu_set == tuple(range(8))


@pytest.mark.parametrize(
    ("gpus", "says"),
    [
        ("count = 4\nindices = [0, 1]", "a.toml: gpus: count: 4, but indices name 2 GPUs (leave count out"),
        ("indices = [0, 0]", "a.toml: gpus: indices: names a GPU twice"),
        (
            "indices = []",
            "a.toml: gpus: indices: must name at least one GPU (leave it out for GPUs 0 to count-1)",
        ),
        ("indices = [-1]", "a.toml: gpus.indices.0: Input should be greater than or equal to 0"),
        ("indices = [64]", "a.toml: gpus.indices.0: Input should be less than 64"),
        ('indices = ["x"]', "a.toml: gpus.indices.0: Input should be a valid integer"),
        ("memory_gib = 1.0", "a.toml: gpus.count: Field required"),
    ],
)
def test_bad_indices_are_one_line_naming_the_key(tmp_path: Path, gpus: str, says: str) -> None:
    text = service_file(gpus, "a.service", 1).replace("memory_gib = 95.6\n", "", 1 if "memory" in gpus else 0)
    write(tmp_path, a=text)
    with pytest.raises(InventoryError) as err:
        load_host("a", tmp_path)
    assert says in err.value.message and "\n" not in err.value.message, err.value.message


def test_indices_and_a_cuda_visible_devices_of_the_unit_are_one_setting_too_many(tmp_path: Path) -> None:
    text = service_file("indices = [0]", "a.service", 1, tp=1)
    text = text.replace("[sglang]\n", '[unit.environment]\nCUDA_VISIBLE_DEVICES = "0"\n\n[sglang]\n')
    with pytest.raises(InventoryError) as err:
        load_host("a", write(tmp_path, a=text))
    assert err.value.message == (
        f"{tmp_path / 'a.toml'}: unit.environment.CUDA_VISIBLE_DEVICES: gpus.indices sets it; "
        "keep one of the two"
    )


@pytest.mark.parametrize(
    ("visible", "gpu_set"), [("4,5", (4, 5)), ("GPU-1f2e,GPU-99aa", None), ("MIG-x", None)]
)
def test_an_adopted_cuda_visible_devices_is_the_services_gpus_when_it_names_numbers(
    tmp_path: Path, visible: str, gpu_set: tuple[int, ...] | None
) -> None:
    text = service_file("count = 2", "a.service", 1, tp=2)
    text = text.replace("[sglang]\n", f'[unit.environment]\nCUDA_VISIBLE_DEVICES = "{visible}"\n\n[sglang]\n')
    assert load_host("a", write(tmp_path, a=text)).gpu_set == gpu_set


# -- the rendered unit ---------------------------------------------------------------------------
def test_the_unit_gets_its_gpus_and_pci_bus_order(tmp_path: Path) -> None:
    host = load_host("b", two_services(tmp_path))
    text = render_unit(host, {}, template_dir())
    assert 'Environment="CUDA_VISIBLE_DEVICES=4,5,6,7"' in text
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in text


def test_a_unit_without_indices_renders_no_gpu_variable(tmp_path: Path) -> None:
    text = render_unit(load_host("ct200-sim", UNITS), {}, template_dir())
    assert "CUDA_VISIBLE_DEVICES" not in text and "CUDA_DEVICE_ORDER" not in text


def test_the_inventorys_own_device_order_is_kept(tmp_path: Path) -> None:
    text = service_file("indices = [1, 0]", "a.service", 1, tp=2)
    text = text.replace("[sglang]\n", '[unit.environment]\nCUDA_DEVICE_ORDER = "FASTEST_FIRST"\n\n[sglang]\n')
    unit = render_unit(load_host("a", write(tmp_path, a=text)), {}, template_dir())
    assert 'Environment="CUDA_VISIBLE_DEVICES=1,0"' in unit  # the inventory's order: rank 0 on GPU 1
    assert 'Environment="CUDA_DEVICE_ORDER=FASTEST_FIRST"' in unit and "PCI_BUS_ID" not in unit


def test_the_adopted_template_renders_the_gpus_too(tmp_path: Path) -> None:
    text = service_file("indices = [2, 3]", "a.service", 1, tp=2)
    text = text.replace('name = "a.service"', 'name = "a.service"\ntemplate = "sglang-adopted.service.j2"')
    unit = render_unit(load_host("a", write(tmp_path, a=text)), {}, template_dir())
    assert 'Environment="CUDA_VISIBLE_DEVICES=2,3"' in unit


# -- services of one host ------------------------------------------------------------------------
def test_disjoint_services_of_one_host_load(tmp_path: Path) -> None:
    units = two_services(tmp_path)
    assert load_service("a", units).unit.name == "sglang-a.service"
    assert [h.unit.name for h in all_hosts(units)] == ["sglang-a.service", "sglang-b.service"]
    assert [h.name for h in group_hosts(units, "pool")] == ["a", "b"]  # a fleet group of services


@pytest.mark.parametrize(
    ("b_gpus", "b_unit", "b_port", "says"),
    [
        ("indices = [3, 4, 5, 6]", "sglang-b.service", 30002, "both use GPU 3 on host 'gpu1'"),
        ("count = 8", "sglang-b.service", 30002, "both use GPUs 0, 1, 2, 3 on host 'gpu1'"),
        ("indices = [4, 5]", "sglang-a.service", 30002, "both are unit sglang-a.service on host 'gpu1'"),
        ("indices = [4, 5]", "sglang-b.service", 30001, "both listen on port 30001 on host 'gpu1'"),
    ],
)
def test_a_clash_between_services_of_one_host_is_one_line_naming_both_files(
    tmp_path: Path, b_gpus: str, b_unit: str, b_port: int, says: str
) -> None:
    units = write(
        tmp_path,
        a=service_file("indices = [0, 1, 2, 3]", "sglang-a.service", 30001, tp=4),
        b=service_file(b_gpus, b_unit, b_port, tp=4),
    )
    for load in (
        lambda: load_service("a", units),
        lambda: load_service("b", units),
        lambda: all_hosts(units),
    ):
        with pytest.raises(InventoryError) as err:
            load()
        line = err.value.message
        assert line == f"{units / 'a.toml'} and {units / 'b.toml'}: {says}", line


def test_one_metrics_file_for_two_services_is_refused(tmp_path: Path) -> None:
    same = '\n[metrics]\npath = "/var/lib/prometheus/node-exporter/sglang.prom"\n'
    units = write(
        tmp_path,
        a=service_file("indices = [0]", "sglang-a.service", 30001, tp=1) + same,
        b=service_file("indices = [1]", "sglang-b.service", 30002, tp=1) + same,
    )
    with pytest.raises(
        InventoryError, match=r"both write metrics to /var/lib/prometheus/node-exporter/sglang"
    ):
        load_service("a", units)


def test_other_hosts_and_unknown_gpu_sets_never_clash(tmp_path: Path) -> None:
    uuids = '[unit.environment]\nCUDA_VISIBLE_DEVICES = "GPU-1f2e"\n\n[sglang]\n'
    units = write(
        tmp_path,
        a=service_file("count = 8", "sglang.service", 30000, target="gpu1"),
        b=service_file("count = 8", "sglang.service", 30000, target="gpu2"),  # another host
        c=service_file("count = 1", "sglang-c.service", 30003, target="gpu2", tp=1).replace(
            "[sglang]\n", uuids
        ),
    )
    assert len(all_hosts(units)) == 3


def test_a_broken_sibling_does_not_block_a_service(tmp_path: Path) -> None:
    units = two_services(tmp_path)
    (units / "c.toml").write_text("[ssh\n")
    assert load_service("a", units).name == "a"
    with pytest.raises(InventoryError, match=r"c\.toml: not valid TOML"):
        all_hosts(units)  # the fleet reads every file


def _main(units: Path, *args: str) -> tuple[int, str]:
    from agent.cli.main import main
    from agent.output import Output

    out = Output(stdout=io.StringIO(), stderr=io.StringIO(), isatty=False, stdin_isatty=False)
    code = main(["--units", str(units), *args], out)
    return code, out.stderr.getvalue()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "args",
    [
        ("apply", "b", "--context", "200k", "--yes"),
        ("apply", "b", "--context", "200k", "--set", "kv-cache-dtype=fp8_e4m3", "--yes"),
        ("rollback", "b", "--yes"),
        ("status", "b"),
        ("backups", "b"),
        ("facts", "b"),
        ("plan", "b", "--context", "200k", "--offline"),
        ("render", "b", "--context", "200k"),
        ("fleet", "apply", "pool", "--context", "200k", "--yes"),
    ],
)
def test_every_command_refuses_overlapping_gpus_before_it_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    units = two_services(tmp_path, b_gpus="indices = [3, 4, 5, 6]")
    from agent.orchestrate import session

    monkeypatch.setattr(session, "open_transport", lambda *a: pytest.fail("connected to the host"))
    code, err = _main(units, *args)
    assert code == ExitCode.USAGE, err
    first = err.splitlines()[0]
    assert first.startswith("deployctl: error: ") and "a.toml and " in first and "both use GPU 3" in first, (
        err
    )


# -- planning on the service's own GPUs ----------------------------------------------------------
SMI = "".join(f"NVIDIA H100 80GB HBM3, {81559 if i < 6 else 46068}, 80000, 9.0, {i}\n" for i in range(8))


def test_nvidia_smi_rows_carry_their_index() -> None:
    rows = model_facts.parse_gpus(SMI)
    assert [r["index"] for r in rows] == list(range(8))
    assert "index" not in model_facts.parse_gpus("NVIDIA H100 80GB HBM3, 81559, 80000, 9.0\n")[0]


def test_a_service_keeps_its_own_gpu_rows(tmp_path: Path) -> None:
    rows: list[Any] = model_facts.parse_gpus(SMI)
    big = load_host(
        "a", write(tmp_path, a=service_file("indices = [0, 1, 2, 3, 4, 5]", "a.service", 1, tp=6))
    )
    small = load_host("b", write(tmp_path, b=service_file("indices = [7, 6]", "b.service", 2, tp=2)))
    assert [r["index"] for r in service_gpus(rows, big)] == [0, 1, 2, 3, 4, 5]
    assert [(r["index"], r["memory_total_mib"]) for r in service_gpus(rows, small)] == [
        (7, 46068),
        (6, 46068),
    ]
    whole = load_host("c", write(tmp_path, c=service_file("count = 8", "c.service", 3)))
    assert service_gpus(rows, whole) == rows
    few = load_host("d", write(tmp_path, d=service_file("count = 16", "d.service", 4)))
    assert service_gpus(rows, few) == rows  # the default 0..count-1: what the host has of it
    unindexed = [{k: v for k, v in r.items() if k != "index"} for r in rows]
    assert service_gpus(unindexed, small) == unindexed  # a facts file written by hand: as it is


def test_an_index_the_host_does_not_have_is_one_line(tmp_path: Path) -> None:
    host = load_host("a", write(tmp_path, a=service_file("indices = [7, 8]", "a.service", 1, tp=2)))
    with pytest.raises(UsageError) as err:
        service_gpus(model_facts.parse_gpus(SMI), host)
    assert (
        err.value.message
        == "a: gpus.indices names GPU 8, but nvidia-smi on the host lists GPUs 0, 1, 2, 3, 4, 5, 6, 7"
    )


def test_the_plan_counts_and_sizes_the_services_gpus_only(tmp_path: Path) -> None:
    """Two GPUs of eight, the smaller cards: the default tensor parallel and the memory are theirs."""
    from tests.pure import facts_fixtures as cfg
    from tests.pure.test_model_facts import UNIT, model_dir

    folder = model_dir(tmp_path, cfg.LLAMA31_8B)
    doc = model_facts.collect(UNIT.format(path=folder).replace(" --tp-size 8", ""), [], [])
    assert doc is not None
    doc["gpus"] = json.loads(json.dumps(model_facts.parse_gpus(SMI)))
    doc["sglang"] = {"version": "0.5.23"}
    units = tmp_path / "units"
    units.mkdir()
    host = load_host("e", write(units, e=service_file("indices = [6, 7]", "e.service", 1)))
    host = host.model_copy(update={"sglang": host.sglang.model_copy(update={"flags": {}}), "draft": None})
    plan = plan_from_host_facts(host, {"model_facts": doc}, None, Target(32_768))
    assert plan is not None
    assert any("gpus (2 x NVIDIA H100 80GB HBM3)" in note for note in plan.notes), plan.notes
    assert plan.pre_gib < 46068 / 1024  # sized on the 45 GiB cards of GPUs 6 and 7, not the 80 GiB ones


# -- one lock per service ------------------------------------------------------------------------
class NoSystemd:
    def __enter__(self) -> NoSystemd:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _request(host: HostConfig, tmp_path: Path) -> Request:
    return replace(
        base_request(host, "rollback"),
        state_dir=str(tmp_path / "state"),
        unit_dir=str(tmp_path / "units"),
        detach=False,
    )


def test_a_change_to_one_service_never_locks_out_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet batch holding both services of a host: the second runs while the first holds its lock,
    and a second change of the same service is still refused."""
    (tmp_path / "inv").mkdir()
    units = two_services(tmp_path / "inv")
    a, b = (_request(load_service(n, units), tmp_path) for n in ("a", "b"))
    monkeypatch.setenv("DEPLOYCTL_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(runner, "running", lambda req: None)
    monkeypatch.setattr(runner, "Systemd", NoSystemd)
    inner: dict[str, int] = {}

    class Nested:
        def __init__(self, req: Request, *args: Any) -> None:
            self.req = req

        def rollback(self) -> Result:
            if self.req.unit == a.unit:  # while a's runner holds a's lock
                inner["b"] = runner.start(b, io.StringIO())
                inner["a again"] = runner.start(a, io.StringIO())
            return Result(Outcome.APPLIED, f"restored {self.req.unit}")

    monkeypatch.setattr(runner, "Transaction", Nested)
    assert runner.start(a, io.StringIO()) == ExitCode.OK
    assert inner == {"b": ExitCode.OK, "a again": ExitCode.LOCKED}


def test_each_service_has_its_own_state_backups_and_metrics(tmp_path: Path) -> None:
    units = two_services(tmp_path)
    a, b = (base_request(load_service(n, units), "status") for n in ("a", "b"))
    assert (a.unit, b.unit) == ("sglang-a.service", "sglang-b.service")
    assert a.metrics_file == "/var/lib/prometheus/node-exporter/deployctl_sglang-a.service.prom"
    assert b.metrics_file == "/var/lib/prometheus/node-exporter/deployctl_sglang-b.service.prom"
    assert (a.port, b.port) == (30001, 30002)


# -- adopting a unit that pins its GPUs ----------------------------------------------------------
def test_adopting_a_unit_that_pins_its_gpus_counts_those_gpus_only(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES stays as written (the unit runs as it ran); the count and the card are its."""
    from agent.adopt import choose_unit, inventory_text
    from agent.inventory import HostConfig as Config
    from tests.pure.test_adopt import HAND, inspected

    text = HAND.replace("[Service]\n", "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=6,7\n", 1)
    text = text.replace("--tp-size 8", "--tp-size 2").replace("'--tp-size=8'", "'--tp-size=2'")
    cards = [("H200", "143771")] * 6 + [("L40S", "46068")] * 2
    rows = [{"index": str(i), "name": name, "total_mib": mib} for i, (name, mib) in enumerate(cards)]
    toml = inventory_text("box-small", "box", True, choose_unit(inspected(tmp_path, text), None), rows)
    host = Config.model_validate({**tomlkit.parse(toml).unwrap(), "name": "box-small"})
    assert host.gpus.count == 2 and host.gpus.name == "L40S" and host.gpus.memory_gib == 45.0
    assert host.unit.environment["CUDA_VISIBLE_DEVICES"] == "6,7" and host.gpu_set == (6, 7)
    unit = render_unit(host, {}, template_dir())
    assert unit.count("CUDA_VISIBLE_DEVICES=6,7") == 1 and unit.count("CUDA_DEVICE_ORDER") == 1  # as written
