"""The two tools under test, run the way a person runs them: deployctl's CLI and ansible-playbook."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench import hostlog
from tests.bench.hostlog import Start
from tests.simhost import SimHost

DEPLOYCTL = str(Path(sys.executable).with_name("deployctl"))
PLAYBOOK_DIR = Path(__file__).resolve().parent / "ansible"
BENCH_VENV = Path(os.environ.get("DEPLOYCTL_BENCH_VENV", "/var/tmp/deployctl-bench-venv"))
# 2.19 is the last line whose controller runs on Python 3.11; its modules support 3.11 targets too.
ANSIBLE_REQ = "ansible-core>=2.17,<2.20"


@dataclass
class Run:
    """One change by one tool, with what the host's journal says about the starts it caused."""

    tool: str
    rc: int
    wall_s: float
    starts: list[Start] = field(default_factory=list)
    gate_ms: list[float] = field(default_factory=list)
    detect_ms: float | None = None
    peak_rss_kib: int | None = None
    output: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # where deployctl's own time goes, seconds

    @property
    def sim_start_s(self) -> float | None:
        return self.starts[0].start_s if self.starts else None

    @property
    def own_s(self) -> float | None:
        sim = self.sim_start_s
        return None if sim is None else self.wall_s - sim


def _ms(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else (later - earlier) * 1000


class Deployctl:
    """The real CLI against the sim host, with a copy of its inventory whose smoke test is off."""

    def __init__(self, sim: SimHost, work: Path) -> None:
        self.sim = sim
        units = work / "units"
        shutil.copytree(sim.units_dir, units, dirs_exist_ok=True)
        toml = units / f"{sim.name}.toml"
        text = re.sub(r"(\[smoke\]\s*\n)enabled = true", r"\1enabled = false", toml.read_text())
        assert "enabled = false" in text, "the inventory has no [smoke] enabled = true to turn off"
        toml.write_text(text)
        self.env = {**os.environ, **sim.env, "DEPLOYCTL_UNITS": str(units)}

    def run(self, *args: str) -> Run:
        before = hostlog.txns(self.sim)
        t0 = time.time()
        proc = subprocess.run(
            [DEPLOYCTL, *args], env=self.env, capture_output=True, text=True, timeout=300, check=False
        )
        run = Run("deployctl", proc.returncode, time.time() - t0, output=proc.stdout + proc.stderr)
        new = sorted(hostlog.txns(self.sim) - before)
        if len(new) != 1:
            raise RuntimeError(f"deployctl {' '.join(args)}: {len(new)} transactions\n{proc.stderr}")
        events = hostlog.events(self.sim, new[0])
        self._analyse(run, events, t0)
        self._phases(run, events, t0)
        return run

    @staticmethod
    def _phases(run: Run, events: list[dict[str, Any]], t0: float) -> None:
        """CLI start to the host's first event, host steps to the restart, the start, and the tail."""
        times = {e["stage"]: hostlog.event_time(e) for e in reversed(events)}  # first of each stage
        first, outcome = hostlog.event_time(events[0]), hostlog.event_time(events[-1])
        end = t0 + run.wall_s
        if "restart" in times and run.starts and run.starts[0].ready_at is not None:
            run.phases = {
                "laptop_before_host": first - t0,
                "host_before_restart": times["restart"] - first,
                "restart_to_ready": run.starts[0].ready_at - times["restart"],
                "ready_to_outcome": outcome - run.starts[0].ready_at,
                "outcome_to_exit": end - outcome,
            }

    def apply(self, context: str, *extra: str) -> Run:
        return self.run("apply", self.sim.name, "--context", context, "--yes", *extra)

    def rollback(self) -> Run:
        return self.run("rollback", self.sim.name, "--yes")

    def _analyse(self, run: Run, events: list[dict[str, Any]], t0: float) -> None:
        """Pair each gate event with the start its restart began; the rollback with the first start."""
        by_id = {s.invocation: s for s in hostlog.starts_since(self.sim, t0)}
        current: Start | None = None
        for e in events:
            if e["stage"] == "restart" and e["kind"] == "step":
                current = by_id.get(str(e["data"].get("invocation")))
                if current is not None:
                    run.starts.append(current)
            elif e["stage"] == "gate" and e["kind"] == "step" and current is not None:
                ms = _ms(hostlog.event_time(e), current.pool_at)
                if ms is not None:
                    run.gate_ms.append(ms)
            elif e["stage"] == "rollback" and run.detect_ms is None and run.starts:
                run.detect_ms = _ms(hostlog.event_time(e), run.starts[0].crash_at)
            elif e["kind"] == "outcome":
                peak = e["data"].get("peak_rss_kib")
                run.peak_rss_kib = int(peak) if peak is not None else None


def ensure_ansible(log: Any = print) -> Path:
    """ansible-playbook from the bench's own virtualenv, created on first use."""
    playbook = BENCH_VENV / "bin" / "ansible-playbook"
    if not playbook.exists():
        log(f"installing {ANSIBLE_REQ} into {BENCH_VENV} (once)")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(BENCH_VENV)], check=True)
        pip = [str(BENCH_VENV / "bin" / "pip"), "install", "-q", ANSIBLE_REQ]
        subprocess.run(pip, check=True, timeout=600)
    return playbook


class Ansible:
    """ansible-playbook apply.yml against the sim host's sshd, with its key and known_hosts."""

    def __init__(self, sim: SimHost, work: Path, port: int, delay_s: float, retries: int) -> None:
        self.sim = sim
        self.work = work
        self.port = port
        self.delay_s, self.retries = delay_s, retries
        self.playbook = ensure_ansible()
        host = sim.host
        ssh_args = f"-o UserKnownHostsFile={host.known_hosts_path} -o IdentitiesOnly=yes"
        self.inventory = work / "ansible-inventory.ini"
        self.inventory.write_text(
            "[sglang]\n"
            f"{sim.name} ansible_host=127.0.0.1 ansible_port={host.ssh_port} ansible_user=root "
            f"ansible_ssh_private_key_file={host.ssh_key_path} "
            f"ansible_python_interpreter=/usr/bin/python3 ansible_ssh_common_args='{ssh_args}'\n"
        )
        home = work / "ansible-home"
        home.mkdir(exist_ok=True)
        self.times = work / "ansible-times.jsonl"
        self.env = {
            **os.environ,
            "ANSIBLE_HOME": str(home),
            "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(home / "cp"),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_PIPELINING": "True",  # the usual speed-up, in Ansible's favour
            "ANSIBLE_CALLBACK_PLUGINS": str(PLAYBOOK_DIR / "callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "bench_times",
            "ANSIBLE_NOCOLOR": "1",
            "DEPLOYCTL_BENCH_TIMES": str(self.times),
        }

    def play(self, context_length: int, fraction: str, max_running: int, target: int) -> Run:
        extra = {
            "context_length": context_length,
            "mem_fraction_static": fraction,
            "max_running_requests": max_running,
            "target_context": target,
            "sglang_port": self.port,
            "pool_retries": self.retries,
            "pool_delay": self.delay_s,
        }
        vars_file = self.work / "ansible-vars.json"
        vars_file.write_text(json.dumps(extra))
        self.times.write_text("")
        argv = [str(self.playbook), "-i", str(self.inventory), str(PLAYBOOK_DIR / "apply.yml")]
        argv += ["-e", f"@{vars_file}"]
        t0 = time.time()
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=600, check=False)
        run = Run("ansible", proc.returncode, time.time() - t0, output=proc.stdout + proc.stderr)
        if proc.returncode not in (0, 2):
            raise RuntimeError(f"ansible-playbook exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        self._analyse(run, t0)
        return run

    def _analyse(self, run: Run, t0: float) -> None:
        marks = [json.loads(line) for line in self.times.read_text().splitlines() if line.strip()]
        run.starts = [s for s in hostlog.starts_since(self.sim, t0) if s.launched]
        if not run.starts:
            return
        new = run.starts[0]
        pool_ok = next((m["t"] for m in marks if m["kind"] == "ok" and "KV pool" in m["task"]), None)
        ms = _ms(pool_ok, new.pool_at)
        if ms is not None:
            run.gate_ms.append(ms)
        rescue = next((m["t"] for m in marks if m["kind"] == "start" and "Restore" in m["task"]), None)
        run.detect_ms = _ms(rescue, new.crash_at)
