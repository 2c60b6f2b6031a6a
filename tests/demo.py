"""make demo: adopt the hand-written unit of the simulated ct200, raise its context to 200k, watch a 400k try
roll back, roll back by hand to the hand-written unit.

Each step runs the real CLI over SSH against a local systemd host, and the demo checks each outcome
itself: it exits non-zero if any step did not do what it should.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agent.exitcodes import ExitCode
from agent.render import redact
from agent.sglang.flags import diff_flags, parse_unit_flags
from tests import simhost

DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))


def banner(text: str) -> None:
    print(f"\n\033[1m### {text}\033[0m" if sys.stdout.isatty() else f"\n### {text}", flush=True)


def deployctl(*args: str, expect: ExitCode) -> None:
    print("$ deployctl " + " ".join(args), flush=True)
    code = subprocess.run([DEPLOYCTL, *args], env=os.environ.copy(), check=False).returncode
    if code != expect:
        raise SystemExit(
            f"demo: `deployctl {' '.join(args)}` exited {code}, expected {int(expect)} ({expect.name})"
        )


def pool(sim: simhost.SimHost) -> int:
    port = parse_unit_flags(sim.unit_text())["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
        return int(json.load(r)["max_total_num_tokens"])


def wait_baseline(sim: simhost.SimHost, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return pool(sim)
        except OSError:
            time.sleep(0.3)
    raise SystemExit("demo: the baseline service did not come up")


def check(ok: bool, what: str) -> None:
    print(f"demo check: {what}: {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        raise SystemExit(f"demo: check failed: {what}")


HOST = "ct200"  # the inventory name adopt writes: units/ct200.toml


def main() -> int:
    t0 = time.monotonic()
    banner("booting the local test host (systemd, journald, sshd) with the simulated ct200")
    with simhost.booted() as sim:
        wait_baseline(sim)
        port = int(str(parse_unit_flags(sim.unit_text())["port"]))
        hand = simhost.hand_unit(port)
        simhost.install_hand_written(sim, hand)
        base = wait_baseline(sim)

        banner("0. ct200 already runs SGLang from a unit written by hand: adopt it")
        print(redact(hand).rstrip(), flush=True)
        deployctl("adopt", HOST, "--ssh", sim.name, expect=ExitCode.OK)
        inventory = (sim.units_dir / f"{HOST}.toml").read_text()
        print(inventory.rstrip(), flush=True)
        check(simhost.TOKEN not in inventory, "the token's value never left the host")
        print(
            f"baseline: --context-length 32768 --mem-fraction-static 0.85, KV pool {base:,} tokens",
            flush=True,
        )

        banner("1. raise the context to 200k: one restart, pool >= 200,000, smoke test")
        deployctl("apply", HOST, "--context", "200k", "--yes", expect=ExitCode.OK)
        raised = pool(sim)
        check(raised >= 200_000, f"pool {raised:,} >= 200,000 after one restart")
        check(len(sim.backups()) == 1, "the hand-written unit was backed up")
        changed = {c.name for c in diff_flags(parse_unit_flags(hand), parse_unit_flags(sim.unit_text()))}
        planned = {"context-length", "mem-fraction-static", "max-running-requests"}
        check(
            bool(changed) and changed <= planned,
            f"only the planned flags changed: {', '.join(sorted(changed))}",
        )
        good_unit = sim.unit_text()

        banner("2. ask for 400k: the plan says it cannot fit; forced, the pool falls short and it rolls back")
        deployctl("plan", HOST, "--context", "400k", expect=ExitCode.OK)
        deployctl("apply", HOST, "--context", "400k", "--yes", "--force", expect=ExitCode.ROLLED_BACK)
        check(sim.unit_text() == good_unit, "the 200k unit is back in place")
        check(pool(sim) == raised, f"the old service is healthy again with its pool of {raised:,}")

        banner("3. the backups, and a manual rollback to the hand-written unit")
        deployctl("backups", HOST, expect=ExitCode.OK)
        deployctl("rollback", HOST, "--to", sim.backups()[0], "--yes", expect=ExitCode.OK)
        check(sim.unit_text() == hand, "the hand-written unit is back, byte for byte")
        check(pool(sim) == base, f"the baseline pool {base:,} is back")
        banner("tearing the test host down")
    print(f"\ndemo passed in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
