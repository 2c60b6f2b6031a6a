"""The host transaction's decisions with fake systemd, journal and probe: one fault, one fast test."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.change import write
from agent.host.change.transaction import Result
from agent.host.state import StateDir
from agent.protocol.common import unit_sha256 as sha256
from agent.protocol.events import Outcome
from tests.pure.txnfakes import OOM_LINE, READY_LINE, UNIT, Host, Script, kv_line, unit_text

OLD, NEW, TOO_BIG = 100_000, 200_000, 400_000


@pytest.fixture
def host(tmp_path: Path) -> Host:
    # the old and new units start and meet their context; 400k logs a pool short of it; 300k crashes
    return Host(
        tmp_path, Script(pools={"100000": 110_000, "200000": 210_000, "400000": 250_000}, crash={"300000"})
    )


def served(host: Host) -> str:
    """The unit text the running start runs (what systemd loaded when it last started it)."""
    assert host.systemd.active == "active", f"the service is {host.systemd.active}"
    return host.systemd.loaded


# -- the ordinary paths -----------------------------------------------------------------------------
def test_a_healthy_change_is_applied_and_the_old_unit_backed_up(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert served(host) == unit_text(NEW) and host.systemd.restarts == 1
    backups = sorted(p.name for p in host.etc.glob(f"{UNIT}.bak.*"))
    assert len(backups) == 1 and (host.etc / backups[0]).read_text() == unit_text(OLD)
    assert StateDir(host.root / "state").load_record(UNIT) is None


@pytest.mark.parametrize("context", [TOO_BIG, 300_000], ids=["pool short", "crash"])
def test_a_failing_change_is_rolled_back_to_the_old_unit_restarted_and_verified(host: Host, context) -> None:
    host.install(host.etc, unit_text(OLD))
    result = host.transaction(host.request(context)).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert (host.etc / UNIT).read_text() == unit_text(OLD) and served(host) == unit_text(OLD)
    assert host.systemd.restarts == 2 and host.probe.asked == ["health"]  # only the old one got that far


def test_an_unchanged_running_unit_that_meets_its_target_is_not_restarted(host: Host) -> None:
    host.install(host.etc, unit_text(NEW))
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.UP_TO_DATE, result.message
    assert host.systemd.restarts == 0


def test_an_old_unit_that_fails_too_is_rollback_failed_and_both_are_kept(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    host.script.crash.add("100000")  # from now on the old unit cannot start either
    result = host.transaction(host.request(TOO_BIG)).apply()
    assert result.outcome is Outcome.ROLLBACK_FAILED, result.message
    assert (host.etc / UNIT).read_text() == unit_text(OLD)
    assert StateDir(host.root / "state").load_record(UNIT) is not None  # the next run tries again


# -- item 5: a unit that systemd loads from outside the inventory's folder ---------------------------
@pytest.mark.parametrize("where", ["usr", "usr_local", "run"])
def test_a_rejected_change_over_a_packaged_unit_restarts_and_verifies_that_unit(host: Host, where) -> None:
    """The unit lives in /usr/lib (or /usr/local/lib): the first apply finds no file in /etc, yet a
    rollback must bring the packaged unit's service back, not stop it and call that "restored"."""
    vendor = getattr(host, where)
    host.install(vendor, unit_text(OLD))
    result = host.transaction(host.request(TOO_BIG)).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert not (host.etc / UNIT).exists()  # the host is as it was: the packaged unit loads again
    assert host.systemd.fragment == str(vendor / UNIT) and served(host) == unit_text(OLD)
    assert host.systemd.restarts == 2 and host.probe.asked == ["health"]  # restarted and verified
    assert (vendor / UNIT).read_text() == unit_text(OLD)


def test_a_change_over_a_packaged_unit_that_passes_is_applied_and_the_packaged_unit_kept(host: Host) -> None:
    host.install(host.usr, unit_text(OLD))
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert served(host) == unit_text(NEW) and (host.usr / UNIT).read_text() == unit_text(OLD)


def test_a_unit_in_a_folder_searched_before_ours_is_refused_before_anything_is_written(host: Host) -> None:
    host.install(host.control, unit_text(OLD))
    reloads = host.systemd.reloads
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.ERROR and "shadows" in result.message, result.message
    assert sorted(p.name for p in host.etc.iterdir()) == []  # no unit, no backup
    assert host.systemd.reloads == reloads and host.systemd.restarts == 0 and served(host) == unit_text(OLD)


@pytest.mark.parametrize("verb", ["apply", "rollback"])
def test_a_drop_in_that_replaces_exec_start_is_refused_before_any_backup(host: Host, verb: str) -> None:
    """systemd would run the drop-in's command whatever is written: refused with nothing left behind (no
    backup, no record, no reload), where a check after the write would leave a backup of this run."""
    host.install(host.etc, unit_text(OLD))
    (host.etc / "sglang.service.bak.20261206T000000Z").write_text(unit_text(NEW))
    drop_in = host.etc / f"{UNIT}.d" / "zz-override.conf"
    drop_in.parent.mkdir()
    drop_in.write_text("[Service]\nExecStart=\nExecStart=/usr/bin/other --port 1\n")
    host.systemd.drop_ins = (str(drop_in),)
    before = sorted(p.name for p in host.etc.iterdir())
    reloads = host.systemd.reloads
    t = host.transaction(host.request(NEW, verb=verb))
    result = t.apply() if verb == "apply" else t.rollback()
    assert result.outcome is Outcome.ERROR and str(drop_in) in result.message, result.message
    assert "nothing changed" in result.message
    assert sorted(p.name for p in host.etc.iterdir()) == before
    assert host.systemd.reloads == reloads and host.systemd.restarts == 0 and served(host) == unit_text(OLD)


def test_a_rollback_with_no_unit_before_says_it_removed_the_new_one_not_that_the_old_is_healthy(
    host: Host,
) -> None:
    result = host.transaction(host.request(TOO_BIG)).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert "healthy" not in result.message and "no unit before" in result.message, result.message
    assert not (host.etc / UNIT).exists() and host.systemd.active == "inactive"


# -- item 15: an empty unit file ----------------------------------------------------------------------
def test_an_empty_unit_file_is_applied_over_when_the_laptop_saw_no_unit(host: Host) -> None:
    host.put(host.etc, "")  # systemd: masked
    result = host.transaction(host.request(NEW, expect_sha256="absent")).apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert served(host) == unit_text(NEW)


def test_a_rejected_change_over_an_empty_unit_puts_it_back_and_leaves_the_service_stopped(host: Host) -> None:
    host.put(host.etc, "")
    result = host.transaction(host.request(TOO_BIG, expect_sha256="absent")).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert (host.etc / UNIT).read_text() == "" and host.systemd.active == "inactive"
    assert StateDir(host.root / "state").load_record(UNIT) is None


# -- item 7: a start that systemd itself began -------------------------------------------------------
def test_an_apply_during_a_start_systemd_began_waits_for_it_instead_of_restarting_it(host: Host) -> None:
    """Rebooted (or Restart=): the same unit is starting, its pool logged, not ready yet."""
    host.put(host.etc, unit_text(NEW))
    host.systemd.boot([kv_line(210_000)], later=(READY_LINE,))
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.UP_TO_DATE, result.message
    assert host.systemd.restarts == 0 and host.probe.asked == ["health"]


def test_a_start_in_progress_that_fails_is_restarted_as_before(host: Host) -> None:
    host.put(host.etc, unit_text(NEW))
    host.systemd.boot([kv_line(210_000)], later=(OOM_LINE,))
    result = host.transaction(host.request(NEW)).apply()
    assert host.systemd.restarts >= 1, result.message


def test_the_in_place_comparison_never_waits_for_a_start(host: Host) -> None:
    """The SSH session's own check hands a start in progress to the detached runner (which waits)."""
    host.put(host.etc, unit_text(NEW))
    host.systemd.boot([kv_line(210_000)], later=(READY_LINE,))
    t = host.transaction(host.request(NEW))
    assert not isinstance(t.compare(wait=False), Result)
    assert host.systemd.later[host.systemd.invocation]  # nobody followed the start


def test_an_empty_expectation_is_the_sha_of_nothing(host: Host) -> None:
    """The laptop that read an empty file sends the sha of "": accepted too."""
    host.put(host.etc, "")
    result = host.transaction(host.request(NEW, expect_sha256=sha256(""))).apply()
    assert result.outcome is Outcome.APPLIED, result.message


# -- the weight-cache daemon (agent/host/roles/weight_cache.py) ---------------------------------------------
def _client(context: int) -> str:
    text = unit_text(context).replace("--context-length", "--weight-cache-mode client --context-length")
    return text.replace("[Unit]\n", "[Unit]\nBindsTo=sglang-weight-cache.service\n")


def test_an_engine_in_client_mode_without_its_daemon_is_refused_before_any_restart(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    result = host.transaction(host.request(NEW, unit_text=_client(NEW))).apply()
    assert (
        result.outcome is Outcome.ERROR and "sglang-weight-cache.service is not installed" in result.message
    )
    assert (host.etc / UNIT).read_text() == unit_text(OLD) and host.systemd.restarts == 0


def test_an_engine_in_client_mode_onto_a_daemon_with_another_fingerprint_is_refused(host: Host) -> None:
    import os

    host.install(host.etc, unit_text(OLD))
    argv = "/opt/sglang/bin/python -m sglang.srt.weight_cache.daemon --model-path /other"
    (host.etc / "sglang-weight-cache.service").write_text(f"[Service]\nExecStart={argv}\n")
    ready = host.root / "run/wc"
    ready.mkdir(parents=True)
    (ready / "GPU-0.ready").write_text(str(os.getpid()))  # a live daemon, ready
    host.systemd.active = "active"  # the fake reports one state for every unit: the daemon's too
    env = f"Environment=SGLANG_WEIGHT_CACHE_READY_TEMPLATE={ready}/{{device_uuid}}.ready\n"
    text = _client(NEW).replace("[Service]\n", "[Service]\n" + env)
    result = host.transaction(host.request(NEW, unit_text=text)).apply()
    assert result.outcome is Outcome.ERROR, result.message
    assert (
        "holds another fingerprint (model-path differ)" in result.message
        and "nothing changed" in result.message
    )
    assert host.systemd.restarts == 0 and (host.etc / UNIT).read_text() == unit_text(OLD)


def _daemon(model: str) -> str:
    argv = f"/opt/sglang/bin/python -m sglang.srt.weight_cache.daemon --model-path {model}"
    return f"[Unit]\nDescription=cache\n\n[Service]\nExecStart={argv}\n"


def test_a_change_writes_the_daemons_unit_beside_the_engines_and_its_rollback_puts_it_back(
    host: Host,
) -> None:
    """[weight_cache]: the daemon's unit travels with the engine's: written, backed up under the engine
    backup's stamp, and put back by the rollback of a change whose start failed."""
    daemon = host.etc / "sglang-weight-cache.service"
    host.install(host.etc, _client(OLD))
    daemon.write_text(_daemon("/m"))
    failing = _client(300_000)  # crashes: rolled back
    sent = _daemon("/m").replace("Description=cache", "Description=cache, new")  # the same fingerprint
    result = host.transaction(host.request(300_000, unit_text=failing, daemon_text=sent)).apply()
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert daemon.read_text() == _daemon("/m")  # put back with the engine's unit
    backups = sorted(p.name for p in host.etc.glob("sglang-weight-cache.service.bak.*"))
    engine_backups = sorted(p.name for p in host.etc.glob(f"{UNIT}.bak.*"))
    assert [b.replace("sglang-weight-cache", "sglang") for b in backups] == engine_backups[:1]
    result = host.transaction(host.request(NEW, unit_text=_client(NEW), daemon_text=_daemon("/m"))).apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert daemon.read_text() == _daemon("/m")


def test_a_daemon_unit_that_cannot_serve_the_engine_is_refused_before_any_change(host: Host) -> None:
    host.install(host.etc, unit_text(OLD))
    result = host.transaction(
        host.request(NEW, unit_text=_client(NEW), daemon_text=_daemon("/other"))
    ).apply()
    assert result.outcome is Outcome.ERROR and "model-path" in result.message, result.message
    assert host.systemd.restarts == 0 and (host.etc / UNIT).read_text() == unit_text(OLD)
    assert not (host.etc / "sglang-weight-cache.service").exists()


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("--speculative-algorithm EAGLE", "speculative decoding"),
        ("--quantization awq", "quantization 'awq'"),
        ("checkpoint awq", "quantization 'awq'"),  # the checkpoint's config.json, read on the host
        ("PrivateTmp=yes", "PrivateTmp="),
    ],
)
def test_the_host_refuses_what_the_weight_cache_cannot_serve_before_any_change(
    host: Host, how: str, says: str
) -> None:
    """The laptop refuses it first (plan/weight_cache_unit.py refusal); the host asks the same rules of
    the units it is sent (an older laptop, a request written by hand)."""
    host.install(host.etc, unit_text(OLD))
    text, model = _client(NEW), host.root / "model"
    if how.startswith("--"):
        text = text.replace("--weight-cache-mode", f"{how} --weight-cache-mode")
    elif how.startswith("checkpoint"):
        model.mkdir()
        (model / "config.json").write_text('{"quantization_config": {"quant_method": "awq"}}')
        text = text.replace("--model-path /m", f"--model-path {model}")
    else:
        text = text.replace("[Service]\n", f"[Service]\n{how}\n")
    daemon = _daemon(str(model) if how.startswith("checkpoint") else "/m")
    result = host.transaction(host.request(NEW, unit_text=text, daemon_text=daemon)).apply()
    assert result.outcome is Outcome.ERROR and says in result.message, result.message
    assert "nothing changed" in result.message and host.systemd.restarts == 0
    assert (host.etc / UNIT).read_text() == unit_text(OLD)
    assert not (host.etc / "sglang-weight-cache.service").exists()


@pytest.mark.parametrize("hand", ["deleted", "edited"])
def test_a_daemon_unit_deleted_or_edited_by_hand_is_repaired_by_the_next_apply(host: Host, hand: str) -> None:
    """The engine's unit is up to date, its daemon's is not as deployctl wrote it: the apply writes it back
    (the edited one kept under the change's backup stamp) and says so."""
    daemon = host.etc / "sglang-weight-cache.service"
    host.install(host.etc, _client(NEW))
    daemon.write_text(_daemon("/m"))
    first = host.transaction(host.request(NEW, unit_text=_client(NEW), daemon_text=_daemon("/m"))).apply()
    assert first.outcome is Outcome.UP_TO_DATE, first.message
    edited = _daemon("/m") + "Nice=5\n"
    if hand == "deleted":
        daemon.unlink()
    else:
        daemon.write_text(edited)
    t = host.transaction(host.request(NEW, unit_text=_client(NEW), daemon_text=_daemon("/m")))
    result = t.apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert daemon.read_text() == _daemon("/m")
    said = [e.message for e in t.events if "by hand" in e.message]
    assert said and "this change writes it back" in said[0], [e.message for e in t.events]
    kept = [p.read_text() for p in host.etc.glob("sglang-weight-cache.service.bak.*")]
    assert kept == ([] if hand == "deleted" else [edited])  # nothing lost: the hand edit is a backup
    again = host.transaction(host.request(NEW, unit_text=_client(NEW), daemon_text=_daemon("/m"))).apply()
    assert again.outcome is Outcome.UP_TO_DATE, again.message


def test_a_change_refused_after_the_reload_puts_the_daemons_unit_back_too(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd loads something else than what was written (a drop-in's ExecStart=): the engine's unit and
    the daemon's go back as they were, nothing restarted."""
    daemon = host.etc / "sglang-weight-cache.service"
    host.install(host.etc, _client(OLD))
    daemon.write_text(_daemon("/m"))
    sent = _daemon("/m").replace("Description=cache", "Description=cache, new")
    t = host.transaction(host.request(NEW, unit_text=_client(NEW), daemon_text=sent))
    why = "the drop-in x.conf sets ExecStart= for sglang.service"
    monkeypatch.setattr(write, "loaded_elsewhere", lambda ports: why)
    result = t.apply()
    assert result.outcome is Outcome.ERROR and "nothing restarted" in result.message, result.message
    assert daemon.read_text() == _daemon("/m") and (host.etc / UNIT).read_text() == _client(OLD)
    assert host.systemd.restarts == 0


# -- a service someone stopped on purpose ---------------------------------------------------------------
@pytest.mark.parametrize("asked_start", [False, True], ids=["left stopped", "--start"])
def test_an_unchanged_unit_stopped_on_purpose_is_left_stopped_unless_asked(
    host: Host, asked_start: bool
) -> None:
    host.install(host.etc, unit_text(NEW))
    host.systemd.stop(UNIT, 10)  # `systemctl stop`: inactive, not failed
    result = host.transaction(host.request(NEW, start=asked_start)).apply()
    if asked_start:
        assert result.outcome is Outcome.APPLIED, result.message
        assert served(host) == unit_text(NEW)
    else:
        assert result.outcome is Outcome.UP_TO_DATE, result.message
        assert "stopped" in result.message and "--start" in result.message
        assert host.systemd.active == "inactive" and host.systemd.restarts == host.systemd.starts == 0


def test_an_unchanged_unit_that_failed_is_still_started_again(host: Host) -> None:
    host.install(host.etc, unit_text(NEW))
    host.systemd.active, host.systemd.sub = "failed", "failed"  # a crash, not a stop: the apply repairs it
    result = host.transaction(host.request(NEW)).apply()
    assert result.outcome is Outcome.APPLIED, result.message
    assert served(host) == unit_text(NEW)
