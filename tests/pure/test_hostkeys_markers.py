"""known_hosts marker lines (@cert-authority, @revoked) and HashKnownHosts, without any network."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from agent.remote.ssh.hostkeys import HostKeyError, KnownHostsPolicy, load_known_hosts, revoked_key_error
from agent.remote.ssh.transport import SshSettings, SshTransport

HOST = "gpu-1.lab"


def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker} {names} {key.get_name()} {key.get_base64()}\n".lstrip()


def _transport(tmp_path: Path, known_hosts: Path, extra: str = "", accept_new: bool = True) -> SshTransport:
    config = tmp_path / "config"
    config.write_text(f"Host gpu-1\n  HostName {HOST}\n  User root\n{extra}")
    return SshTransport(
        "gpu-1", SshSettings(config_path=config, known_hosts=known_hosts, accept_new=accept_new)
    )


def _policy(transport: SshTransport, client: paramiko.SSHClient) -> KnownHostsPolicy:
    # The policy exactly as a connect builds it for the final hop: known_hosts loaded, config honoured.
    return transport._host_key_policy(transport._final, client)


def test_cert_authority_line_is_skipped_and_the_normal_entry_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca, host_key = _key(), _key()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        "# a comment\n\n"
        + _line("*.lab", ca, "@cert-authority")
        + "garbage\n"
        + "other.lab ssh-ed25519 !!notbase64!!\n"
        + _line(HOST, host_key)
    )
    into = paramiko.HostKeys()
    with caplog.at_level(logging.DEBUG, logger="deployctl.ssh"):
        revoked = load_known_hosts(into, [known_hosts, tmp_path / "absent"])
    assert revoked == {}
    found = into.lookup(HOST)
    assert found is not None and found[host_key.get_name()] == host_key
    assert into.lookup("other.lab") is None
    assert any("@cert-authority" in r.getMessage() for r in caplog.records)


def test_revoked_key_is_refused_even_with_accept_new(tmp_path: Path) -> None:
    revoked_key, other = _key(), _key()
    known_hosts = tmp_path / "known_hosts"
    # Revoked under an unrelated pattern, yet listed for the host: OpenSSH refuses it for every host.
    content = _line("*.elsewhere", revoked_key, "@revoked") + _line(HOST, revoked_key)
    known_hosts.write_text(content)
    transport = _transport(tmp_path, known_hosts, accept_new=True)
    client = paramiko.SSHClient()
    policy = _policy(transport, client)
    # Left out of the loaded entries, so paramiko consults the policy instead of trusting it.
    assert client.get_host_keys().lookup(HOST) is None
    with pytest.raises(HostKeyError) as caught:
        policy.missing_host_key(client, HOST, revoked_key)
    message = caught.value.message
    assert "revoked" in message and str(known_hosts) in message and "\n" not in message
    assert known_hosts.read_text() == content
    # Where another key of that type is recorded, paramiko raises BadHostKeyException: still "revoked".
    assert revoked_key_error("gpu-1", f"{HOST}:22", policy.revoked, revoked_key) is not None
    assert policy.revoked_error(other) is None
    policy.missing_host_key(client, HOST, other)  # an unrevoked new key is still accepted
    assert known_hosts.read_text() == content + _line(HOST, other)


def test_hash_known_hosts_records_a_hashed_entry(tmp_path: Path) -> None:
    key = _key()
    known_hosts = tmp_path / "known_hosts"
    client = paramiko.SSHClient()
    transport = _transport(tmp_path, known_hosts, "  HashKnownHosts yes\n")
    _policy(transport, client).missing_host_key(client, HOST, key)
    line = known_hosts.read_text()
    assert line.startswith("|1|") and HOST not in line and line.endswith(f" {key.get_base64()}\n")
    stored = paramiko.HostKeys()
    stored.load(str(known_hosts))
    found = stored.lookup(HOST)
    assert found is not None and found[key.get_name()] == key
    assert stored.lookup("gpu-2.lab") is None
    ours = paramiko.HostKeys()
    load_known_hosts(ours, [known_hosts])
    assert ours.check(HOST, key)
    if shutil.which("ssh-keygen"):  # OpenSSH itself finds the host in the file we wrote
        done = subprocess.run(
            ["ssh-keygen", "-F", HOST, "-f", str(known_hosts)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0 and key.get_base64() in done.stdout
    # Without the option the entry stays plain, as before.
    plain = tmp_path / "plain" / "known_hosts"
    (tmp_path / "plain").mkdir()
    _policy(_transport(tmp_path / "plain", plain), client).missing_host_key(client, HOST, key)
    assert plain.read_text() == _line(HOST, key)
