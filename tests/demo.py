"""make demo: adopt the hand-written unit of the simulated ct200, raise its context to 200k, watch a 400k try
roll back, roll back by hand to the hand-written unit; then a fleet of three on Ansible whose failing canary
halts the rollout; then a move to prefill-decode disaggregation (a 1P1D [pd] service on GPU subsets of one
simulated host, the real sglang-router in front): plan, apply, a failed decode start that rolls every role and
the router back, status; then the real SGLang 0.5.23 on the test host's CPU: adopt, raise its pool in one
restart, and a change the real server refuses rolls back by itself.

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
from tests import fleethosts, pdhosts, realhost, simhost

DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))


def banner(text: str) -> None:
    print(f"\n\033[1m### {text}\033[0m" if sys.stdout.isatty() else f"\n### {text}", flush=True)


def deployctl(*args: str, expect: ExitCode, env: dict[str, str] | None = None) -> None:
    print("$ deployctl " + " ".join(args), flush=True)
    code = subprocess.run([DEPLOYCTL, *args], env={**os.environ, **(env or {})}, check=False).returncode
    expected(args, code, expect)


def expected(args: tuple[str, ...], code: int, expect: ExitCode) -> None:
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
        # The adopted inventory takes the place of the file the test host was booted from: two inventory
        # files of one unit on one host are refused (docs/topologies.md).
        (sim.units_dir / f"{sim.name}.toml").unlink()
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
        deployctl("plan", HOST, "--context", "400k", expect=ExitCode.NOT_FEASIBLE)
        deployctl(
            "apply",
            HOST,
            "--context",
            "400k",
            "--yes",
            "--force",
            "--allow-longer-context",
            expect=ExitCode.ROLLED_BACK,
        )
        check(sim.unit_text() == good_unit, "the 200k unit is back in place")
        check(pool(sim) == raised, f"the old service is healthy again with its pool of {raised:,}")

        banner("3. the backups, and a manual rollback to the hand-written unit")
        deployctl("backups", HOST, expect=ExitCode.OK)
        deployctl("rollback", HOST, "--to", sim.backups()[0], "--yes", expect=ExitCode.OK)
        check(sim.unit_text() == hand, "the hand-written unit is back, byte for byte")
        check(pool(sim) == base, f"the baseline pool {base:,} is back")
        banner("tearing the test host down")
    fleet_act()
    pd_act()
    real_act()
    print(f"\ndemo passed in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


def fleet_act() -> None:
    """4. Three hosts in one group on Ansible: a failing canary halts the rollout; fixed, it goes through."""
    banner("4. fleet: three hosts in group ct-fleet on Ansible; the canary's new start crashes")
    specs = [fleethosts.HostSpec(f"ct200-{x}", ("ct-fleet",)) for x in "abc"]
    fleet = fleethosts.boot(specs)
    try:
        crash = {"SGLANG_SIM_FAULT": "crash_loading", "SGLANG_SIM_FAULT_WHEN_CONTEXT": "200000"}
        fleet.set_sim_env("ct200-a", crash)
        others = {h: fleet.unit(h) for h in ("ct200-b", "ct200-c")}
        old = fleet.unit("ct200-a")
        args = ("fleet", "apply", "ct-fleet", "--context", "200k", "--batch", "2", "--yes")
        deployctl(*args, expect=ExitCode.ROLLED_BACK, env=fleet.env)
        check(fleet.unit("ct200-a") == old, "the canary rolled back to its old unit")
        check(
            {h: fleet.unit(h) for h in others} == others, "the rollout halted: ct200-b and ct200-c untouched"
        )
        banner("4b. the fault is gone: canary, then the other two as one batch")
        fleet.set_sim_env("ct200-a", {})
        deployctl(*args, expect=ExitCode.OK, env=fleet.env)
        contexts = {parse_unit_flags(fleet.unit(h).decode())["context-length"] for h in fleet.hosts}
        check(contexts == {"200000"}, "every host of ct-fleet runs the 200k unit")
        banner("tearing the three test hosts down")
    finally:
        fleet.stop()


def shown(*args: str, expect: ExitCode, env: dict[str, str]) -> str:
    """`deployctl(...)` whose output (stdout and stderr as one) is also kept, for the checks to read."""
    print("$ deployctl " + " ".join(args), flush=True)
    cmd, full = [DEPLOYCTL, *args], {**os.environ, **env}
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    code = proc.wait()
    expected(args, code, expect)
    return "".join(lines)


def pd_act() -> None:
    """5. A team moves one host to prefill-decode disaggregation: one [pd] file, one command."""
    banner("5. PD: a prefill on GPUs 0-3 and a decode on GPUs 4-7 of one simulated host, a router in front")
    t0 = time.monotonic()
    pd = pdhosts.boot()
    try:
        pd.routed()  # the units the host was booted with (planned at 32,768) serve through the router
        print(f"units/{pdhosts.NAME}.toml, its [pd] part:\n[pd]" + pd.path.read_text().split("\n[pd]")[1])
        pd_apply(pd)
        pd_fail(pd)
        banner("5d. the status of every unit of the service")
        said = shown("status", pdhosts.NAME, expect=ExitCode.OK, env=pd.env)
        check(said.count("active/running") == 3, "prefill, decode and router: active/running")
        check(bool(pd.routed()), "a completion is routed through prefill and decode")
        banner(f"tearing the PD test host down (act 5 took {time.monotonic() - t0:.0f} s)")
    finally:
        pd.stop()


def pd_apply(pd: pdhosts.Pd) -> None:
    banner("5a. plan each role at a 32k context: its pool against what its role must hold, and the trade")
    said = shown("plan", pdhosts.NAME, "--context", "32k", expect=ExitCode.OK, env=pd.env)
    holds = [line for line in said.splitlines() if line.lstrip().startswith(("prefill[0]", "decode[0]"))]
    check(len(holds) == 2 and all(h.endswith(": holds") for h in holds), "each role's pool holds its need")
    check("PD trades first-token time" in said, "the plan ends with the trade")
    banner("5b. apply: the prefill, then the decode, then a completion routed through the router")
    said = shown("apply", pdhosts.NAME, "--context", "32k", "--yes", expect=ExitCode.OK, env=pd.env)
    check(said.index("wave 0: prefill[0]") < said.index("wave 1: decode[0]"), "the prefill before the decode")
    check("routed check" in said, "the change was gated on a routed completion")
    texts = pd.texts()
    check(
        all(b"--context-length 32000" in texts[u] for u in pdhosts.UNITS[:2]), "both roles run the 32k units"
    )
    print(f"routed through the router: {pd.routed()!r}", flush=True)


def pd_fail(pd: pdhosts.Pd) -> None:
    banner("5c. 24k and the router's policy cache_aware: the decode's new start crashes (a simulated fault)")
    before = pd.texts()
    pd.fail_decode_at(24000)
    pd.write(policy="cache_aware")
    said = shown("apply", pdhosts.NAME, "--context", "24k", "--yes", expect=ExitCode.ROLLED_BACK, env=pd.env)
    check("decode[0] failed" in said, "the report names the decode's failed start")
    check(pd.texts() == before, "every role and the router's unit back on its previous text")
    states = {u: pd.show(u, "ActiveState") for u in pdhosts.UNITS}
    check(set(states.values()) == {"active"}, "every unit is running again")
    pd.clear_fault()
    pd.write()  # the file as the service runs again


REAL_SMALL_POOL = 2048  # the hand-written unit's --max-total-tokens: below the tiny model's 4,096 context


def real_act() -> None:
    """6. The real SGLang 0.5.23 (PyPI) serving a tiny random-weight model on this machine's CPU."""
    banner("6. real SGLang 0.5.23 on the test host's CPU, from a unit written by hand")
    t0 = time.monotonic()
    with realhost.booted(pool=REAL_SMALL_POOL) as real:
        print(f"the real server answered /health {real.first_start_s:.0f} s after its start", flush=True)
        print(real.hand.rstrip(), flush=True)
        before = real.pool()
        env = {**os.environ, **real.env}
        host, pin = realhost.NAME, ("--context", "4096", "--yes")  # the planner pins the pool on CPU
        deployctl("adopt", host, "--ssh", host, expect=ExitCode.OK, env=env)
        path = real.units_dir / f"{host}.toml"
        check(
            f"max-total-tokens = {before}" in path.read_text(), f"adopted: the pool cap {before:,} is a flag"
        )

        banner(f"6a. a 4,096-token context on a pool of {before:,}: planned and raised in one restart")
        path.write_text(path.read_text() + "\n[smoke]\nrandom_weights = true  # usage, not words\n")
        first = real.invocation()
        deployctl("apply", host, *pin, expect=ExitCode.OK, env=env)
        raised = real.pool()
        check(raised >= 4096 > before, f"the real server's pool is {raised:,} tokens, as planned")
        restarts = len(real_events(real, "restart"))
        check(real.invocation() != first and restarts == 1, f"{restarts} restart(s) of the service")
        good = real.unit_text()

        banner("6b. a flag SGLang 0.5.23 does not know: refused on the laptop, nothing restarted")
        flags = path.read_text()
        path.write_text(flags.replace("[sglang.flags]\n", "[sglang.flags]\nno-such-flag = true\n"))
        running = real.invocation()
        out = subprocess.run([DEPLOYCTL, "apply", host, *pin], env=env, capture_output=True, text=True)
        print(out.stderr.rstrip(), flush=True)
        check(out.returncode == ExitCode.USAGE, f"deployctl apply exited {out.returncode} (bad input)")
        check(real.invocation() == running and real.unit_text() == good, "nothing changed on the host")
        path.write_text(flags)

        banner("6c. a fraction too small for the weights: SGLang refuses it, the change rolls back by itself")
        small = ("--context", "4096", "--mem-fraction-static", "0.0001", "--yes", "--force")
        out = subprocess.run([DEPLOYCTL, "apply", host, *small], env=env, capture_output=True, text=True)
        print(out.stdout.rstrip(), flush=True)
        check(
            out.returncode == ExitCode.ROLLED_BACK, f"deployctl apply exited {out.returncode} (rolled back)"
        )
        check("Raise --mem-fraction-static above" in out.stdout, "the report quotes SGLang's own error")
        check(real.unit_text() == good, "the raised unit is back in place")
        real.wait_ready()
        check(real.pool() == raised, f"the old real server is healthy again with its pool of {raised:,}")
        banner(f"tearing the real test host down (act 6 took {time.monotonic() - t0:.0f} s)")


def real_events(real: realhost.RealHost, stage: str) -> list[dict[str, dict[str, str]]]:
    found = []
    for path in sorted((real.host.root / "var/lib/deployctl/txn").glob("*/events.jsonl")):
        found += [e for e in map(json.loads, path.read_text().splitlines()) if e.get("stage") == stage]
    return found


if __name__ == "__main__":
    raise SystemExit(main())
