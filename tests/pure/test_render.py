"""Rendering the unit: golden files, values checked before rendering, redaction, systemd's own verdict."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.errors import RenderError
from agent.exitcodes import ExitCode
from agent.inventory import HostConfig, load_host
from agent.render import effective_flags, redact, render_unit, secret_values, template_dir, unit_diff
from agent.sglang.flags import FlagInput, normalize, parse_unit
from agent.verify import verify_unit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "units"
GOLDEN = ROOT / "tests" / "golden" / "render"
CASES = sorted(GOLDEN.glob("*.json"))
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def case_inputs(path: Path) -> tuple[HostConfig, dict[str, FlagInput]]:
    """A golden case: a host from units/ with an optional inventory patch, and the flags over it."""
    case = json.loads(path.read_text(encoding="utf-8"))
    data = tomllib.loads((UNITS / f"{case['host']}.toml").read_text(encoding="utf-8"))
    host = HostConfig.model_validate(_merge({**data, "name": case["host"]}, case.get("inventory", {})))
    flags = {k: tuple(v) if isinstance(v, list) else v for k, v in case["flags"].items()}
    return host, flags


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_golden(case: Path, request: pytest.FixtureRequest) -> None:
    host, flags = case_inputs(case)
    text = render_unit(host, flags, template_dir())
    expected = case.with_suffix(".service")
    if request.config.getoption("--update-golden"):
        expected.write_text(text, encoding="utf-8")
    assert text == expected.read_text(encoding="utf-8"), f"run pytest --update-golden and review {expected}"


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_rendered_unit_reads_back_to_its_flags(case: Path) -> None:
    host, flags = case_inputs(case)
    text = render_unit(host, flags, template_dir())
    executable, read_back = parse_unit(text)
    assert executable == host.sglang.executable
    expected = {k: normalize(v) for k, v in effective_flags(host, flags).items()}
    assert read_back == expected
    assert render_unit(host, flags, template_dir()) == text  # deterministic: same input, same bytes


def test_flags_merge_over_the_baseline_in_order() -> None:
    host = load_host("ct200", UNITS)
    flags = effective_flags(
        host, {"context-length": 200000, "trust-remote-code": False, "enable-metrics": True}
    )
    assert list(flags)[:3] == ["model-path", "served-model-name", "tp-size"]
    assert flags["context-length"] == 200000
    assert "trust-remote-code" not in flags
    assert list(flags)[-5:] == [
        "enable-metrics",
        "speculative-algorithm",
        "speculative-draft-model-path",
        "host",
        "port",
    ]


# --- values refused before rendering ---------------------------------------------------------------------


def _with(host: HostConfig, dotted: str, value: Any) -> HostConfig:
    """A copy of host with one nested field replaced, skipping validation as a buggy caller might."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return host.model_copy(update={head: value})
    return host.model_copy(update={head: _with(getattr(host, head), rest, value)})


BAD_FIELDS = [
    ("model.path", "/models/a\nExecStartPre=/bin/rm -rf /"),
    ("model.served_name", "kimi\r"),
    ("draft.path", "/models/d\x00"),
    ("unit.description", "SGLang\x1b[31m"),
    ("unit.user", "sglang\n"),
    ("sglang.host", "0.0.0.0\t"),
    ("sglang.executable", ["/usr/bin/python3", "-m\x85", "sglang.launch_server"]),
    ("unit.environment", {"A": "1\n2"}),
    ("unit.environment", {"A\nB": "1"}),
    ("sglang.flags", {"tool-call-parser": "kimi\x7f"}),
]


@pytest.mark.parametrize(
    ("field", "value"), BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_FIELDS)]
)
def test_control_character_in_any_field_is_refused(field: str, value: Any) -> None:
    host = _with(load_host("ct200", UNITS), field, value)
    with pytest.raises(RenderError, match="control character") as info:
        render_unit(host, {}, template_dir())
    assert info.value.message.startswith(field)
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    "flags",
    [{"context-length": "200000\n"}, {"a\nb": True}, {"cuda-graph-bs": ("1", "2\n")}, {"x": "\u0085"}],
)
def test_control_character_in_a_flag_is_refused(flags: dict[str, FlagInput]) -> None:
    with pytest.raises(RenderError, match=r"^flags\..*control character"):
        render_unit(load_host("ct200", UNITS), flags, template_dir())


def test_the_message_shows_the_character_and_says_why() -> None:
    host = _with(load_host("ct200", UNITS), "model.path", "/m\n")
    with pytest.raises(RenderError) as info:
        render_unit(host, {}, template_dir())
    assert info.value.message == (
        "model.path: contains a control character (\\n); a newline must never reach a unit file"
    )


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("sglang.flags", {"Tp_Size": 8}, "flag name must match"),
        ("unit.environment", {"1X": "1"}, "variable name must match"),
        ("unit.user", "bad user", "not a user name"),
        ("unit.description", "ends in \\", "backslash"),
        ("sglang.executable", ["python3", "-m", "sglang.launch_server"], "absolute path"),
        ("unit.template", "../etc/passwd", "file name"),
    ],
)
def test_other_bad_values_are_refused(field: str, value: Any, words: str) -> None:
    host = _with(load_host("ct200", UNITS), field, value)
    with pytest.raises(RenderError, match=words):
        render_unit(host, {}, template_dir())


def test_bad_flag_names_and_numbers_from_the_command_line() -> None:
    host = load_host("ct200", UNITS)
    for flags in ({"--context-length": 1}, {"": 1}, {"x": float("nan")}):
        with pytest.raises(RenderError):
            render_unit(host, flags, template_dir())


# --- diffs and redaction ---------------------------------------------------------------------------------


def test_unit_diff() -> None:
    assert unit_diff("a\nb\n", "a\nb\n", "sglang.service") == ""
    diff = unit_diff("a\nb\n", "a\nc", "sglang.service").splitlines()
    assert diff[:2] == ["--- a/sglang.service", "+++ b/sglang.service"]
    assert "-b" in diff
    assert "+c" in diff


@pytest.mark.parametrize(
    ("line", "secrets", "shown"),
    [
        ('Environment="HF_TOKEN=hf_abc"', (), 'Environment="HF_TOKEN=***"'),
        ("Environment=API_KEY=abc OTHER=1", (), "Environment=API_KEY=*** OTHER=1"),
        ("+Environment='DB_PASSWORD=x y'", (), "+Environment='DB_PASSWORD=***'"),
        ('-Environment="MY_VAR=v" "CUDA_DEVICE_ORDER=PCI_BUS_ID"', ("MY_VAR",), None),
        ('Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"', (), 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"'),
        ('+    --api-key "s e c r e t" \\', (), "+    --api-key *** \\"),
        ("    --admin-api-key=abc \\", (), "    --admin-api-key=*** \\"),
        ("    --max-total-tokens 4096 \\", (), "    --max-total-tokens 4096 \\"),
        ("    --tokenizer-path /m \\", (), "    --tokenizer-path /m \\"),
    ],
)
def test_redact(line: str, secrets: tuple[str, ...], shown: str | None) -> None:
    if shown is None:
        shown = '-Environment="MY_VAR=***" "CUDA_DEVICE_ORDER=PCI_BUS_ID"'
    assert redact(line, secrets) == shown


def test_redacted_diff_of_a_rendered_unit_keeps_no_secret() -> None:
    host = _with(load_host("ct200", UNITS), "unit.environment", {"HF_TOKEN": "hf_live_secret"})
    new = render_unit(host, {"api-key": "sk-live-secret"}, template_dir())
    old = render_unit(load_host("ct200", UNITS), {}, template_dir())
    shown = redact(unit_diff(old, new, "sglang.service"), host.unit.secret_environment)
    assert "hf_live_secret" not in shown and "sk-live-secret" not in shown
    # Not redacted but absent: the unit names root-only files, the values travel beside it.
    assert "hf_live_secret" not in new and "sk-live-secret" not in new
    assert "+EnvironmentFile=/etc/deployctl/secrets/sglang.service.env" in shown
    assert "+LoadCredential=sglang-secrets.yaml:/etc/deployctl/secrets/sglang.service.flags.yaml" in shown
    assert "--config /run/credentials/sglang.service/sglang-secrets.yaml" in new
    assert secret_values(host, {"api-key": "sk-live-secret"}) == (
        {"HF_TOKEN": "hf_live_secret"},
        {"api-key": "sk-live-secret"},
    )


def test_a_secret_flag_and_a_config_of_ones_own_are_refused_together() -> None:
    with pytest.raises(RenderError, match=r"flags\.config"):
        render_unit(load_host("ct200", UNITS), {"api-key": "k", "config": "/etc/x.yaml"}, template_dir())


# --- systemd-analyze -------------------------------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_systemd_analyze_accepts_the_rendered_units(case: Path) -> None:
    host, flags = case_inputs(case)
    assert verify_unit(render_unit(host, flags, template_dir()), host.unit.name) is None


@needs_analyze
def test_systemd_analyze_complaints_come_back() -> None:
    text = render_unit(load_host("ct200", UNITS), {}, template_dir())
    complaint = verify_unit(text.replace("KillMode=mixed", "KillMode=sometimes"), "sglang.service")
    assert complaint is not None
    assert "kill mode" in complaint
    assert "sglang.service:" in complaint
    assert "deployctl-verify-" not in complaint  # no temporary path in the message


def test_verify_wants_a_real_unit_file_name() -> None:
    with pytest.raises(ValueError, match="unit file name"):
        verify_unit("[Service]\nExecStart=/bin/true\n", "sglang")


def test_a_rendering_identical_to_the_installed_unit_is_not_verified_again(monkeypatch) -> None:
    import agent.verify

    host = load_host("ct200", UNITS)
    calls: list[str] = []
    monkeypatch.setattr(agent.verify, "verify_unit", lambda text, name: calls.append(name))
    installed = agent.verify.render_checked(host, {})
    assert calls == ["sglang.service"]  # a new rendering is verified
    assert agent.verify.render_checked(host, {}, installed=installed) == installed
    assert calls == ["sglang.service"]  # the same text as installed: systemd already runs it
    agent.verify.render_checked(host, {"mem-fraction-static": 0.93}, installed=installed)
    assert calls == ["sglang.service", "sglang.service"]


def test_a_list_flags_text_is_written_as_its_words() -> None:
    # --cuda-graph-bs-decode takes nargs "+" ints: one quoted word "1 2 4" would reach argparse as one value
    host = load_host("ct200", UNITS)
    text = render_unit(host, {"cuda-graph-bs-decode": "1 2 4 8 1024"}, template_dir())
    assert "--cuda-graph-bs-decode 1 2 4 8 1024" in text
    assert parse_unit(text)[1]["cuda-graph-bs-decode"] == ("1", "2", "4", "8", "1024")
    assert effective_flags(host, {"served-model-name": "a b"})["served-model-name"] == "a b"  # one value
