"""SGLang's weight-cache daemon as deployctl runs it: fingerprint, restart class, refusals, the units, and
the pool with resident weights (agent/sglang/weight_cache.py, agent/weight_cache_unit.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.host.roles import weight_cache as hwc
from agent.inventory import HostConfig, load_host
from agent.plan.restart_time import WEIGHT_CACHE_LOAD_S
from agent.plan.weight_cache_unit import daemon_unit_name, refusal, render_daemon_unit
from agent.render import render_unit, template_dir
from agent.sglang import kvpool
from agent.sglang import weight_cache as wc
from agent.sglang.flags import parse_unit_flags
from agent.verify import verify_unit

REPO = Path(__file__).resolve().parents[2]
BASE = {"model-path": "/models/q", "tp-size": 8, "mem-fraction-static": 0.85, "context-length": 32768,
        "max-running-requests": 64, "chunked-prefill-size": 8192}  # fmt: skip
RESIZE = ("mem-fraction-static", "context-length", "max-running-requests", "chunked-prefill-size")


def on(fp: dict[str, object], version: str = "0.5.23") -> wc.Fingerprint:
    return wc.fingerprint(fp, version)


@pytest.mark.parametrize("name", RESIZE)
def test_a_resize_keeps_the_fingerprint_and_restarts_only_the_engine(name: str) -> None:
    changed = {**BASE, name: 12345}
    assert wc.restart_class(on(BASE), on(changed), enabled=True) == (wc.RestartClass.ENGINE, [])


@pytest.mark.parametrize("name", wc.FINGERPRINT_FLAGS)
def test_every_fingerprint_field_restarts_both_and_is_named(name: str) -> None:
    klass, why = wc.restart_class(on(BASE), on({**BASE, name: "other"}), enabled=True)
    assert klass is wc.RestartClass.BOTH and why == [name]


def test_an_sglang_upgrade_restarts_both_and_no_daemon_yet_too() -> None:
    assert wc.restart_class(on(BASE), on(BASE, "0.5.24"), True) == (wc.RestartClass.BOTH, ["sglang-version"])
    assert wc.restart_class(None, on(BASE), True)[0] is wc.RestartClass.BOTH
    assert wc.restart_class(on(BASE), on(BASE), False)[0] is wc.RestartClass.NO_CACHE


def test_an_alias_spelling_is_the_same_fingerprint() -> None:
    alias = {k: v for k, v in BASE.items() if k != "tp-size"} | {"tensor-parallel-size": 8}
    assert on(alias) == on(BASE)


@pytest.mark.parametrize(
    ("flags", "quant", "device", "private", "needle"),
    [
        ({"speculative-algorithm": "EAGLE3"}, ("", False), "cuda", False, "model_path_hook.py"),
        ({}, ("gptq", False), "cuda", False, "IPC_QUANT_ALLOWLIST"),
        ({}, ("fp8", False), "cuda", False, "IPC_QUANT_ALLOWLIST"),  # per-tensor FP8
        ({"quantization": "awq"}, ("", False), "cuda", False, "'awq'"),
        ({}, ("", False), "cpu", False, "is_cuda_alike"),
        ({}, ("", False), "cuda", True, "PrivateTmp="),
    ],
)
def test_each_refusal_cites_sglang(
    flags: dict[str, object], quant: tuple[str, bool], device: str, private: bool, needle: str
) -> None:
    (said,) = wc.refusals(flags, quant[0], quant[1], device, private)
    assert needle in said


@pytest.mark.parametrize(
    ("quant", "device"), [(("", False), "cuda"), (("fp8", True), "cuda"), (("", False), "rocm")]
)
def test_what_sglang_can_share_is_not_refused(quant: tuple[str, bool], device: str) -> None:
    assert wc.refusals({}, quant[0], quant[1], device, False) == []


def test_the_templates_keep_the_device_uuid_sglang_requires() -> None:
    for value in wc.templates("/run/x").values():
        assert "{device_uuid}" in value and value.startswith("/run/x/")


@given(st.floats(60, 140), st.floats(1, 50), st.floats(0.5, 0.95), st.floats(1e4, 1e6))
def test_the_pool_with_resident_weights_is_the_pool_without(
    free_gib: float, weights_gib: float, fraction: float, cell: float
) -> None:
    """model_runner.py account_preloaded_weights (PR#34053): the daemon's weights are added back."""
    post = free_gib - weights_gib  # either way the weights occupy the GPU after the load
    alone = kvpool.pool_tokens(free_gib, post, fraction, cell, kvpool.Paging(1, None))
    sampled = free_gib - weights_gib  # dist-init saw the daemon's weights already taken
    pre = wc.pre_model_load_gib(sampled, int(weights_gib * (1 << 30)))
    assert abs(kvpool.pool_tokens(pre, post, fraction, cell, kvpool.Paging(1, None)) - alone) <= 1


def sim_host(enabled: bool = True) -> HostConfig:
    host = load_host("ct200", REPO / "units")
    return host.model_copy(
        update={"draft": None, "weight_cache": host.weight_cache.model_copy(update={"enabled": enabled})}
    )


def test_the_engine_unit_is_a_client_bound_to_its_daemon() -> None:
    text = render_unit(sim_host(), {}, template_dir())
    daemon = daemon_unit_name("sglang.service")
    assert daemon == "sglang-weight-cache.service"
    socket = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=/run/sglang-weight-cache/"
    ties = (f"Requires={daemon}", f"After={daemon}", f"PartOf={daemon}")
    for line in (*ties, "--weight-cache-mode client", "--weight-cache-timeout 1800", socket):
        assert line in text, line


def test_off_renders_the_same_bytes_as_before() -> None:
    text = render_unit(sim_host(False), {}, template_dir())
    assert "weight-cache" not in text and "weight_cache" not in text.lower()


def test_the_daemon_unit_names_nothing_of_the_engine_but_its_order() -> None:
    host = sim_host()
    text = render_daemon_unit(host, {**BASE, "mem-fraction-static": 0.9}, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "Before=sglang.service" in text and not re.search(r"^(PartOf|BindsTo|Requires)=", text, re.M)
    assert "-m sglang.srt.weight_cache.daemon" in text and "--tp-size 8" in text
    assert "mem-fraction" not in text and "context-length" not in text  # a re-size keeps it running
    assert "RuntimeDirectory=sglang-weight-cache" in text and "CUDA_VISIBLE_DEVICES=0,1" in text
    assert "User=sglang" in text
    said = verify_unit(text, "sglang-weight-cache.service")
    assert said is None, said


def test_a_speculative_service_is_refused_before_anything_changes() -> None:
    host = load_host("ct200", REPO / "units")  # DFLASH draft
    host = host.model_copy(update={"weight_cache": host.weight_cache.model_copy(update={"enabled": True})})
    said = refusal(host, {}, ("", False), "cuda")
    assert said is not None and "speculative decoding" in said and "nothing was changed" in said
    assert refusal(sim_host(), {}, ("", False), "cuda") is None  # no draft: accepted


def test_the_plan_says_the_restart_class_with_both_times() -> None:
    from agent.apply import restart_for
    from agent.protocol import HostFacts

    host = sim_host()
    phases = {"stop": 2.0, "init": 17.0, "weights": 300.0, "pool": 0.5, "cuda_graphs": 35.0, "ready": 25.0}
    running = render_unit(host, {}, template_dir())
    facts: HostFacts = {"unit_text": running, "history": [{"downtime": {"seconds": 380.0, "phases": phases}}]}  # type: ignore[typeddict-item]
    resize = render_unit(host, {"mem-fraction-static": 0.9}, template_dir())
    kept = restart_for(host, facts, resize, {})
    assert "restarts only the engine" in kept.notes[0] and kept.parts["weights"] == WEIGHT_CACHE_LOAD_S
    retp = render_unit(host, {"tp-size": 4}, template_dir())
    both = restart_for(host, facts, retp, {})
    assert (
        "restarts the weight-cache daemon and the engine: its fingerprint changed (tp-size)" in both.notes[0]
    )
    assert both.parts["daemon"] == 300.0 and both.seconds is not None and kept.seconds is not None
    assert both.seconds - kept.seconds == 300.0
    first = restart_for(
        host, {**facts, "unit_text": render_unit(sim_host(False), {}, template_dir())}, resize, {}
    )
    assert first.notes[0].startswith(
        "starts the weight-cache daemon and restarts the engine: no daemon runs yet"
    )
    assert (
        "changed its fingerprint" not in first.notes[0]
    )  # was: "no daemon runs yet changed its fingerprint"


def _seen(text: str | None, state: str = "active", alive: bool = True, ranks: int = 8) -> hwc.DaemonSeen:
    """ct200's daemon: TP 8, one ready file per rank."""
    ready = tuple(hwc.Ready(f"/run/x/GPU-{i}.ready", 42, alive) for i in range(ranks))
    return hwc.DaemonSeen(DAEMON, text, state, ready)


@given(st.integers(min_value=0, max_value=7))
def test_a_daemon_is_ready_only_with_every_ranks_ready_file(ready: int) -> None:
    host = sim_host()
    engine = render_unit(host, {}, template_dir())
    daemon = render_daemon_unit(host, parse_unit_flags(engine), {})
    said = hwc.verdict(parse_unit_flags(engine), _seen(daemon, ranks=ready))
    assert said is not None and f"{ready} of its 8 ready files" in said


DAEMON = "sglang-weight-cache.service"


def test_a_live_daemon_with_the_same_fingerprint_lets_a_resize_restart() -> None:
    host = sim_host()
    engine = render_unit(host, {"mem-fraction-static": 0.9}, template_dir())
    assert (
        hwc.daemon_unit("sglang.service", engine) == DAEMON
        and hwc.ready_dir(engine) == "/run/sglang-weight-cache"
    )
    daemon = render_daemon_unit(host, parse_unit_flags(render_unit(host, {}, template_dir())), {})
    assert hwc.verdict(parse_unit_flags(engine), _seen(daemon)) is None


@pytest.mark.parametrize(
    ("state", "alive", "installed", "needle"),
    [
        ("failed", True, True, "is failed: the daemon that holds the weights is not running"),
        ("active", False, True, "a dead PID"),
        ("active", True, False, "is not installed"),
    ],
)
def test_a_dead_or_missing_daemon_is_found_before_the_engine_restart(
    state: str, alive: bool, installed: bool, needle: str
) -> None:
    host = sim_host()
    engine = render_unit(host, {}, template_dir())
    daemon = render_daemon_unit(host, parse_unit_flags(engine), {}) if installed else None
    said = hwc.verdict(parse_unit_flags(engine), _seen(daemon, state, alive))
    assert said is not None and needle in said


def test_a_daemon_holding_another_fingerprint_is_found_before_the_engine_restart() -> None:
    host = sim_host()
    daemon = render_daemon_unit(host, parse_unit_flags(render_unit(host, {}, template_dir())), {})
    engine = render_unit(host, {"tp-size": 4}, template_dir())
    said = hwc.verdict(parse_unit_flags(engine), _seen(daemon))
    assert said is not None and "holds another fingerprint (tp-size differ)" in said


def test_an_engine_not_in_client_mode_has_no_daemon_to_check() -> None:
    assert hwc.daemon_unit("sglang.service", render_unit(sim_host(False), {}, template_dir())) is None


def test_ready_files_are_read_with_their_pids(tmp_path: Path) -> None:
    import os

    (tmp_path / "GPU-a.ready").write_text(str(os.getpid()))
    (tmp_path / "GPU-b.ready").write_text("not a pid")
    seen = hwc.look(str(tmp_path), DAEMON, "active", str(tmp_path))
    assert seen.text is None and [r.alive for r in seen.ready] == [True, False]


@pytest.mark.parametrize(
    ("executable", "python"),
    [
        (["/usr/bin/python3", "-m", "sglang.launch_server"], "/usr/bin/python3"),
        (
            ["/opt/venv/bin/python3.11", "/opt/launch.py"],
            "/opt/venv/bin/python3.11",
        ),  # was /opt/venv/bin/python
        (["/opt/venv/bin/sglang", "serve"], "/opt/venv/bin/python"),
    ],
)
def test_the_daemon_runs_under_the_engines_interpreter(executable: list[str], python: str) -> None:
    from agent.plan.weight_cache_unit import python_of

    assert python_of(executable) == python


def test_apply_sends_the_daemons_unit_and_the_host_finds_the_pair_compatible() -> None:
    """[weight_cache]: the laptop sends the daemon's unit with the engine's (agent/apply.py); the host's
    check of the pair (agent/host/roles/daemon.py) accepts what the laptop renders, for any re-size."""
    from agent.apply import daemon_text
    from agent.host.roles.daemon import mismatch

    for fraction in (0.8, 0.9, 0.95):
        engine = render_unit(sim_host(), {"mem-fraction-static": fraction}, template_dir())
        sent = daemon_text(sim_host(), engine)
        assert sent is not None and "-m sglang.srt.weight_cache.daemon" in sent
        assert mismatch(engine, sent) is None
    assert daemon_text(sim_host(False), render_unit(sim_host(False), {}, template_dir())) is None


def test_an_adopted_hgx_unit_keeps_its_fabric_manager_and_names_its_daemon_once() -> None:
    """The adopted template renders the verbatim [Unit] lines first; the host still finds the daemon by its
    one name, never the fabric manager the unit binds to."""
    host = sim_host()
    fabric = ["BindsTo=nvidia-fabricmanager.service", "After=nvidia-fabricmanager.service"]
    unit = host.unit.model_copy(
        update={"template": "sglang-adopted.service.j2", "verbatim": {"Unit": fabric}}
    )
    text = render_unit(host.model_copy(update={"unit": unit}), {}, template_dir())
    assert text.index("BindsTo=nvidia-fabricmanager.service") < text.index(f"Requires={DAEMON}")
    assert hwc.daemon_unit("sglang.service", text) == DAEMON
    assert hwc.untied("sglang.service", text) is None
    assert hwc.daemon_unit("other.service", text) is None  # another engine's daemon is not this one's


def test_the_daemon_takes_the_engines_host_dependencies_limits_and_environment() -> None:
    """The daemon loads the same weights onto the same GPUs: the fabric manager the engine waits for, its
    HF_HOME and gated-model token, its open-files limit; never the engine's own ties to the daemon."""
    from agent.apply import daemon_text

    host = sim_host()
    unit = host.unit.model_copy(
        update={
            "environment": {**host.unit.environment, "HF_HOME": "/var/cache/hf"},
            "secret_environment_on_host": ["HF_TOKEN"],
            "template": "sglang-adopted.service.j2",
            "verbatim": {
                "Unit": [
                    "After=network-online.target nvidia-fabricmanager.service",
                    "BindsTo=nvidia-fabricmanager.service",
                    f"Wants={daemon_unit_name(host.unit.name)}",
                ],
                "Service": ["ExecStartPre=/bin/true", "Nice=-5", "LimitNOFILE=65536"],
            },
        }
    )
    host = host.model_copy(update={"unit": unit})
    engine = render_unit(host, {}, template_dir())
    daemon = daemon_text(host, engine)
    assert daemon is not None
    for line in (
        "After=network-online.target nvidia-fabricmanager.service",
        "BindsTo=nvidia-fabricmanager.service",
        'Environment="HF_HOME=/var/cache/hf"',
        "LimitNOFILE=65536",
        "LimitMEMLOCK=infinity",
    ):
        assert re.search(f"^{re.escape(line)}$", daemon, re.M), line
    env_file = re.search(r"^EnvironmentFile=.*$", engine, re.M)
    assert env_file is not None and env_file.group(0) in daemon.splitlines()  # HF_TOKEN: the same file
    assert "ExecStartPre" not in daemon and "Nice=" not in daemon  # the engine's own, not the host's
    assert not re.search(r"^Wants=", daemon, re.M)  # the engine's tie to the daemon is not the daemon's
    said = verify_unit(daemon, daemon_unit_name(host.unit.name))
    assert said is None, said
