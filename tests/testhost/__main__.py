"""`python -m tests.testhost up|down|status|sweep`: a long-lived local test host, and orphan clean-up."""

from __future__ import annotations

import argparse
import shlex
import sys

from tests.testhost.instance import INSTANCES, BootError, TestHost, orphans, remove_instance
from tests.testhost.rootfs import TestHostUnavailable

NAME = "deployctl-testhost"


def up() -> int:
    if (INSTANCES / NAME / "state.json").exists():
        print(f"{NAME} is already up", file=sys.stderr)
        return status()
    host = TestHost.create(name=NAME, outlive_creator=True)
    print(f"{NAME} is up after {host.boot_seconds:.1f} s")
    return status()


def down() -> int:
    if not (INSTANCES / NAME).exists():
        print(f"{NAME} is not up")
        return 0
    try:
        TestHost.attach(NAME).stop()
    except (OSError, ValueError, KeyError):
        remove_instance(INSTANCES / NAME)  # half-made instance: remove what is there
    print(f"{NAME} stopped")
    return 0


def status() -> int:
    if not (INSTANCES / NAME / "state.json").exists():
        print(f"{NAME} is not up")
        return 1
    host = TestHost.attach(NAME)
    print(f"ssh:        {shlex.join(host.ssh_argv())}")
    print(f"host key:   {host.host_key_fingerprint}")
    print(f"system bus: {host.bus_address}")
    print(f"sglang port {host.sglang_port}; console log {host.log_path}")
    return 0


def sweep() -> int:
    for name in orphans():
        TestHost.attach(name).stop()
        print(f"stopped {name}: the process that started it is gone")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testhost")
    parser.add_argument("verb", choices=["up", "down", "status", "sweep"])
    verb = parser.parse_args(argv).verb
    try:
        return {"up": up, "down": down, "status": status, "sweep": sweep}[verb]()
    except (TestHostUnavailable, BootError) as exc:
        print(f"testhost: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
