"""Hostile input against a real host: the unit, its backups and the agent's state stay exactly as they were.

Bad values through the real CLI, and hand-made requests straight to the host agent over SSH (the wire
is an edge too): each is refused with exit 2 and one line, and nothing is written. A normal apply
writes only inside the unit directory and the agent's state directory; backups keep the unit's mode
and owner; no secret of the unit reaches deployctl's output, the events or the journal.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.exitcodes import ExitCode
from agent.protocol.requests import Request
from agent.remote import bundle
from tests import faultkit as fk
from tests.integration.conftest import DEPLOYCTL, cli, variant, wait_pool
from tests.pure import facts_fixtures as cfg
from tests.simhost import SimHost

pytestmark = pytest.mark.integration

UNIT = "/etc/systemd/system/sglang.service"
STATE = "/var/lib/deployctl"


def host_state(sim: SimHost) -> dict[str, Any]:
    """What hostile input must not change: the unit's content, its backups, the agent's transactions."""
    txn = sim.host.root / STATE.lstrip("/") / "txn"
    return {
        "unit_sha256": hashlib.sha256(sim.host.read(UNIT)).hexdigest(),
        "backups": sim.backups(),
        "transactions": sorted(p.name for p in txn.iterdir()) if txn.is_dir() else [],
        "pending": sorted(p.name for p in (sim.host.root / STATE.lstrip("/")).rglob("pending.json")),
    }


def upper_files(sim: SimHost) -> dict[str, tuple[int, int, int]]:
    """Every file the host has written since it was created (its overlay's upper folder)."""
    upper = sim.host.dir / "upper"
    return {
        str(p.relative_to(upper)): (st.st_size, st.st_mtime_ns, st.st_mode)
        for p in upper.rglob("*")
        if not p.is_dir() and (st := p.lstat())
    }


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in after if before.get(k) != after[k])


# Written by the host itself on every SSH login or by its daemons, whatever deployctl does.
HOST_NOISE = re.compile(r"var/log/(journal/|wtmp|btmp|lastlog)|var/lib/systemd/|etc/ssh/")


def assert_one_line_refusal(stderr: str, prefix: str = "deployctl: error: ") -> None:
    lines = stderr.rstrip("\n").split("\n")
    assert 1 <= len(lines) <= 2, stderr
    assert lines[0].startswith(prefix), stderr
    assert len(lines) == 1 or lines[1].startswith("deployctl: hint: "), stderr
    assert "Traceback" not in stderr


@pytest.fixture(scope="module")
def other_backup(sim: SimHost) -> Iterator[str]:
    """A backup of another unit in the same folder, and the agent bundle in place on the host."""
    name = "other.service.bak.20250101T000000Z"
    sim.host.put(f"/etc/systemd/system/{name}", b"[Service]\nExecStart=/bin/false\n")
    wait_pool(sim)
    assert cli(sim, "backups", sim.name).returncode == ExitCode.OK  # uploads the bundle
    yield name


BAD_CLI = {
    "context": ["apply", "{host}", "--context", "abc", "--yes"],
    "huge-context": ["apply", "{host}", "--context", "9" * 40, "--yes"],
    "fraction": ["apply", "{host}", "--context", "200k", "--mem-fraction-static", "1.5", "--yes"],
    "requests": ["apply", "{host}", "--context", "200k", "--max-running-requests", "9" * 30, "--yes"],
    "unknown-host": ["apply", "ct999", "--context", "200k", "--yes"],
    "host-path": ["apply", "../../etc/passwd", "--context", "200k", "--yes"],
    "set-newline": ["apply", "{host}", "--context", "200k", "--set", "served-model-name=a\nExecStartPre=/x"],
    "render-newline": ["render", "{host}", "--context", "200k", "--set", "served-model-name=a\nb"],
    "rollback-path": ["rollback", "{host}", "--to", "../../etc/passwd", "--yes"],
    "rollback-dotdot": ["rollback", "{host}", "--to", "sglang.service.bak.20250101T000000Z/../../x", "--yes"],
    "rollback-other-unit": ["rollback", "{host}", "--to", "other.service.bak.20250101T000000Z", "--yes"],
    "rollback-missing": ["rollback", "{host}", "--to", "sglang.service.bak.20200101T000000Z", "--yes"],
}


@pytest.mark.parametrize("case", list(BAD_CLI))
def test_bad_input_through_the_cli_changes_nothing_on_the_host(
    sim: SimHost, other_backup: str, case: str
) -> None:
    before, files = host_state(sim), upper_files(sim)
    r = cli(sim, *(a.format(host=sim.name) for a in BAD_CLI[case]))
    assert r.returncode == ExitCode.USAGE, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert_one_line_refusal(r.stderr)
    assert host_state(sim) == before
    assert [p for p in changed(files, upper_files(sim)) if not HOST_NOISE.match(p)] == []


# --- requests straight to the agent ----------------------------------------------------------------------


def agent_argv() -> list[str]:
    return ["python3", f"{STATE}/bin/{bundle.remote_name(bundle.build()[1])}"]


def good_request(sim: SimHost) -> dict[str, Any]:
    req = Request(
        verb="apply",
        unit_text=sim.unit_text(),
        target_context=100_000,
        expect_sha256="absent",
        port=30000,
    )
    raw: dict[str, Any] = json.loads(req.to_json())
    return raw


NO_EXEC = "[Unit]\nDescription=x\n[Service]\nType=simple\n"
BAD_REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "unit-slash": ("apply", {"unit": "../../etc/passwd"}),
    "unit-dir-in-name": ("apply", {"unit": "x/sglang.service"}),
    "unit-dotdot": ("apply", {"unit": "a..b.service"}),
    "unit-not-service": ("apply", {"unit": "sglang.socket"}),
    "unit-dir-relative": ("apply", {"unit_dir": "etc/systemd/system"}),
    "unit-dir-dotdot": ("apply", {"unit_dir": "/etc/systemd/system/../../../tmp"}),
    "unit-dir-newline": ("apply", {"unit_dir": "/etc/systemd/system\n"}),
    "state-dir-dotdot": ("apply", {"state_dir": "/var/lib/deployctl/.."}),
    "state-dir-relative": ("apply", {"state_dir": "tmp/deployctl"}),
    "text-nul": ("apply", {"unit_text": "[Service]\nExecStart=/bin/true\x00\n"}),
    "text-escape": ("apply", {"unit_text": "[Service]\nExecStart=/bin/true \x1b[2J\n"}),
    "text-cr": ("apply", {"unit_text": "[Service]\r\nExecStart=/bin/true\n"}),
    "text-no-exec": ("apply", {"unit_text": NO_EXEC}),
    "text-missing": ("apply", {"unit_text": None}),
    "text-not-text": ("apply", {"unit_text": ["ExecStart=/bin/true"]}),
    "version-2": ("apply", {"version": 2}),
    "version-missing": ("apply", {"version": None}),
    "verb-unknown": ("destroy", {"verb": "destroy"}),
    "verb-mismatch": ("apply", {"verb": "facts"}),
    "txn-dotdot": ("follow", {"verb": "follow", "txn": "../../../etc"}),
    "backup-path": ("rollback", {"verb": "rollback", "backup": "../../etc/passwd"}),
    "backup-other-unit": ("rollback", {"verb": "rollback", "backup": "other.service.bak.20250101T000000Z"}),
    "margin-huge": ("apply", {"margin": 1e308}),
    "margin-text": ("apply", {"margin": "0.02"}),
    "port-text": ("apply", {"port": "22"}),
    "port-huge": ("apply", {"port": 10**20}),
    "keep-negative": ("apply", {"keep_backups": -1}),
    "target-text": ("apply", {"target_context": "200k"}),
    "target-negative": ("apply", {"target_context": -5}),
    "http-host": ("apply", {"http_host": "127.0.0.1; rm -rf /"}),
    "sha-bad": ("apply", {"expect_sha256": "../x"}),
    "timeouts-text": ("apply", {"timeouts": {"weights_s": "soon"}}),
    "timeouts-negative": ("apply", {"timeouts": {"pool_s": -1}}),
    "smoke-text": ("apply", {"smoke": {"prompt_tokens": "many"}}),
    "smoke-extra": ("apply", {"smoke": {"rm": "-rf"}}),
    "secret-names-not-text": ("apply", {"secret_names": [1, 2]}),
    "unknown-field": ("apply", {"run_as": "root"}),
    "detach-text": ("apply", {"detach": "no"}),
}
NOT_REQUESTS = {"not-json": "{apply", "json-list": "[1, 2]", "json-string": '"apply"', "empty": ""}


# Runs on the host: hands each request to the agent on its stdin, as sshd does, and reports what came back.
# One SSH session for all of them keeps the test quick; two more go over SSH on their own, below.
DRIVER = """
import json, subprocess, sys
argv, cases = json.load(sys.stdin)
out = {}
for name, (verb, body) in cases.items():
    done = subprocess.run([*argv, verb], input=body, capture_output=True, text=True, timeout=60)
    out[name] = [done.returncode, done.stdout, done.stderr]
print(json.dumps(out))
"""


def _refusal_problem(rc: int, out: str, err: str) -> str | None:
    lines = err.rstrip("\n").split("\n")
    if (
        rc == ExitCode.USAGE
        and out == ""
        and len(lines) == 1
        and lines[0].startswith("deployctl-agent: error: ")
    ):
        return None
    return f"rc {rc}, stdout {out[:200]!r}, stderr {err[-300:]!r}"


def test_the_agent_refuses_every_bad_request_and_writes_nothing(sim: SimHost, other_backup: str) -> None:
    wait_pool(sim)
    before, files = host_state(sim), upper_files(sim)
    base = good_request(sim)
    cases = {
        name: (verb, json.dumps({k: v for k, v in {**base, **patch}.items() if v is not None}))
        for name, (verb, patch) in BAD_REQUESTS.items()
    }
    cases.update({name: ("apply", body) for name, body in NOT_REQUESTS.items()})
    driver = sim.host.ssh(["python3", "-c", DRIVER], input=json.dumps([agent_argv(), cases]).encode())
    assert driver.returncode == 0, driver.stderr.decode()
    answers = json.loads(driver.stdout)
    for name in ("unit-slash", "not-json"):  # straight over the SSH channel, too
        done = sim.host.ssh([*agent_argv(), cases[name][0]], input=cases[name][1].encode())
        answers[f"{name} (ssh)"] = [done.returncode, done.stdout.decode(), done.stderr.decode()]
    assert len(answers) == len(cases) + 2
    problems = [f"{name}: {p}" for name, answer in answers.items() if (p := _refusal_problem(*answer))]
    assert not problems, "\n".join(problems)
    assert host_state(sim) == before
    assert [p for p in changed(files, upper_files(sim)) if not HOST_NOISE.match(p)] == []


def test_the_request_the_agent_refuses_is_otherwise_good(sim: SimHost) -> None:
    """The base of the bad requests above passes validation: each refusal is due to its one change."""
    Request.from_json(json.dumps(good_request(sim))).validate()


# --- what a normal apply writes, and how ------------------------------------------------------------------

# the unit and its backups, the agent's state, and the metrics textfile for node_exporter
ALLOWED = re.compile(
    r"(etc/systemd/system/sglang\.service|var/lib/deployctl/"
    r"|var/lib/prometheus/node-exporter/deployctl_sglang\.service\.prom$)"
)


def test_apply_writes_only_the_unit_its_backup_and_the_agent_state_and_keeps_mode_and_owner(
    sim: SimHost,
) -> None:
    wait_pool(sim)
    cli(sim, "backups", sim.name)
    # A unit only root and group nogroup may read, owned by nobody: the backup and the new unit keep that.
    for argv in (["chmod", "0640", UNIT], ["chown", "65534:65534", UNIT]):
        assert sim.host.ssh(argv).returncode == 0
    files, old = upper_files(sim), sim.host.read(UNIT)
    r = cli(sim, "apply", sim.name, "--context", "100k", "--yes")
    assert r.returncode == ExitCode.OK, r.stderr
    written = [p for p in changed(files, upper_files(sim)) if not HOST_NOISE.match(p)]
    assert written and all(ALLOWED.match(p) for p in written), written
    backup = next(p for p in written if p.startswith("etc/systemd/system/sglang.service.bak."))
    assert sim.host.read(backup) == old

    mode_owner = functools.partial(stat_of, sim)
    assert mode_owner(f"/{backup}") == "600 0 0"  # backups are root-only: an old unit may hold secrets
    assert mode_owner(UNIT) == "640 65534 65534"
    # The agent's transaction folder holds the unit text (request.json): only root may read it.
    txn = next(p for p in written if p.endswith("/request.json"))
    assert mode_owner(f"/{txn}").split()[0] == "600"
    assert mode_owner(str(Path(f"/{txn}").parent)).split()[0] == "700"


# --- secrets ------------------------------------------------------------------------------------------------

SECRETS = {"HF_TOKEN": "secret-value-123", "CRED_X": "secret-value-456"}
API_KEY = "secret-value-789"
SECRET_DIR = "/etc/deployctl/secrets"


def as_nobody(sim: SimHost, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return sim.host.ssh(["runuser", "-u", "nobody", "--", *argv], timeout=60)


def test_no_secret_readable_by_another_user_nor_shown(sim: SimHost) -> None:
    wait_pool(sim)
    text = (sim.units_dir / f"{sim.name}.toml").read_text()
    env = ", ".join(f'{k} = "{v}"' for k, v in SECRETS.items())
    text = text.replace("[unit]\n", f'[unit]\nenvironment = {{ {env} }}\nsecret_environment = ["CRED_X"]\n')
    text = text.replace("[sglang.flags]\n", f'[sglang.flags]\napi-key = "{API_KEY}"\n')
    secret = variant(sim, "ct200-secret", text)
    shown = ""
    for argv in (
        ["render", "ct200-secret", "--context", "120k", "--diff"],
        ["apply", "ct200-secret", "--context", "120k", "--yes"],  # its smoke test needs the key: 401 without
        ["apply", "ct200-secret", "--context", "120k", "--yes", "--json"],
        ["backups", "ct200-secret"],
        ["status", "ct200-secret"],
        ["plan", "ct200-secret", "--context", "120k"],
    ):
        r = cli(secret, *argv)
        assert r.returncode == ExitCode.OK, (argv, r.stdout, r.stderr)
        shown += r.stdout + r.stderr
    # The server logs its API key (SGLang's server_args= line does): the facts carried that line.
    logged = sim.host.ssh(["journalctl", "--no-pager", "-o", "cat", "-u", "sglang.service"]).stdout.decode()
    assert API_KEY in logged
    shown += adopt_shown(sim)
    values = [*SECRETS.values(), API_KEY]
    assert "HF_TOKEN" in shown and "--api-key" in shown  # named, never shown
    # Nothing in a transaction's folder holds a value (request.json names them by digest).
    txn_files = [p for p in (sim.host.root / "var/lib/deployctl/txn").rglob("*") if p.is_file()]
    assert not [p for p in txn_files for v in values if v.encode() in p.read_bytes()]
    events = "".join(p.read_text() for p in (sim.host.root / "var/lib/deployctl/txn").glob("*/events.jsonl"))
    journal = sim.host.ssh(["journalctl", "--no-pager", "-o", "cat", "-t", "deployctl"]).stdout.decode()
    # Every file of the unit folder (unit, backups, drop-ins) and everything systemd tells any user.
    files = fk.sh(sim, "find", "/etc/systemd/system", "/run/systemd", "-type", "f").split()
    readable = b"".join(as_nobody(sim, "cat", f).stdout for f in files)
    pid = fk.sh(sim, "systemctl", "show", "-p", "MainPID", "--value", "sglang.service").strip()
    bus = as_nobody(sim, "systemctl", "show", "sglang.service").stdout
    bus += as_nobody(sim, "busctl", "introspect", "org.freedesktop.systemd1", unit_object(sim)).stdout
    proc = as_nobody(sim, "cat", f"/proc/{pid}/cmdline", f"/proc/{pid}/environ").stdout
    for value in values:
        assert value not in shown and value not in events and value not in journal
        assert value.encode() not in readable and value.encode() not in bus and value.encode() not in proc
    assert b"--config" in proc  # the cmdline was readable: it carries the credential's path only
    # The values are on the host, root-only: 0600 files in a 0700 folder, and the service got them.
    assert stat_of(sim, SECRET_DIR) == "700 0 0"
    for name in ("sglang.service.env", "sglang.service.flags.yaml"):
        assert stat_of(sim, f"{SECRET_DIR}/{name}") == "600 0 0"
        assert as_nobody(sim, "cat", f"{SECRET_DIR}/{name}").returncode != 0
    assert API_KEY in sim.host.read(f"{SECRET_DIR}/sglang.service.flags.yaml").decode()
    environ = sim.host.read(f"/proc/{pid}/environ").split(b"\0")
    assert f"HF_TOKEN={SECRETS['HF_TOKEN']}".encode() in environ
    assert_hand_written_secrets_not_shown(secret)
    # A rollback to the baseline takes the secrets it ran with (none) along with the unit.
    texts = {b: sim.host.read(f"/etc/systemd/system/{b}") for b in sim.backups()}
    baseline = max(b for b, t in texts.items() if b"EnvironmentFile" not in t)
    r = cli(sim, "rollback", sim.name, "--to", baseline, "--yes")
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    left = fk.sh(sim, "ls", "-A", SECRET_DIR).split()
    assert left and all(".bak." in n for n in left), left  # only copies kept with backups of secret units


def adopt_shown(sim: SimHost) -> str:
    """What adopt prints and writes for the unit running now (the inventory removed again)."""
    r = cli(sim, "adopt", "ct200-adopt-check", "--ssh", sim.name, "--force")
    written = sim.units_dir / "ct200-adopt-check.toml"
    text = written.read_text() if written.exists() else ""
    written.unlink(missing_ok=True)
    return r.stdout + r.stderr + text


def assert_hand_written_secrets_not_shown(sim: SimHost) -> None:
    """Secrets written into the unit by hand (a variable, an inline credential): facts, status, plan, a dry
    run and adopt send and print none of them; the unit is put back as it was afterwards."""
    original = sim.host.read(UNIT)
    inline = ("secret-value-aaa", "secret-value-bbb")
    lines = f"[Service]\nEnvironment=MY_API_KEY={inline[0]}\nSetCredential=hub:{inline[1]}\n"
    edited = original.decode().replace("[Service]\n", lines, 1)
    # facts reads the config.json the unit's --model-path names: a writable copy has one (test_host_facts)
    model = re.search(r"--model-path[= ](/\S+)", edited)
    assert model is not None
    copy = "/srv/models/" + model[1].rstrip("/").rsplit("/", 1)[-1]
    sim.host.put(f"{copy}/config.json", json.dumps(cfg.KIMI_K26).encode())
    sim.host.put(UNIT, edited.replace(model[0], model[0].replace(model[1], copy)).encode())
    try:
        shown = ""
        for argv in (
            ["facts", "ct200-secret", "--json"],
            ["status", "ct200-secret"],
            ["plan", "ct200-secret", "--context", "120k"],
            ["apply", "ct200-secret", "--context", "120k", "--dry-run"],
        ):
            r = cli(sim, *argv)
            assert r.returncode == ExitCode.OK, (argv, r.stdout, r.stderr)
            shown += r.stdout + r.stderr
        adopted = adopt_shown(sim)
        assert "SetCredential= holds a secret inline" in adopted  # refused, never copied
        assert "server_args=" in shown  # the facts carried the start's line that logged the key
        assert "MY_API_KEY" in shown and "SetCredential=hub:***" in shown  # named, never shown
        assert not [v for v in (*inline, API_KEY) if v in shown + adopted]
    finally:
        sim.host.put(UNIT, original)


def stat_of(sim: SimHost, path: str) -> str:
    """`mode uid gid` of a path on the host."""
    return sim.host.ssh(["stat", "-c", "%a %u %g", path]).stdout.decode().strip()


def unit_object(sim: SimHost) -> str:
    return (
        fk.sh(
            sim,
            "busctl",
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "GetUnit",
            "s",
            "sglang.service",
        )
        .split()[1]
        .strip('"')
    )


# --- host keys through the command line ---------------------------------------------------------------------


def _with_known_hosts(sim: SimHost, tmp_path: Path, content: str | None) -> dict[str, str]:
    """The sim's ssh config with its own known_hosts file (None: no file at all)."""
    known = tmp_path / "known_hosts"
    if content is not None:
        known.write_text(content)
    config = tmp_path / "ssh_config"
    text = sim.ssh_config.read_text()
    config.write_text(re.sub(r"UserKnownHostsFile \S+", f"UserKnownHostsFile {known}", text))
    return {**os.environ, **sim.env, "DEPLOYCTL_SSH_CONFIG": str(config)}


def _deployctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEPLOYCTL, *args], env=env, capture_output=True, text=True, timeout=120, input="")


def test_host_keys_unknown_refused_accepted_once_and_changed_always_refused(
    sim: SimHost, tmp_path: Path
) -> None:
    wait_pool(sim)
    before = host_state(sim)
    env = _with_known_hosts(sim, tmp_path, None)
    unknown = _deployctl(env, "apply", sim.name, "--context", "100k", "--yes")
    assert unknown.returncode == ExitCode.UNREACHABLE, unknown.stderr
    assert_one_line_refusal(unknown.stderr)
    assert "unknown host key" in unknown.stderr and "--accept-new-host-key" in unknown.stderr
    assert not (tmp_path / "known_hosts").exists()
    accepted = _deployctl(env, "backups", sim.name, "--accept-new-host-key")
    assert accepted.returncode == ExitCode.OK, accepted.stderr
    recorded = (tmp_path / "known_hosts").read_text()
    assert _deployctl(env, "backups", sim.name).returncode == ExitCode.OK  # trusted from now on
    # A different key for the same address: refused, even when asked to accept new keys.
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    name = recorded.split()[0]
    kind, blob = impostor.with_suffix(".pub").read_text().split()[:2]
    env = _with_known_hosts(sim, tmp_path, f"{name} {kind} {blob}\n")
    for extra in ([], ["--accept-new-host-key"]):
        changed_key = _deployctl(env, "apply", sim.name, "--context", "100k", "--yes", *extra)
        assert changed_key.returncode == ExitCode.UNREACHABLE, changed_key.stderr
        assert_one_line_refusal(changed_key.stderr)
        assert "changed" in changed_key.stderr and "man-in-the-middle" in changed_key.stderr
    assert (tmp_path / "known_hosts").read_text() == f"{name} {kind} {blob}\n"
    assert host_state(sim) == before
