"""adopt's pieces without a host: reading a hand-written unit, writing the inventory, the refusals."""

from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.adopt import cache_notes, choose_unit, inventory_text, split_command, stop_notes
from agent.cli.main import main
from agent.errors import RenderError, UsageError
from agent.exitcodes import ExitCode
from agent.host.adopt import _describe, kept_secret_env
from agent.host.secrets import env_file_text
from agent.inventory import HostConfig
from agent.output import Output
from agent.render import render_unit, template_dir
from agent.sglang.flags import parse_flag_words, split_words, unit_lines
from agent.sglang.unitfile import AdoptError, command_words, read_unit, redact_secret_flags, runs_sglang

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOKEN = "hf_s3cr3t'\"$x"
QUOTED_TOKEN = TOKEN.replace('"', '\\"')
# Hand-written: odd but valid quoting, a continuation with a comment inside, an inline token, specifier
# and dollar escapes, `--flag=value`, directives the template does not model, no [Install] WantedBy order.
HAND = f"""# written by hand on ct200
[Unit]
Description=SGLang (hand written) 100%%
After=network-online.target nvidia-persistenced.service
Wants=network-online.target

[Service]
User=sglang
Group=sglang
Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID" 'NOTE=two  spaces' HF_TOKEN="{QUOTED_TOKEN}"
Environment=SGLANG_LOG_MS=1
ExecStartPre=/bin/sh -c 'nvidia-smi -pm 1 || true'
ExecStart=/opt/sglang/.venv/bin/python -m sglang.launch_server \\
    --model-path /models/Kimi-K2.6 --served-model-name "kimi k2.6" \\
# a comment inside the continued line
    '--tool-call-parser=kimi_k2' --tp-size 8 --context-length 32768 \\
    --mem-fraction-static 0.85 --chat-template "/etc/sglang/t 100%%.jinja" --trust-remote-code \\
    --host 0.0.0.0 --port 30000 --tokenizer-path a$$b
LimitNOFILE=1048576
Nice=-5
CPUAffinity=0-31
Restart=always
TimeoutStartSec=1h

[Install]
WantedBy=multi-user.target
"""


def dbus_argv(text: str) -> tuple[str, tuple[str, ...]]:
    """What systemd reports for ExecStart=: unquoted, %% expanded, $ left for exec time."""
    values = [v for s, k, v in unit_lines(text) if (s, k) == ("Service", "ExecStart")]
    argv = split_words(values[0], dollars=False)
    return argv[0], tuple(argv)


def inspected(tmp_path: Path, text: str = HAND, drop_ins: tuple[str, ...] = ()) -> dict[str, Any]:
    unit = tmp_path / "sglang.service"
    unit.write_text(text)
    path, argv = dbus_argv(text)
    info = _describe("sglang.service", str(unit), drop_ins, [(path, argv)])
    return {"candidates": ["sglang.service"], "units": {"sglang.service": info}}


def adopted(tmp_path: Path, text: str = HAND) -> HostConfig:
    unit = choose_unit(inspected(tmp_path, text), None)
    toml = inventory_text("ct200", "ct200", True, unit, [{"name": "RTX", "total_mib": "97887"}])
    return HostConfig.model_validate({**tomllib.loads(toml), "name": "ct200"})


def test_reading_a_hand_written_unit_keeps_secret_values_out() -> None:
    hand = read_unit(HAND)
    assert hand.user == "sglang" and hand.description == "SGLang (hand written) 100%"
    assert hand.environment == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NOTE": "two  spaces",
        "SGLANG_LOG_MS": "1",
    }
    assert hand.secret_environment == ["HF_TOKEN"]
    assert TOKEN not in repr(hand.environment)
    assert [d.key for d in hand.other] == [
        *("After", "Wants", "Group", "ExecStartPre", "LimitNOFILE", "Nice", "CPUAffinity"),
        *("Restart", "TimeoutStartSec", "WantedBy"),
    ]


def test_the_host_answer_holds_no_secret_value(tmp_path: Path) -> None:
    answer = repr(inspected(tmp_path, HAND.replace("--tokenizer-path a$$b", "--api-key sk-live-123")))
    assert TOKEN not in answer and "hf_s3cr3t" not in answer and "sk-live-123" not in answer
    unit = choose_unit(
        inspected(tmp_path, HAND.replace("--tokenizer-path a$$b", "--api-key sk-live-123")), None
    )
    assert unit.secret_flags == ["api-key"]
    with pytest.raises(UsageError, match="secret flags"):
        inventory_text("h", "h", False, unit)


def test_adopted_inventory_renders_a_unit_systemd_reads_the_same(tmp_path: Path) -> None:
    host = adopted(tmp_path)
    text = render_unit(host, {}, template_dir())
    old, new = read_unit(HAND), read_unit(text)
    # The same command, word for word once systemd has unquoted it, and the same flags in the same order
    # (`--tool-call-parser=kimi_k2` is written `--tool-call-parser kimi_k2`: the same to SGLang's argparse).
    old_argv, new_argv = dbus_argv(HAND)[1], dbus_argv(text)[1]
    assert old_argv[:3] == new_argv[:3]
    assert list(parse_flag_words(old_argv[3:]).items()) == list(parse_flag_words(new_argv[3:]).items())
    assert new.environment == old.environment and new.user == old.user
    assert new.description == old.description
    # everything as written, plus the stop that lets SGLang drain (its KillMode was the default)
    assert [(d.section, d.line) for d in new.other if d.key != "EnvironmentFile"] == [
        (d.section, d.line) for d in old.other if d.section != "Install"
    ] + [("Service", "TimeoutStopSec=1020"), ("Service", "KillMode=mixed")] + [
        (d.section, d.line) for d in old.other if d.section == "Install"
    ]
    assert "EnvironmentFile=/etc/deployctl/secrets/sglang.service.env" in text
    assert TOKEN not in text and "hf_s3cr3t" not in text
    assert host.unit.secret_environment_on_host == ["HF_TOKEN"]


def test_the_inventory_is_commented_and_keeps_the_entrypoint(tmp_path: Path) -> None:
    unit = choose_unit(inspected(tmp_path), None)
    toml = inventory_text("ct200", "ct200", True, unit)
    assert "# ct200: adopted from the hand-written" in toml and "CHECK:" in toml
    assert tomllib.loads(toml)["sglang"]["executable"] == [
        "/opt/sglang/.venv/bin/python",
        "-m",
        "sglang.launch_server",
    ]
    serve = HAND.replace(
        "/opt/sglang/.venv/bin/python -m sglang.launch_server", "/opt/sglang/.venv/bin/sglang serve"
    )
    host = adopted(tmp_path, serve)
    assert host.sglang.executable == ["/opt/sglang/.venv/bin/sglang", "serve"]
    assert dbus_argv(render_unit(host, {}, template_dir()))[1][:2] == (
        "/opt/sglang/.venv/bin/sglang",
        "serve",
    )


def test_numbers_keep_their_spelling(tmp_path: Path) -> None:
    text = HAND.replace(
        "--mem-fraction-static 0.85", "--mem-fraction-static 0.850 --schedule-conservativeness 1e0"
    )
    host = adopted(tmp_path, text)
    assert host.sglang.flags["mem-fraction-static"] == "0.850" and host.sglang.flags["tp-size"] == 8
    words = dbus_argv(render_unit(host, {}, template_dir()))[1]
    assert "0.850" in words and "1e0" in words


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], True),
        (["/opt/v/bin/sglang", "serve", "--model-path", "/m"], True),
        (["sglang", "serve"], True),
        (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], False),
        (["/opt/v/bin/sglang", "version"], False),
    ],
)
def test_which_commands_run_sglang(argv: list[str], expected: bool) -> None:
    assert runs_sglang(argv) is expected


def test_variables_in_the_command_are_refused_and_double_dollars_are_one() -> None:
    assert command_words(["a$$b", "$$"]) == ["a$b", "$"]
    for word in ("$HOME", "${HOME}", "x$$$Y"):
        with pytest.raises(AdoptError, match="environment variable"):
            command_words([word])


def test_secret_flag_values_are_hidden_in_both_spellings() -> None:
    shown, names = redact_secret_flags(["x", "--api-key", "K1", "--admin-api-key=K2", "--ssl-keyfile", "/k"])
    assert shown == ["x", "--api-key", "***", "--admin-api-key=***", "--ssl-keyfile", "/k"]
    assert names == ["api-key", "admin-api-key"]


def test_no_sglang_unit_or_several_are_refused() -> None:
    with pytest.raises(UsageError, match="no unit on the host runs SGLang"):
        choose_unit({"candidates": [], "units": {}}, None)
    with pytest.raises(UsageError, match=r"several units run SGLang: a\.service, b\.service") as exc:
        choose_unit({"candidates": ["a.service", "b.service"], "units": {}}, None)
    assert exc.value.hint == "choose one with --unit NAME"
    with pytest.raises(UsageError, match=r"--unit c\.service: no such loaded unit"):
        choose_unit({"candidates": ["a.service"], "units": {}}, "c.service")


def test_a_drop_in_that_sets_exec_start_is_refused(tmp_path: Path) -> None:
    drop = tmp_path / "override.conf"
    drop.write_text(
        "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m\n"
    )
    unit = choose_unit(inspected(tmp_path, drop_ins=(str(drop),)), None)
    with pytest.raises(UsageError, match=r"override\.conf sets ExecStart="):
        inventory_text("h", "h", False, unit)


def test_a_drop_in_is_listed_with_its_secrets_hidden(tmp_path: Path) -> None:
    drop = tmp_path / "env.conf"
    drop.write_text("[Service]\nEnvironment=API_TOKEN=abc123 MODE=fast\nNice=3\n")
    unit = choose_unit(inspected(tmp_path, drop_ins=(str(drop),)), None)
    toml = inventory_text("h", "h", False, unit)
    assert "abc123" not in toml and "API_TOKEN=***" in toml and "Nice=3" in toml
    assert "Nice=3" not in tomllib.loads(toml)["unit"]["verbatim"]["Service"]  # it stays in the drop-in


def test_kept_secrets_come_from_the_file_first_then_the_hand_written_unit() -> None:
    assert kept_secret_env(("HF_TOKEN",), None, HAND) == {"HF_TOKEN": TOKEN}
    written = env_file_text({"HF_TOKEN": 'from-file\\"$`'})
    assert kept_secret_env(("HF_TOKEN",), written, HAND) == {"HF_TOKEN": 'from-file\\"$`'}
    assert kept_secret_env(("OTHER_KEY",), written, HAND) == {}


def test_split_command_puts_the_resolved_path_first(tmp_path: Path) -> None:
    unit = choose_unit(inspected(tmp_path), None)
    executable, flags = split_command(unit)
    assert executable[1:] == ["-m", "sglang.launch_server"] and flags["served-model-name"] == "kimi k2.6"
    assert flags["chat-template"] == "/etc/sglang/t 100%.jinja" and flags["tokenizer-path"] == "a$b"


def test_an_existing_inventory_is_not_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "ct200.toml").write_text("# mine\n")
    err = io.StringIO()
    code = main(["adopt", "ct200", "--ssh", "ct200", "--units", str(tmp_path)], Output(io.StringIO(), err))
    assert code == ExitCode.USAGE
    assert "ct200.toml exists" in err.getvalue() and "--force" in err.getvalue()
    assert (tmp_path / "ct200.toml").read_text() == "# mine\n"


def test_odd_values_survive_the_toml_and_the_render(tmp_path: Path) -> None:
    odd = 'q"uote back\\slash é $HOME %n'
    text = HAND.replace(
        "Environment=SGLANG_LOG_MS=1",
        "Environment='ODD=" + odd.replace("\\", "\\\\").replace("%", "%%") + "'",
    )
    assert read_unit(text).environment["ODD"] == odd
    host = adopted(tmp_path, text)
    assert host.unit.environment["ODD"] == odd
    assert read_unit(render_unit(host, {}, template_dir())).environment["ODD"] == odd


def test_verbatim_lines_need_the_adopted_template_and_must_be_directives(tmp_path: Path) -> None:
    host = adopted(tmp_path)
    for unit, message in (
        ({"template": "sglang.service.j2"}, "only templates/sglang-adopted"),
        ({"verbatim": {"Service": ["not a directive"]}}, "is not a Key=value directive"),
        ({"verbatim": {"Service": ["Nice=5\\"]}}, "must not end with a backslash"),
    ):
        bad = host.model_copy(update={"unit": host.unit.model_copy(update=unit)})
        with pytest.raises(RenderError, match=message):
            render_unit(bad, {}, template_dir())


def test_an_inline_credential_never_leaves_the_host_nor_reaches_the_inventory(tmp_path: Path) -> None:
    text = HAND.replace("LimitNOFILE=", "SetCredential=hub:cred-s3cr3t\nKeyringMode=private\nLimitNOFILE=")
    answer = inspected(tmp_path, text)
    assert "cred-s3cr3t" not in repr(answer)
    unit = choose_unit(answer, None)
    assert unit.secret_directives == ["SetCredential"]  # KeyringMode= only looks like a key
    with pytest.raises(UsageError, match="SetCredential= holds a secret inline"):
        inventory_text("h", "h", False, unit)
    # In a drop-in it stays on the host as it is: listed with its data hidden, and adopt goes on.
    drop = tmp_path / "cred.conf"
    drop.write_text("[Service]\nSetCredential=hub:cred-s3cr3t\nExecStartPre=/bin/x --token tok-s3cr3t\n")
    unit = choose_unit(inspected(tmp_path, drop_ins=(str(drop),)), None)
    toml = inventory_text("h", "h", False, unit)
    assert "cred-s3cr3t" not in toml and "tok-s3cr3t" not in toml and "SetCredential=hub:***" in toml


def test_kept_secrets_take_the_last_assignment_as_systemd_does() -> None:
    twice = HAND.replace("Environment=SGLANG_LOG_MS=1", "Environment=SGLANG_LOG_MS=1 HF_TOKEN=fresh")
    assert kept_secret_env(("HF_TOKEN",), None, twice) == {"HF_TOKEN": "fresh"}
    cleared = HAND.replace("Environment=SGLANG_LOG_MS=1", "Environment=\nEnvironment=SGLANG_LOG_MS=1")
    assert kept_secret_env(("HF_TOKEN",), None, cleared) == {}  # an empty Environment= resets the list
    written = env_file_text({"HF_TOKEN": "from-file"})  # EnvironmentFile= overrides Environment=
    assert kept_secret_env(("HF_TOKEN",), written, twice) == {"HF_TOKEN": "from-file"}


def test_adopting_a_control_group_unit_says_what_a_stop_does_to_requests(tmp_path: Path) -> None:
    unit = choose_unit(inspected(tmp_path), None)
    notes = stop_notes(unit, 1020)
    assert (
        "KillMode=control-group (systemd default)" in notes[0] and "cuts the requests in flight" in notes[0]
    )
    assert "the first apply renders KillMode=mixed and TimeoutStopSec=1020 (was 90s, the default)" in notes[1]


def test_a_hand_written_stop_is_replaced_by_the_drain_s(tmp_path: Path) -> None:
    text = HAND.replace("Restart=always", "Restart=always\nKillMode=control-group\nTimeoutStopSec=20")
    unit = choose_unit(inspected(tmp_path, text), None)
    assert "KillMode=control-group: SIGTERM" in stop_notes(unit, 1020)[0]
    host = adopted(tmp_path, text)
    assert not any(v.startswith(("KillMode", "TimeoutStop")) for v in host.unit.verbatim["Service"])
    rendered = [(s, k, v) for s, k, v in unit_lines(render_unit(host, {}, template_dir())) if s == "Service"]
    assert [v for _, k, v in rendered if k in ("KillMode", "TimeoutStopSec")] == ["1020", "mixed"]
    mixed = HAND.replace("Restart=always", "Restart=always\nKillMode=mixed\nTimeoutStopSec=1020")
    assert stop_notes(choose_unit(inspected(tmp_path, mixed), None), 1020) == []


def test_adopt_keeps_the_hand_written_cache_settings(tmp_path: Path) -> None:
    text = HAND.replace(
        "Environment=SGLANG_LOG_MS=1",
        "Environment=SGLANG_LOG_MS=1 SGLANG_CACHE_DIR=/var/cache/sgl\nCacheDirectory=sgl",
    )
    host = adopted(tmp_path, text)
    lines = unit_lines(render_unit(host, {}, template_dir()))
    assert [v for s, k, v in lines if k == "CacheDirectory"] == ["sgl"]
    assert host.unit.environment["SGLANG_CACHE_DIR"] == "/var/cache/sgl"
    assert not any("SGLANG_JIT_CACHE_DIR" in v for s, k, v in lines)
    assert cache_notes(choose_unit(inspected(tmp_path, text), None)) == []


def test_adopt_warns_when_caches_would_not_survive(tmp_path: Path) -> None:
    private = HAND.replace(
        "Environment=SGLANG_LOG_MS=1", "Environment=SGLANG_CACHE_DIR=/tmp/sglang\nPrivateTmp=yes"
    )
    (note,) = cache_notes(choose_unit(inspected(tmp_path, private), None))
    assert "/tmp/sglang (SGLANG_CACHE_DIR), in a private /tmp (PrivateTmp=yes)" in note
    unit = choose_unit(inspected(tmp_path), None)
    homeless = replace(unit, home={"path": "/nonexistent", "writable": False})
    (note,) = cache_notes(homeless)
    assert "/nonexistent/.cache/sglang (SGLang's default), which sglang cannot keep" in note
    protected = HAND.replace("Nice=-5", "Nice=-5\nProtectHome=read-only")
    (note,) = cache_notes(
        replace(choose_unit(inspected(tmp_path, protected), None), home={"path": "/home/s", "writable": True})
    )
    assert "(ProtectHome=read-only)" in note
    assert cache_notes(replace(unit, home={"path": "/home/sglang", "writable": True})) == []
