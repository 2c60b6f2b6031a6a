"""make bench: deployctl against Ansible and the manual path on the simulated ct200; ends with one JSON line.

Every figure comes from the test host's own records: the journal's timestamps of SGLang's lines,
deployctl's events, and Ansible's task times. Counts: --rounds, --gate-starts, --failures (or
DEPLOYCTL_BENCH_ROUNDS, _GATE_STARTS, _FAILURES). The bench never fails a build; it measures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.sglang.flags import parse_unit_flags
from tests import simhost
from tests.bench import fleet, parse_bench, real, restart, restarts, weight_cache
from tests.bench.tools import Ansible, Deployctl, Run
from tests.integration.conftest import wait_pool

FAIL_FRACTION = "0.70"  # the weights alone take more: SGLang dies at once ("no memory for the KV cache")


def median(values: Iterable[float | int | None]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return statistics.median(xs) if xs else None


def say(text: str) -> None:
    print(text, flush=True)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(f"DEPLOYCTL_BENCH_{name}", default))


def args_() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    ap.add_argument("--rounds", type=int, default=_env_int("ROUNDS", 5), help="timed changes per tool")
    ap.add_argument("--gate-starts", type=int, default=_env_int("GATE_STARTS", 20))
    ap.add_argument("--failures", type=int, default=_env_int("FAILURES", 3), help="crashing changes per tool")
    ap.add_argument("--ansible-delay", type=float, default=1.0, help="seconds between journal polls")
    ap.add_argument("--ansible-retries", type=int, default=30)
    ap.add_argument("--parse-lines", type=int, default=300_000)
    ap.add_argument("--downtime-rounds", type=int, default=_env_int("DOWNTIME_ROUNDS", 3))
    ap.add_argument("--fleet-hosts", type=int, default=_env_int("FLEET_HOSTS", 16), help="0 skips the fleet")
    ap.add_argument("--real-rounds", type=int, default=_env_int("REAL_ROUNDS", 3), help="0 skips real SGLang")
    return ap.parse_args()


def check(run: Run, want: int, what: str) -> Run:
    if run.rc != want:
        raise SystemExit(f"bench: {run.tool} {what} exited {run.rc}, expected {want}\n{run.output[-4000:]}")
    return run


def compare(sim: simhost.SimHost, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Timed changes, gate latency and failure detection, both tools on the same host, interleaved."""
    dc = Deployctl(sim, work)
    base = parse_unit_flags(sim.unit_text())
    port = int(base["port"])
    say("warm-up: deployctl apply --context 200k, then rollback (not timed)")
    warm = [check(dc.apply("200k"), 0, "apply")]
    new_unit = parse_unit_flags(sim.unit_text())
    warm.append(check(dc.rollback(), 0, "rollback"))
    an = Ansible(sim, work, port, a.ansible_delay, a.ansible_retries)
    forward = (200_000, new_unit["mem-fraction-static"], int(new_unit["max-running-requests"]), 200_000)
    back = (int(base["context-length"]), base["mem-fraction-static"], int(base["max-running-requests"]), 0)
    say(f"ansible: the same change (fraction {forward[1]}, {forward[2]} requests); warm-up run")
    check(an.play(*forward), 0, "play")
    check(an.play(*back), 0, "play back")
    dc_runs: list[Run] = []
    an_runs: list[Run] = []
    dc_gate: list[float] = [ms for r in warm for ms in r.gate_ms]
    an_gate: list[float] = []
    for i in range(a.rounds):
        r = check(dc.apply("200k"), 0, "apply")
        dc_runs.append(r)
        dc_gate += r.gate_ms + check(dc.rollback(), 0, "rollback").gate_ms
        r = check(an.play(*forward), 0, "play")
        an_runs.append(r)
        an_gate += r.gate_ms + check(an.play(*back), 0, "play back").gate_ms
        say(f"round {i + 1}/{a.rounds}: deployctl {dc_runs[-1].wall_s:.2f} s, ansible {r.wall_s:.2f} s wall")
    while len(dc_gate) < a.gate_starts:
        dc_gate += check(dc.apply("200k"), 0, "apply").gate_ms + check(dc.rollback(), 0, "rollback").gate_ms
    say(f"failures: the new unit has --mem-fraction-static {FAIL_FRACTION} and dies while sizing the pool")
    dc_fail: list[Run] = []
    an_fail: list[Run] = []
    for _ in range(a.failures):
        dc_fail.append(check(dc.apply("200k", "--mem-fraction-static", FAIL_FRACTION, "--force"), 4, "apply"))
        dc_gate += dc_fail[-1].gate_ms  # the restored old unit's start passes its gate too
        an_fail.append(check(an.play(200_000, FAIL_FRACTION, forward[2], 200_000), 2, "play"))
    say("a chatty start (SGLANG_SIM_FAULT=garbage): the agent's peak memory")
    wait_pool(sim)  # Ansible's rescue restarts without waiting: let that start finish, as an operator would
    sim.set_sim_env({"SGLANG_SIM_FAULT": "garbage"})
    chatty = check(dc.apply("200k"), 0, "apply")
    sim.set_sim_env({})
    check(dc.rollback(), 0, "rollback")
    return {
        "dc": dc_runs, "an": an_runs, "dc_gate": dc_gate, "an_gate": an_gate,
        "dc_fail": dc_fail, "an_fail": an_fail, "chatty": chatty,
    }  # fmt: skip


def restart_counts(sim: simhost.SimHost, runs: list[Run]) -> dict[str, Any]:
    """deployctl's restarts per 200k change (measured), and the two manual paths replayed on the sim."""
    base = sim.host.read(restarts.UNIT_PATH).decode()
    say("manual paths: edit the unit and restart by hand, as in the seed and as SGLang's hint says")
    seed, seed_tries = restarts.count(sim, base, restarts.seed_path())
    advice, advice_tries = restarts.count(sim, base, restarts.advice_path())
    for name, tries in (("seed", seed_tries), ("+0.01", advice_tries)):
        for t in tries:
            say(f"  {name:6} {' '.join(f'--{k} {v}' for k, v in t.flags.items()):70} {t.pool} {t.result}")
    return {
        "deployctl": median(len(r.starts) for r in runs),
        "seed": seed,
        "advice": advice,
        "advice_last": advice_tries[-1].flags.get("mem-fraction-static") if advice_tries else None,
    }


def parser_rate(lines: int) -> float:
    """SummaryBuilder.feed (what the watcher runs per journal line) over parse_bench's journal."""
    journal = parse_bench.journal(lines)
    return statistics.median(parse_bench._run(journal, True) for _ in range(3))


def fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def figures(c: dict[str, Any], r: dict[str, Any], rate: float) -> dict[str, Any]:
    dc_own = median(x.own_s for x in c["dc"])
    an_own = median(x.own_s for x in c["an"])
    normal_rss = median(x.peak_rss_kib for x in c["dc"])
    phases = {k: median(x.phases.get(k) for x in c["dc"]) for k in c["dc"][0].phases} if c["dc"] else {}
    return {
        "deployctl_phases_s_median": {k: round(v, 3) for k, v in phases.items() if v is not None},
        "overhead_ratio_vs_ansible": round(dc_own / an_own, 3) if dc_own and an_own else None,
        "own_overhead_s": dc_own,  # wall time of one change less the simulated server's own start
        "ansible_own_s_median": an_own,
        "deployctl_wall_s_median": median(x.wall_s for x in c["dc"]),
        "ansible_wall_s_median": median(x.wall_s for x in c["an"]),
        "sim_start_s_median": median(x.sim_start_s for x in c["dc"] + c["an"]),
        "gate_latency_ms_median": median(c["dc_gate"]),
        "gate_latency_ms_p90": _p90(c["dc_gate"]),
        "gate_starts": len(c["dc_gate"]),
        "ansible_gate_latency_ms_median": median(c["an_gate"]),
        "ansible_gate_starts": len(c["an_gate"]),
        "failure_detect_ms_median": median(x.detect_ms for x in c["dc_fail"]),
        "ansible_failure_detect_ms_median": median(x.detect_ms for x in c["an_fail"]),
        "restarts_to_200k": r["deployctl"],
        "restarts_manual_seed": r["seed"],
        "restarts_sglang_advice": r["advice"],
        "sglang_advice_last_fraction": r["advice_last"],
        "parse_lines_per_s": round(rate),
        "agent_peak_rss_kib": normal_rss,
        "agent_peak_rss_kib_chatty": c["chatty"].peak_rss_kib,
        "rounds": len(c["dc"]),
        "failures": len(c["dc_fail"]),
    }


def _p90(xs: list[float]) -> float | None:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) >= 2 else None


def table(f: dict[str, Any], a: argparse.Namespace) -> None:
    rows = [
        ("own time per change (wall - sim start)", fmt(f["own_overhead_s"], " s", 2),
         fmt(f["ansible_own_s_median"], " s", 2), "ratio " + fmt(f["overhead_ratio_vs_ansible"], "", 3)),
        ("wall time per change", fmt(f["deployctl_wall_s_median"], " s", 2),
         fmt(f["ansible_wall_s_median"], " s", 2), "sim start " + fmt(f["sim_start_s_median"], " s", 2)),
        ("pool line in journal -> verdict", fmt(f["gate_latency_ms_median"], " ms", 1),
         fmt(f["ansible_gate_latency_ms_median"], " ms", 1),
         f"{f['gate_starts']} / {f['ansible_gate_starts']} starts"),
        ("crash -> rollback starts", fmt(f["failure_detect_ms_median"], " ms", 0),
         fmt(f["ansible_failure_detect_ms_median"], " ms", 0), f"{f['failures']} crashes each"),
        ("restarts to a 200k pool", fmt(f["restarts_to_200k"]), "-",
         f"seed by hand {f['restarts_manual_seed']}, +0.01/restart {f['restarts_sglang_advice']}"),
        ("parser (SummaryBuilder.feed)", fmt(f["parse_lines_per_s"], " lines/s"), "-", ""),
        ("agent peak RSS: normal / chatty start", fmt(f["agent_peak_rss_kib"], " KiB"), "-",
         "chatty " + fmt(f["agent_peak_rss_kib_chatty"], " KiB")),
    ]  # fmt: skip
    say(
        "\ndeployctl's time per change, medians: "
        + ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in f["deployctl_phases_s_median"].items())
    )
    if f.get("real_rounds"):
        say(
            f"\nreal SGLang 0.5.23 (CPU), medians of {f['real_rounds']} restarts with a request in flight: "
            f"deployctl's own time {f['real_own_s_median']:.2f} s beyond the downtime and its drain wait, "
            f"{f['real_own_in_restart_s_median']:.3f} s in the restart beyond the server's own start "
            f"(its 'fired up' line -> deployctl's /health answer, less the {f['real_health_s_median']:.2f} s "
            "its /health itself takes); "
            f"server ready -> /health answered {f['real_ready_s_median']:.2f} s; downtime "
            f"{f['real_downtime_s_median']:.1f} s; drain {f['real_in_flight_median']:.0f} in flight, "
            f"{f['real_finished_median']:.0f} finished, {f['real_cut_median']:.0f} cut, "
            f"{f['real_drain_s_median']:.1f} s"
        )
    say(f"\n{'':42} {'deployctl':>12} {'ansible':>12}  notes")
    for name, dc, an, note in rows:
        say(f"{name:42} {dc:>12} {an:>12}  {note}")
    say(
        f"\nmedians over {f['rounds']} timed changes per tool, interleaved; smoke test off for deployctl "
        f"(the play has none); Ansible polls the journal every {a.ansible_delay:g} s with pipelining on"
    )


def main() -> int:
    a = args_()
    t0 = time.monotonic()
    say("booting the local test host with the simulated ct200 at its baseline")
    with tempfile.TemporaryDirectory(prefix="deployctl-bench-") as tmp:
        with simhost.booted() as sim:
            wait_pool(sim)
            compared = compare(sim, a, Path(tmp))
            counted = restart_counts(sim, compared["dc"])
        say("booting a test host whose simulated weights are big enough to dominate a restart")
        downtime = restart.measure(a.downtime_rounds, Path(tmp), say)
    say("a re-size start with the weight-cache daemon holding the weights, against loading them")
    downtime |= weight_cache.measure(a.downtime_rounds, say)
    fleet_figures = fleet.measure(a.fleet_hosts, say=say) if a.fleet_hosts else {}
    real_figures = real.measure(a.real_rounds, say)
    say("parser throughput")
    f = figures(compared, counted, parser_rate(a.parse_lines)) | downtime | fleet_figures | real_figures
    table(f, a)
    f["date"] = datetime.date.today().isoformat()
    f["machine"] = f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    f["bench_seconds"] = round(time.monotonic() - t0)
    print(json.dumps(f, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
