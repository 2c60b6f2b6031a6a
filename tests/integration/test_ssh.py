"""SshTransport against a real OpenSSH server on loopback: config, host keys, retries, dropped links."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ConnectError
from agent.exitcodes import ExitCode
from agent.remote.ssh.transport import ConnectRetry, SshSettings, SshTransport
from agent.remote.transport import ConnectionLost
from tests.integration.sshd import Sshd, fingerprint_of, free_port, keygen, skip_unless_sshd, start_sshd

pytestmark = pytest.mark.integration
skip_unless_sshd()

FAST = ConnectRetry(attempts=3, initial_delay_s=0.05, max_delay_s=0.1, timeout_s=5)
AWKWARD = [
    "a b", "'single'", '"double"', "$HOME", "${PATH}", "`id`", "$(id)", "new\nline", "100%", "%s %d",
    "back\\slash", "", "-n", "*", "~", "; rm -rf /tmp/nothing", "| cat", "&&", "tab\there", "ünïcödé ✓",
]  # fmt: skip


@dataclass
class Lab:
    """One sshd plus the client side files that reach it."""

    sshd: Sshd
    root: Path
    config: Path
    known_hosts: Path

    def transport(self, target: str = "target", name: str | None = None, **options: Any) -> SshTransport:
        given = {"config_path": self.config, "known_hosts": self.known_hosts, "retry": FAST, **options}
        return SshTransport(target, SshSettings(allow_agent=False, **given), name=name)


def _host(alias: str, sshd: Sshd, key: Path, hostname: str = "127.0.0.1", extra: str = "") -> str:
    return (
        f"Host {alias}\n  HostName {hostname}\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n{extra}"
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("ssh-lab")
    key = keygen(root / "client_key")
    sshd = start_sshd(root / "sshd", key)
    wrong = keygen(root / "wrong_key")
    config = root / "config"
    config.write_text(
        _host("target", sshd, key)
        + _host("jump", sshd, key)
        + _host("viajump", sshd, key, extra="  ProxyJump jump\n")
        + _host("viachain", sshd, key, extra="  ProxyJump jump,jump\n")
        + _host("localjump", sshd, key, hostname="localhost")
        + _host("viabadjump", sshd, key, extra="  ProxyJump localjump\n")
        + _host("wrongkey", sshd, wrong)
    )
    known_hosts = root / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line())
    yield Lab(sshd, root, config, known_hosts)
    sshd.stop()


def test_awkward_arguments_round_trip_exactly(lab: Lab) -> None:
    with lab.transport() as ssh:
        result = ssh.run(["printf", "%s\\n", *AWKWARD]).check()
    assert result.stdout.decode() == "".join(f"{arg}\n" for arg in AWKWARD)


def test_exit_code_stdin_and_stderr(lab: Lab) -> None:
    with lab.transport() as ssh:
        result = ssh.run(["sh", "-c", "cat; echo to-stderr >&2; exit 42"], input=b"in\x00put\n")
    assert (result.rc, result.stdout, result.stderr) == (42, b"in\x00put\n", b"to-stderr\n")


def test_describe_names_user_address_and_jumps(lab: Lab) -> None:
    assert lab.transport().describe() == f"root@127.0.0.1:{lab.sshd.port}"
    assert lab.transport("viachain").describe() == f"root@127.0.0.1:{lab.sshd.port} via jump,jump"


def test_alias_from_an_included_file_in_home(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dot_ssh = tmp_path / ".ssh"
    (dot_ssh / "conf.d").mkdir(parents=True)
    # Relative Include paths are relative to ~/.ssh; a setting after the Include applies to every host again.
    (dot_ssh / "config").write_text(f"Include conf.d/*.conf\nIdentityFile {lab.sshd.client_key}\n")
    (dot_ssh / "conf.d" / "10-lab.conf").write_text(
        f"Host lab\n  HostName 127.0.0.1\n  Port {lab.sshd.port}\n  User root\n"
    )
    (dot_ssh / "conf.d" / "README").write_text("Host lab\n  Port 1\n")  # not *.conf: never read
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DEPLOYCTL_SSH_CONFIG", str(dot_ssh / "config"))
    with SshTransport("lab", SshSettings(known_hosts=lab.known_hosts, retry=FAST, allow_agent=False)) as ssh:
        assert ssh.run(["id", "-un"]).check().stdout == b"root\n"


def _direct_tcpip_count(lab: Lab) -> int:
    return lab.sshd.log.count("server_request_direct_tcpip")


@pytest.mark.parametrize(("alias", "hops"), [("viajump", 1), ("viachain", 2)])
def test_proxy_jump_goes_through_each_hop(lab: Lab, alias: str, hops: int) -> None:
    before = _direct_tcpip_count(lab)
    with lab.transport(alias) as ssh:
        assert ssh.run(["printf", "%s\\n", *AWKWARD]).check().stdout.decode().splitlines()[:2] == AWKWARD[:2]
    assert _direct_tcpip_count(lab) - before == hops


def test_jump_host_key_is_checked_too(lab: Lab) -> None:
    with pytest.raises(ConnectError) as caught:
        lab.transport("viabadjump").connect()
    message = caught.value.message
    assert message.startswith("viabadjump (jump host localjump): unknown host key for ")
    assert f"localhost:{lab.sshd.port}" in message


def test_unknown_host_key_is_refused_with_its_fingerprint(lab: Lab, tmp_path: Path) -> None:
    with pytest.raises(ConnectError) as caught:
        lab.transport(known_hosts=tmp_path / "known_hosts").connect()
    fingerprint = fingerprint_of(lab.sshd.host_key.with_suffix(".pub"))
    assert caught.value.message == (
        f"target: unknown host key for 127.0.0.1:{lab.sshd.port}: ssh-ed25519 {fingerprint}"
    )
    assert caught.value.hint is not None and "--accept-new-host-key" in caught.value.hint
    assert caught.value.exit_code == ExitCode.UNREACHABLE
    assert not (tmp_path / "known_hosts").exists()


def test_accept_new_records_the_key_for_the_next_connection(lab: Lab, tmp_path: Path) -> None:
    known_hosts = tmp_path / "fresh" / "known_hosts"
    with lab.transport(known_hosts=known_hosts, accept_new=True) as ssh:
        ssh.run(["true"]).check()
    with lab.transport(known_hosts=known_hosts) as ssh:
        ssh.run(["true"]).check()
    assert known_hosts.read_text() == lab.sshd.known_hosts_line()
    assert known_hosts.stat().st_mode & 0o777 == 0o600
    # OpenSSH's own client trusts the file we wrote.
    if shutil.which("ssh"):
        ssh_argv = ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
        ssh_argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-i", str(lab.sshd.client_key)]
        done = subprocess.run([*ssh_argv, "-p", str(lab.sshd.port), "root@127.0.0.1", "true"], check=False)
        assert done.returncode == 0


def test_changed_host_key_is_refused_even_with_accept_new(lab: Lab, tmp_path: Path) -> None:
    impostor = keygen(tmp_path / "other_host_key")
    kind, blob = impostor.with_suffix(".pub").read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{lab.sshd.port} {kind} {blob}\n")
    with pytest.raises(ConnectError) as caught:
        lab.transport(known_hosts=known_hosts, accept_new=True).connect()
    message = caught.value.message
    assert message.startswith(f"target: host key for 127.0.0.1:{lab.sshd.port} changed")
    assert "man-in-the-middle" in message
    assert fingerprint_of(lab.sshd.host_key.with_suffix(".pub")) in message
    assert known_hosts.read_text() == f"[127.0.0.1]:{lab.sshd.port} {kind} {blob}\n"


@pytest.mark.parametrize("recorded", ["same", "other", "none"])
def test_revoked_host_key_is_refused_even_with_accept_new(lab: Lab, tmp_path: Path, recorded: str) -> None:
    kind, blob = lab.sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    other = keygen(tmp_path / "other_host_key").with_suffix(".pub").read_text().split()[1]
    # The host's own line lists the revoked key, another key of its type (BadHostKeyException), or none.
    line = lab.sshd.known_hosts_line()
    entries = {"same": line, "other": line.replace(blob, other), "none": ""}
    known_hosts = tmp_path / "known_hosts"
    # Revoked under an unrelated pattern: OpenSSH refuses the key for every host; @cert-authority is skipped.
    content = f"@cert-authority *.lab {kind} {blob}\n@revoked *.elsewhere {kind} {blob}\n" + entries[recorded]
    known_hosts.write_text(content)
    with pytest.raises(ConnectError) as caught:
        lab.transport(known_hosts=known_hosts, accept_new=True).connect()
    message = caught.value.message
    assert message.startswith(f"target: host key for 127.0.0.1:{lab.sshd.port} is revoked")
    assert str(known_hosts) in message
    assert known_hosts.read_text() == content


def test_hash_known_hosts_records_a_hashed_entry(lab: Lab, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(_host("target", lab.sshd, lab.sshd.client_key, extra="  HashKnownHosts yes\n"))
    known_hosts = tmp_path / "known_hosts"
    with lab.transport(config_path=config, known_hosts=known_hosts, accept_new=True) as ssh:
        ssh.run(["true"]).check()
    with lab.transport(config_path=config, known_hosts=known_hosts) as ssh:  # our own loader matches it
        ssh.run(["true"]).check()
    assert known_hosts.read_text().startswith("|1|")
    name = f"[127.0.0.1]:{lab.sshd.port}"
    found = subprocess.run(
        ["ssh-keygen", "-F", name, "-f", str(known_hosts)], capture_output=True, check=False
    )
    assert found.returncode == 0


def test_closed_port_fails_after_bounded_retries(lab: Lab) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        lab.transport(f"root@127.0.0.1:{port}", name="ct200").connect()
    assert (
        caught.value.message
        == f"ct200: cannot connect to 127.0.0.1:{port}: connection refused (after 3 attempts)"
    )
    assert time.monotonic() - started < 2


def test_retries_until_the_host_comes_up(lab: Lab, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    late: list[Sshd] = []
    boot = threading.Timer(0.4, lambda: late.append(start_sshd(tmp_path / "sshd", lab.sshd.client_key, port)))
    config = tmp_path / "config"
    config.write_text(f"Host 127.0.0.1\n  IdentityFile {lab.sshd.client_key}\n")
    patient = ConnectRetry(attempts=10, initial_delay_s=0.1, max_delay_s=0.3, timeout_s=5)
    caplog.set_level(logging.INFO, logger="deployctl.ssh")
    boot.start()
    try:
        ssh = lab.transport(f"root@127.0.0.1:{port}", config_path=config, known_hosts=tmp_path / "kh",
                            accept_new=True, retry=patient)  # fmt: skip
        with ssh:
            assert ssh.run(["true"]).ok
    finally:
        boot.join()
        for sshd in late:
            sshd.stop()
    assert f"cannot connect to 127.0.0.1:{port}: connection refused; retrying in" in caplog.text


def test_unresolvable_host_is_not_retried(lab: Lab) -> None:
    slow = ConnectRetry(attempts=3, initial_delay_s=5, max_delay_s=5, timeout_s=5)
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        lab.transport("root@nosuchhost.invalid", name="ct200", retry=slow).connect()
    assert caught.value.message.startswith("ct200: cannot resolve host 'nosuchhost.invalid'")
    assert time.monotonic() - started < 4


def test_wrong_key_is_an_auth_failure_and_not_retried(lab: Lab) -> None:
    slow = ConnectRetry(attempts=3, initial_delay_s=5, max_delay_s=5, timeout_s=5)
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        lab.transport("wrongkey", retry=slow).connect()
    wrong = lab.root / "wrong_key"
    assert caught.value.message == (
        f"wrongkey: authentication failed for root@127.0.0.1:{lab.sshd.port} "
        f"(tried keys: {wrong} (ssh-ed25519 {fingerprint_of(wrong.with_suffix('.pub'))}))"
    )
    assert time.monotonic() - started < 4


def test_encrypted_key_is_skipped_never_prompted(lab: Lab, tmp_path: Path) -> None:
    locked = tmp_path / "locked_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    config = tmp_path / "config"
    config.write_text(_host("locked", lab.sshd, locked))
    with pytest.raises(ConnectError) as caught:
        lab.transport("locked", config_path=config).connect()
    assert f"{locked} (encrypted, skipped: add it to ssh-agent)" in caught.value.message


def test_command_killed_by_a_signal_is_not_a_lost_connection(lab: Lab) -> None:
    with lab.transport() as ssh:
        stream = ssh.stream(["sh", "-c", "echo before; kill -9 $$"])
        assert list(stream) == ["before"]
        assert stream.rc == -1
        assert ssh.run(["true"]).ok  # the link is still good


@pytest.fixture
def own_sshd(lab: Lab, tmp_path: Path) -> Iterator[Sshd]:
    """An sshd of its own, for a test that kills its sessions."""
    sshd = start_sshd(tmp_path / "sshd", lab.sshd.client_key)
    yield sshd
    sshd.stop()


def test_killed_session_mid_stream_raises_connection_lost(lab: Lab, own_sshd: Sshd, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(own_sshd.known_hosts_line())
    target = f"root@127.0.0.1:{own_sshd.port}"
    config = tmp_path / "config"
    config.write_text(f"Host 127.0.0.1\n  IdentityFile {own_sshd.client_key}\n")
    ssh = lab.transport(target, known_hosts=known_hosts, config_path=config)
    with ssh:
        lines = iter(ssh.stream(["sh", "-c", "echo started; sleep 30; echo never"]))
        assert next(lines) == "started"
        assert own_sshd.kill_sessions() >= 1
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as caught:
            next(lines)
        assert time.monotonic() - started < 5
        assert caught.value.message.startswith(
            f"127.0.0.1: connection to 127.0.0.1:{own_sshd.port} lost while"
        )
        with pytest.raises(ConnectionLost):
            ssh.run(["true"])
