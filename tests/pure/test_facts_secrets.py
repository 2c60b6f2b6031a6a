"""Nothing secret leaves the host through facts or backups: the host redacts before it sends."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.apply import installed_sha256
from agent.host import model_facts, verbs
from agent.host.change.decide import Gate
from agent.host.events import EventLog
from agent.host.watch.start import WatchedStart, watch_start
from agent.protocol.events import Event
from agent.protocol.requests import Request, Timeouts
from agent.sglang.redact import redact_log_line
from tests.pure import facts_fixtures as cfg
from tests.pure.test_model_facts import model_dir
from tests.pure.test_plan_cmd import START_LOG

SECRETS = ("sk-live-111", "env-222", "tok-333", "cred-444", "admin-555", "pw-666", "inline-777")
UNIT = f"""[Unit]
Description=SGLang
[Service]
Environment=MY_API_KEY={SECRETS[1]} PUBLIC_MODE=fast "HF_TOKEN={SECRETS[2]}"
SetCredential=hub:{SECRETS[3]}
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path {{path}} --tp-size 8 \\
  --api-key {SECRETS[0]} --admin-api-key={SECRETS[4]} --ssl-keyfile-password {SECRETS[5]}
"""
# SGLang 0.5.23 logs the resolved arguments as a dict (0.5.16 and before: ServerArgs(api_key='...')).
SERVER_ARGS = (
    f"[2026-12-01 09:59:58] server_args={{'model_path': '/m', 'api_key': '{SECRETS[0]}', "
    f"'admin_api_key': \"{SECRETS[4]}'s\", 'mem_fraction_static': 0.85, 'ssl_keyfile_password': None, "
    "'max_total_tokens': None, 'tokenizer_path': '/m'}"
)


def test_server_args_lines_lose_their_secret_values_in_both_spellings() -> None:
    line = redact_log_line(SERVER_ARGS)
    assert SECRETS[0] not in line and SECRETS[4] not in line
    assert "'api_key': ***" in line and "'admin_api_key': ***" in line
    assert "'ssl_keyfile_password': None" in line and "'mem_fraction_static': 0.85" in line  # no key: said so
    assert "'max_total_tokens': None" in line and "'tokenizer_path': '/m'" in line  # not secret names
    old = f"server_args=ServerArgs(model_path='/m', api_key='{SECRETS[0]}', hf_token={SECRETS[2]}, tp_size=8)"
    shown = "server_args=ServerArgs(model_path='/m', api_key=***, hf_token=***, tp_size=8)"
    assert redact_log_line(old) == shown
    assert redact_log_line(f"argv: --api-key {SECRETS[0]} --tp 8") == "argv: --api-key *** --tp 8"
    plain = "[2026-12-01 10:09:00 TP0] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB"
    assert redact_log_line(plain) == plain


def test_the_facts_document_carries_no_secret(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, cfg.KIMI_K26)
    lines = [SERVER_ARGS, *START_LOG.splitlines()]
    doc = model_facts.collect(UNIT.format(path=folder), lines, [])
    assert doc is not None
    sent = json.dumps(doc)
    assert not [s for s in SECRETS if s in sent]
    assert doc["env"] == {"PUBLIC_MODE": "fast"}  # secret-looking names by the one rule, none listed
    assert "api_key': ***" in doc["last_start"] and doc["flags"]["tp-size"] == "8"
    assert not {"api-key", "admin-api-key", "ssl-keyfile-password"} & set(doc["flags"])


class FakeJournal:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def last_invocation_lines(self, unit: str, limit: int) -> list[str]:
        return self.lines[-limit:]


@pytest.fixture
def host_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Request]:
    """A facts request against a unit folder in tmp_path; systemd and the journal faked."""
    folder = model_dir(tmp_path, cfg.KIMI_K26)
    units = tmp_path / "units"
    units.mkdir()
    (units / "sglang.service").write_text(UNIT.format(path=folder))
    monkeypatch.setattr(verbs, "Journal", lambda: FakeJournal([SERVER_ARGS, *START_LOG.splitlines()]))
    monkeypatch.setattr(verbs, "_state", lambda unit: None)
    monkeypatch.setattr(verbs.runner, "running", lambda req: None)
    yield Request("facts", unit_dir=str(units), state_dir=str(tmp_path / "state"))


def test_the_facts_verb_sends_no_secret_and_the_real_units_sha(host_dirs: Request) -> None:
    answer = verbs.facts(host_dirs)
    sent = json.dumps(answer, default=str)
    assert not [s for s in SECRETS if s in sent]
    text = (Path(host_dirs.unit_dir) / "sglang.service").read_text()
    assert answer["unit_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert installed_sha256(answer) == answer["unit_sha256"]  # what the laptop's apply expects to find
    assert "SetCredential=hub:***" in answer["unit_text"] and "--api-key ***" in answer["unit_text"]
    assert answer["flags"]["api-key"] == "***" and answer["flags"]["tp-size"] == "8"


def test_backups_show_a_changed_secret_flag_without_its_values(host_dirs: Request) -> None:
    units = Path(host_dirs.unit_dir)
    text = (units / "sglang.service").read_text()
    (units / "sglang.service.bak.20261201T000000Z").write_text(text.replace(SECRETS[0], "sk-old-888"))
    sent = json.dumps(verbs.backups(host_dirs))
    assert not [s for s in (*SECRETS, "sk-old-888") if s in sent]
    assert ["api-key", "***", "***"] in verbs.backups(host_dirs)["backups"][0]["changes"]


def test_the_laptop_expects_the_sha_the_host_sent_not_one_of_the_redacted_text() -> None:
    assert installed_sha256({"unit_text": "x=***", "unit_sha256": "a" * 64}) == "a" * 64
    assert installed_sha256({"unit_text": None, "unit_sha256": None}) == "absent"
    assert installed_sha256({"unit_text": "t"}) == hashlib.sha256(b"t").hexdigest()  # a facts file by hand


def test_a_watched_start_emits_no_secret_from_its_log_lines() -> None:
    lines = [SERVER_ARGS, *START_LOG.splitlines()]
    journal = SimpleNamespace(follow=lambda *a: iter([SimpleNamespace(message=m) for m in lines]))
    state = SimpleNamespace(active_state="activating", sub_state="start", n_restarts=0)
    systemd = SimpleNamespace(unit_state=lambda unit: state)
    gate = Gate(100, None, 0.02, Timeouts())
    start = WatchedStart("sglang.service", journal, systemd, gate, None, "inv", 0)  # type: ignore[arg-type]
    seen: list[Event] = []
    log = EventLog("20261203T100000Z-abcdef", None)
    log.listeners.append(seen.append)
    ticks = itertools.count(0.0, 2.0)  # every line a progress event: the server_args one too
    result = watch_start(start, log, clock=lambda: next(ticks))
    sent = json.dumps([e.to_json() for e in seen]) + json.dumps(result.summary)
    assert "server_args=" in sent and not [s for s in SECRETS if s in sent]


def test_a_tokenizer_switch_is_not_a_secret_but_a_tokenizer_token_is() -> None:
    from agent.sglang.redact import is_secret_env

    assert not is_secret_env("TOKENIZERS_PARALLELISM")
    assert all(is_secret_env(n) for n in ("HF_TOKEN", "TOKENIZER_HUB_TOKEN", "MY_API_KEY", "DB_PASSWORD"))
