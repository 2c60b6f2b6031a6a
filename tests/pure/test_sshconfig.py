"""Target parsing, Include expansion and ssh config resolution, without any network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from agent.errors import UsageError
from agent.remote.ssh.config import expand_includes, resolve, split_target

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("target", "parts"),
    [
        ("ct200", (None, "ct200", None)),
        ("root@ct200", ("root", "ct200", None)),
        ("root@10.0.0.5:2222", ("root", "10.0.0.5", 2222)),
        ("gpu-1.lab:22", (None, "gpu-1.lab", 22)),
        ("[::1]:2200", (None, "::1", 2200)),
        ("admin@[fe80::1]", ("admin", "fe80::1", None)),
        ("fe80::1", (None, "fe80::1", None)),
    ],
)
def test_split_target(target: str, parts: tuple[str | None, str, int | None]) -> None:
    assert split_target(target) == parts


@pytest.mark.parametrize(
    "target", ["", "@host", "root@", "host:0", "host:70000", "host:ssh", "[::1", "[::1]x"]
)
def test_bad_targets_are_usage_errors(target: str) -> None:
    with pytest.raises(UsageError):
        split_target(target)


CONFIG = """
Host ct200
  HostName 10.0.0.5
  User deploy
  Port 2222
  IdentityFile /keys/first
  IdentityFile /keys/second
  UserKnownHostsFile /kh/one /kh/two
  ProxyJump bastion
Host bastion
  HostName bastion.lab
  User jump
  ProxyJump edge
Host edge
  HostName 192.0.2.1
Host *
  User fallback
"""


def test_resolve_honours_the_config_and_chains_jumps() -> None:
    found = resolve("ct200", paramiko.SSHConfig.from_text(CONFIG))
    assert (found.alias, found.hostname, found.port, found.user) == ("ct200", "10.0.0.5", 2222, "deploy")
    assert found.identity_files == (Path("/keys/first"), Path("/keys/second"))
    assert found.known_hosts == (Path("/kh/one"), Path("/kh/two"))
    # The jump host's own ProxyJump is reached first, as OpenSSH does.
    assert [(hop.alias, hop.hostname, hop.user) for hop in found.jumps] == [
        ("edge", "192.0.2.1", "fallback"),
        ("bastion", "bastion.lab", "jump"),
    ]
    assert all(hop.jumps == () for hop in found.jumps)


def test_explicit_user_and_port_win_over_the_config() -> None:
    found = resolve("root@ct200:22", paramiko.SSHConfig.from_text(CONFIG))
    assert (found.user, found.port, found.address) == ("root", 22, "10.0.0.5:22")


def test_jump_loop_is_a_usage_error() -> None:
    looping = "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n"
    with pytest.raises(UsageError, match="ProxyJump chain"):
        resolve("a", paramiko.SSHConfig.from_text(looping))


def test_includes_are_inlined_in_order_and_reopen_the_block(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "20-b.conf").write_text("Host b\n  Port 2\n")
    (tmp_path / "conf.d" / "10-a.conf").write_text("Host a\n  Port 1\nInclude nested.conf\n")
    (tmp_path / "nested.conf").write_text("Host n\n  Port 3\n")
    text = "Host ct200\n  Include conf.d/*.conf\n  User deploy\nInclude missing/*.conf\n"
    expanded = paramiko.SSHConfig.from_text(expand_includes(text, tmp_path))
    assert [expanded.lookup(h).get("port") for h in ("a", "b", "n")] == ["1", "2", "3"]
    # "User deploy" came after the Include inside "Host ct200": it still belongs to ct200 only.
    assert expanded.lookup("ct200").get("user") == "deploy"
    assert expanded.lookup("b").get("user") is None


def test_include_recursion_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "self.conf").write_text(f"Include {tmp_path / 'self.conf'}\n")
    with pytest.raises(UsageError, match="nested deeper"):
        expand_includes((tmp_path / "self.conf").read_text(), tmp_path)


def _fresh_python(code: str) -> str:
    """Run code in a new interpreter, where nothing has imported paramiko yet."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_invoke_is_not_imported_for_a_config_without_match_exec() -> None:
    code = "import sys, agent.deploy; print(sys.modules.get('invoke') is None)"
    assert _fresh_python(code) == "True"


def test_match_exec_still_works_and_loads_invoke(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text('Match exec "true"\n  Port 2222\nMatch exec "false"\n  User nobody\nHost *\n')
    code = (
        "import sys; from pathlib import Path; from agent.remote.ssh.config import load_config; "
        f"c = load_config(Path({str(config)!r})).lookup('gpu1'); "
        "print(c.get('port'), c.get('user'), sys.modules.get('invoke') is not None)"
    )
    assert _fresh_python(code) == "2222 None True"
