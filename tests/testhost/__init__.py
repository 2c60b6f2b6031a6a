"""The local test host: a real systemd (PID 1, journald, system bus) and sshd in systemd-nspawn."""

from tests.testhost.instance import BootError, HostSetup, TestHost, free_ports
from tests.testhost.rootfs import TestHostUnavailable, ensure_rootfs, missing_prerequisites, recipe_hash

__all__ = [
    "BootError",
    "HostSetup",
    "TestHost",
    "TestHostUnavailable",
    "ensure_rootfs",
    "free_ports",
    "missing_prerequisites",
    "recipe_hash",
]
