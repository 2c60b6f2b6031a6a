"""deployctl on the real SGLang 0.5.23 (CPU, the tiny model): its own time per restart, and the drain.

Each round restarts the adopted real unit with a streaming request in flight (deployctl waits 1 s, then
SGLang's own SIGTERM drain finishes it). Per round, from the outcome's own figures:
- own_s = wall time of `deployctl apply` - deployctl's drain wait - the restart's downtime: everything
  deployctl does outside the server's stop and start (SSH, facts, plan, render, backup, write, reload,
  commit, report);
- ready_s = the downtime's "ready" phase: from SGLang's own start-up timings line to deployctl's answer
  from /health (SGLang's HTTP start and warm-up request, and deployctl's polling);
- own_in_restart_s = deployctl's own part of the restart beyond the server's own stop and start: from the
  new server's "The server is fired up and ready to roll!" (its journal record's time) to deployctl's
  "the server answers /health" event (the watch reading that line, then one /health answer), less
  health_s, what one /health takes the server itself (0.5.23's /health generates one token and sleeps
  1 s before it answers: srt/entrypoints/http_server.py health_generate), timed on the same server after
  the apply; the stop and the start before are one systemd restart job, with no deployctl step between;
- the drain: requests in flight, finished, cut, seconds.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tests import realhost

TOKENS = 3900  # the streamed request: the tiny model's whole context, 15-45 s of generation here


def _stream(port: int) -> threading.Thread:
    body = {"text": "Once upon a time", "stream": True,
            "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True, "temperature": 0}}  # fmt: skip

    def run() -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode())
        req.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                for _ in r:
                    pass
        except OSError:
            pass  # a cut request: the drain figures say so

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _outcome(stdout: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    last = events[-1] if events else {}
    assert last.get("kind") == "outcome", stdout[-2000:]
    data = last["data"]
    assert isinstance(data, dict)
    return data


def _answered_at(stdout: str) -> float:
    """When deployctl logged that the new server answers /health (epoch seconds)."""
    for line in stdout.splitlines():
        if line.startswith("{") and (e := json.loads(line)).get("message") == "the server answers /health":
            return datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp()
    raise AssertionError("no /health event in the apply's output")


def _fired_up_at(real: realhost.RealHost) -> float:
    """When journald received the running server's "fired up" line (epoch seconds)."""
    argv = ["journalctl", "--no-pager", "-o", "json", f"_SYSTEMD_INVOCATION_ID={real.invocation()}"]
    for line in real.host.ssh(argv).stdout.decode(errors="replace").splitlines():
        record = json.loads(line)
        if "The server is fired up" in str(record.get("MESSAGE")):
            return int(record["__REALTIME_TIMESTAMP"]) / 1e6
    raise AssertionError("no 'fired up' line in the new invocation's journal")


def _health_s(real: realhost.RealHost) -> float:
    """What one /health answer takes the server (median of three)."""
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{real.port}/health", timeout=30):
            pass
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def _round(real: realhost.RealHost, cap: int) -> dict[str, float]:
    thread = _stream(real.port)
    time.sleep(1.0)  # the request is running
    t0 = time.monotonic()
    r = real.deployctl("apply", real.name, "--context", "4096", "--set", f"max-running-requests={cap}",
                       "--yes", "--json")  # fmt: skip
    wall = time.monotonic() - t0
    thread.join(timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    data = _outcome(r.stdout)
    down, drain = data["downtime"], data.get("drain") or {}
    health = _health_s(real)
    return {
        "own_in_restart_s": _answered_at(r.stdout) - _fired_up_at(real) - health,
        "health_s": health,
        "wall_s": wall,
        "own_s": wall - float(drain.get("waited_s") or 0.0) - float(down["seconds"]),
        "ready_s": float(down["phases"].get("ready", 0.0)),
        "downtime_s": float(down["seconds"]),
        "in_flight": float(drain.get("in_flight", 0)),
        "finished": float(drain.get("finished", 0)),
        "cut": float(drain.get("cut", 0)),
        "drain_s": float(drain.get("seconds", 0.0)),
    }


def measure(rounds: int, say: Callable[[str], None]) -> dict[str, Any]:
    why = realhost.missing()
    if why or rounds <= 0:
        say(f"real SGLang: skipped ({why or 'no rounds'})")
        return {}
    say("booting a test host with the real SGLang 0.5.23 on its CPU")
    with realhost.booted() as real:
        real.ensure_hand()
        path = real.adopt()
        path.write_text(path.read_text() + "\n[smoke]\nrandom_weights = true\n\n[drain]\ntimeout_s = 1\n")
        runs = []
        for i in range(rounds):
            runs.append(_round(real, 8 if i % 2 else 16))
            say(
                "real round {}/{}: {}".format(
                    i + 1, rounds, ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items())
                )
            )
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    return {f"real_{k}_median": v for k, v in med.items()} | {"real_rounds": len(runs)}
