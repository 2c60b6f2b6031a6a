"""systemd's and the kernel's lines about SGLang's service ending: a start they end is failed (or stopped),
never "cut"; lines about another unit or another process end nothing of SGLang's."""

from __future__ import annotations

from agent.sglang.logs import events as ev
from agent.sglang.logs.fixes import fix_for
from agent.sglang.logs.starts import split

ARGS = "[2026-11-20 08:00:01] server_args=ServerArgs(model_path='/m', mem_fraction_static=0.83, tp_size=1)"
LOADING = "[2026-11-20 08:00:04 TP0] Load weight begin. avail mem=78.58 GB"
READY = "[2026-11-20 08:01:00] The server is fired up and ready to roll!"


def at(who: str, text: str) -> str:
    return f"Nov 20 08:00:30 gpu1 {who}: {text}"


def loading(main: int = 1234, child: int = 1240, unit: str = "sglang.service") -> list[str]:
    return [
        at("systemd[1]", f"Starting {unit} - SGLang server..."),
        at(f"python3[{main}]", ARGS),
        at(f"python3[{child}]", LOADING),
    ]


def outcomes(lines: list[str], unit: str | None = None) -> list[tuple[str, str | None]]:
    return [(s.outcome, s.summary.failure and s.summary.failure.failure_kind) for s in split(lines, unit)]


def test_a_memory_cgroup_kill_of_a_scheduler_fails_the_start_with_the_cgroup_fix() -> None:
    kill = "Memory cgroup out of memory: Killed process 1240 (sglang::schedul) total-vm:120000000kB"
    lines = [
        *loading(),
        at("kernel", kill),
        at("systemd[1]", "sglang.service: Main process exited, code=killed, status=9/KILL"),
    ]
    [start] = split(lines)
    assert (start.outcome, start.summary.failure and start.summary.failure.line) == ("failed", kill)
    assert "MemoryMax=" in (fix_for(ev.HOST_OOM_KILLED, kill) or "")


def test_the_kernel_killing_another_process_ends_nothing() -> None:
    lines = [*loading(), at("kernel", "Out of memory: Killed process 999 (java) total-vm:1000kB")]
    assert outcomes(lines) == [("cut", None)]


def test_a_stop_while_the_weights_load_is_a_stop_not_a_failure() -> None:
    """SGLang installs its SIGTERM handler once serving (managers/tokenizer_manager.py:2455): a stop while
    the weights load says nothing of its own; systemd's Stopping line says it was asked for."""
    lines = [
        *loading(),
        at("systemd[1]", "Stopping sglang.service - SGLang server..."),
        at("systemd[1]", "sglang.service: Main process exited, code=killed, status=15/TERM"),
    ]
    assert outcomes(lines) == [("stopped", None)]


def test_another_units_exit_is_not_sglangs() -> None:
    lines = [
        *loading(),
        at("systemd[1]", "sglang-weight-cache.service: Main process exited, code=exited, status=1/FAILURE"),
    ]
    assert outcomes(lines) == [("cut", None)]
    router = [
        *loading(),
        at("systemd[1]", "sglang-router.service: Main process exited, code=exited, status=1/FAILURE"),
    ]
    assert outcomes(router) == [("cut", None)]  # a PD router's unit (agent/pd/units.py) is not SGLang's
    named = [
        *loading(unit="llm.service"),
        at("systemd[1]", "llm.service: Main process exited, code=exited, status=1/FAILURE"),
    ]
    assert outcomes(named, "llm") == [("failed", ev.PROCESS_EXITED)]


def test_a_units_exit_fails_its_own_server_of_two() -> None:
    """Two units in one journal: systemd names the unit, not a process; the line goes to the server that
    unit's Start line opened, not to the one that logged last."""
    lines = [
        *loading(100, 101, "sglang-a.service"),
        *loading(200, 201, "sglang-b.service"),
        at("python3[100]", READY),
        at("systemd[1]", "sglang-b.service: Main process exited, code=exited, status=1/FAILURE"),
    ]
    assert sorted(outcomes(lines)) == [("failed", ev.PROCESS_EXITED), ("ready", None)]
    by_line = {s.first_line: s.outcome for s in split(lines)}
    assert by_line == {1: "ready", 4: "failed"}
