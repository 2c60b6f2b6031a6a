"""render of a [pd] file refuses what plan refuses (docs/pd.md: before plan plans and before render renders),
with the same line, and says the fraction plan would choose, which its units do not carry."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.output import Output
from tests.pure.test_pd import EXAMPLE, ROOT

REFUSED = [
    ("max-running-requests = 8", "max-running-requests = 64"),
    ("max-running-requests = 8", "max-running-requests = 4000"),
    ("tp-size = 1, max-running-requests = 8", "tp-size = 1, page-size = 16, max-running-requests = 8"),
    ('transfer_backend = "mooncake"', 'transfer_backend = "fake"'),
]


def _run(units: Path, *argv: str) -> tuple[int, str, str]:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main([*argv, "--context", "32k", "--units", str(units)], out)
    assert isinstance(out.stdout, io.StringIO) and isinstance(out.stderr, io.StringIO)
    return code, out.stdout.getvalue(), out.stderr.getvalue()


def _error(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("deployctl: error: "))


@pytest.mark.parametrize(("old", "new"), REFUSED)
def test_render_refuses_with_plans_line(tmp_path: Path, old: str, new: str) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert old in text
    (tmp_path / "pd.toml").write_text(text.replace(old, new, 1), encoding="utf-8")
    plan_code, _, plan_err = _run(tmp_path, "plan", "pd", "--offline")
    code, out, err = _run(tmp_path, "render", "pd")
    assert plan_code == code == 2 and out == ""
    assert _error(err) == _error(plan_err)


def test_render_notes_each_roles_planned_fraction_unless_given() -> None:
    _, plan_out, _ = _run(ROOT / "units", "plan", "pd-1p1d", "--offline")
    chosen = [w.rstrip(":") for line in plan_out.splitlines() for w in line.split() if w.startswith("0.")]
    code, out, err = _run(ROOT / "units", "render", "pd-1p1d")
    assert code == 0 and "--mem-fraction-static" not in out
    notes = [line for line in err.splitlines() if "mem-fraction-static" in line]
    assert [n.split(": ")[2] for n in notes] == ["prefill[0]", "decode[0]"]
    assert all(f in err for f in chosen[:2]), (chosen, err)
    code, out, err = _run(ROOT / "units", "render", "pd-1p1d", "--mem-fraction-static", "0.8")
    assert code == 0 and "mem-fraction-static" not in err and out.count("--mem-fraction-static 0.8") == 2


@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--set", "page-size=16"], ["--set page-size"]),
        (["--max-running-requests", "4"], ["--max-running-requests"]),
        (["--set", "max-running-requests=4"], ["--set max-running-requests"]),
        (["--set", "tp-size=2", "--set", "page-size=16"], ["--set tp-size", "--set page-size"]),
    ],
)
def test_a_refused_option_is_named_as_typed(command: str, argv: list[str], named: list[str]) -> None:
    offline = ["--offline"] if command == "plan" else []
    code, out, err = _run(ROOT / "units", command, "pd-1p1d", *offline, *argv)
    head = _error(err).removeprefix("deployctl: error: ").split(": not for")[0]
    assert code == 2 and out == "" and head == ", ".join(named), err


@pytest.mark.parametrize("key", ["port", "host"])
def test_the_routers_own_key_in_its_flags_points_at_it(tmp_path: Path, key: str) -> None:
    old = 'flags = { policy = "cache_aware" }'
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        old, f'flags = {{ policy = "cache_aware", {key} = 1 }}'
    )
    (tmp_path / "pd.toml").write_text(text, encoding="utf-8")
    code, _, err = _run(tmp_path, "plan", "pd", "--offline")
    assert code == 2 and f"[pd.router] {key} sets it" in err, err


@pytest.mark.parametrize("yes", [[], ["--yes"]])
def test_rollback_to_of_a_pd_file_is_refused_before_asking_for_yes(yes: list[str]) -> None:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    code = main(["rollback", "pd-1p1d", "--to", "x", *yes, "--units", str(ROOT / "units")], out)
    assert isinstance(out.stderr, io.StringIO)
    assert code == 2 and _error(out.stderr.getvalue()).startswith("deployctl: error: --to: "), out.stderr


@pytest.mark.parametrize(
    ("name", "label"),
    [("pd.prefill0", "prefill[0]"), ("pd.decode12", "decode[12]"), ("a.b.decode1", "decode[1]"),
     ("pd.router", "router")],
)  # fmt: skip
def test_a_group_member_is_named_as_plan_names_it(name: str, label: str) -> None:
    from agent.group.pdapply import shown
    from agent.group.run import Node
    from agent.inventory import load_host
    from agent.pd.units import pd_units

    unit = pd_units(load_host("pd-1p1d", ROOT / "units"))[0]
    node = Node(0, unit.host.model_copy(update={"name": name}), None, None)  # type: ignore[arg-type]
    assert shown(node) == label
