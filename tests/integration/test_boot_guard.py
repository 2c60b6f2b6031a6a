"""The boot guard on the test host's real systemd (252): a unit with the guard's drop-in and no marker under
/run is not started at boot (an unmet condition: inactive, not failed), and starts once the marker is there
(agent/host/change/bootguard.py)."""

from __future__ import annotations

import pytest

from agent.host.change.bootguard import DROP_IN, guard_text
from tests import faultkit as fk
from tests.integration.conftest import wait_pool
from tests.simhost import SimHost

pytestmark = pytest.mark.integration

GUARD = f"/etc/systemd/system/sglang.service.d/{DROP_IN}"
MARKER = "/run/deployctl/sglang.service.go"


def test_a_guarded_unit_is_not_started_at_boot_until_the_agent_allows_it(sim: SimHost) -> None:
    from pathlib import Path

    sim.host.put(GUARD, guard_text(Path(MARKER)).encode())
    try:
        fk.sh(sim, "systemctl", "daemon-reload")
        fk.restart_host(sim)  # /run is empty again: no marker
        state = sim.host.ssh(["systemctl", "is-active", "sglang.service"]).stdout.decode().strip()
        log = fk.sh(sim, "journalctl", "-b", "--no-pager", "-u", "sglang.service")
        assert state == "inactive" and "unmet condition" in log, (state, log[-2000:])
        fk.sh(sim, "sh", "-c", f"mkdir -p /run/deployctl && touch {MARKER} && systemctl start sglang.service")
        assert wait_pool(sim) > 0  # the agent's own start passes
    finally:
        fk.sh(
            sim, "sh", "-c", f"rm -f {GUARD} && systemctl daemon-reload && systemctl restart sglang.service"
        )
        wait_pool(sim)
